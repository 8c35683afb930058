"""The dradriver image, built without a registry, as the Dockerfile describes it and as pods run it.

The archive comes from ``devtools.image.build.ensure_image`` (cached by its
inputs: a cold build takes minutes, a warm one reads a record). Its contents
are read back from the archive itself and compared with what the Dockerfile
declares; then it is imported into node-1's containerd (the real runtime)
and a pod runs both commands from it, each container as the user the
component's manifest uses.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devtools import paths
from devtools.cluster.api import AdminAPI
from devtools.cluster.local import LocalCluster
from devtools.cluster.wait import wait_until
from devtools.image import recipe
from devtools.image.build import BuiltImage, ensure_image
from devtools.image.contents import (
    ImageContents,
    distributions,
    read,
    requirement_closure,
)
from devtools.image.dockerfile import Dockerfile, load
from devtools.image.importer import import_into_cluster
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import path_for

SITE_PACKAGES = f"{recipe.VENV}/lib/python{recipe.PYTHON_MINOR}/site-packages"
# An import of the archive and a pod's start on a busy 2-core machine.
DEADLINE = 180


@pytest.fixture(scope="module")
def image() -> BuiltImage:
    return ensure_image()


@pytest.fixture(scope="module")
def contents(image: BuiltImage) -> ImageContents:
    return read(image.path)


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return load(paths.REPO / "Dockerfile")


def test_the_archive_config_is_the_dockerfiles(
    contents: ImageContents, dockerfile: Dockerfile
) -> None:
    final = dockerfile.final
    user = final.last("USER")
    assert user is not None
    assert contents.config.get("User") == user.value
    assert tuple(contents.config.get("Env", ())) == final.env()
    assert tuple(contents.config.get("Cmd", ())) == final.exec_form("CMD")
    assert "Entrypoint" not in contents.config
    assert contents.layers == 2


def test_the_user_exists_and_python_is_debians_311(contents: ImageContents) -> None:
    passwd = contents.text("etc/passwd").splitlines()
    assert f"{recipe.USER_NAME}:x:{recipe.UID}:{recipe.UID}:" in "\n".join(passwd)
    assert "bookworm" in contents.text("usr/lib/os-release")
    assert contents.files[recipe.PYTHON.lstrip("/")] == "0"
    cfg = contents.text(f"{recipe.VENV}/pyvenv.cfg")
    assert f"version = {recipe.PYTHON_MINOR}." in cfg
    assert contents.links[f"{recipe.VENV.lstrip('/')}/bin/python"].endswith("python3") or (
        "python3" in contents.links[f"{recipe.VENV.lstrip('/')}/bin/python"]
    )


def test_both_commands_are_console_scripts_of_the_venv(contents: ImageContents) -> None:
    for command in recipe.COMMANDS:
        script = contents.text(f"{recipe.VENV}/bin/{command}")
        assert script.splitlines()[0] == f"#!{recipe.VENV}/bin/python"
        assert contents.modes[f"{recipe.VENV.lstrip('/')}/bin/{command}"] & 0o005 == 0o005


def test_the_venv_holds_exactly_the_wheels_runtime_closure(contents: ImageContents) -> None:
    installed = distributions(contents, SITE_PACKAGES)
    needed = requirement_closure(installed, recipe.DISTRIBUTION)
    assert set(installed) == needed, (
        f"missing: {sorted(needed - set(installed))}, extra: {sorted(set(installed) - needed)}"
    )
    assert not set(installed) & recipe.FORBIDDEN
    assert "grpcio" in installed and "kubernetes" in installed
    # The generated stubs are in the wheel (setup.py makes them at build time).
    assert any(
        p.startswith(f"{SITE_PACKAGES.lstrip('/')}/dradriver/kubeletapi/gen/")
        for p in contents.files
    )
    # Nothing of the dev tree: no devtools, no tests.
    site = SITE_PACKAGES.lstrip("/") + "/"
    tops = {p[len(site) :].split("/")[0] for p in contents.files if p.startswith(site)}
    assert not tops & {"devtools", "tests", "bench", "pip", "setuptools", "_pytest", "grpc_tools"}


@pytest.fixture(scope="module")
def imported(image: BuiltImage, local_cluster: LocalCluster) -> Iterator[str]:
    if local_cluster.layout.node(1).runtime != "real":
        pytest.skip("node-1 runs the fake runtime (DRADRIVER_RUNTIME=fake)")
    assert "node-1" in import_into_cluster(image.path, local_cluster)
    yield image.name


def _container(name: str, command: str, uid: int, image: str) -> Obj:
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "Never",
        "command": [command, "--help"],
        "securityContext": {
            "runAsUser": uid,
            "runAsNonRoot": uid != 0,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
        },
    }


def test_a_pod_runs_both_commands_from_the_imported_image(
    imported: str, api: AdminAPI, namespace: str
) -> None:
    # The manifests' names: "dradriver:<version>", which the kubelet resolves to the
    # docker.io/library name the archive carries.
    short = imported.removeprefix(recipe.CANONICAL_PREFIX)
    pod: Obj = {
        "metadata": {"name": "image"},
        "spec": {
            "nodeName": "node-1",
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            # The controller as its Deployment runs it (non-root); the plugin as root.
            "initContainers": [_container("plugin", "dradriver-kubeletplugin", 0, short)],
            "containers": [_container("controller", "dradriver-controller", recipe.UID, short)],
        },
    }
    api.create(path_for("v1", "pods", namespace), pod)

    def finished() -> Obj | None:
        obj = api.get(path_for("v1", "pods", namespace, "image"))
        phase = obj.get("status", {}).get("phase")
        return obj if phase in ("Succeeded", "Failed") else None

    done = wait_until("the image pod to finish", finished, DEADLINE, interval=0.5)
    logs = {c: api.pod_log(namespace, "image", c) for c in ("plugin", "controller")}
    assert done["status"]["phase"] == "Succeeded", (done["status"], logs)
    assert "usage: dradriver-kubeletplugin" in logs["plugin"]
    assert "usage: dradriver-controller" in logs["controller"]
