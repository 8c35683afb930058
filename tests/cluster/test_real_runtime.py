"""dradriver's devices in real containers: containerd + runc on node-1.

Every check reads what the container itself printed (the probe image's
``probe report``: env, every path under /dev with its type and major:minor,
its mounts) through the pod log API with the admin client, so it holds only if
the kubelet, containerd's CDI support and runc really put the device there.

The devices are the static source's mock devices: character devices with
/dev/null's numbers (1:3) that the plugin makes in its mockDir.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.cluster.api import AdminAPI
from devtools.cluster.cri import CRIClient
from devtools.cluster.images import PROBE_IMAGE
from devtools.cluster.kubeletstate import kubelet_cdi_ids
from devtools.cluster.local import LocalCluster
from devtools.cluster.probe import Report, read_report
from devtools.cluster.wait import wait_until
from devtools.harness.nodeplugin import (
    NodePlugin,
    node_slices,
    start_node_plugin,
)
from dradriver.host.cdi import CDIRegistry
from dradriver.host.containeredits import DeviceNode
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from kubeletplugin.legacy.shim import CDI_CLASS

# A driver of its own: no slice or class another module left behind matches.
DRIVER = "runtime.dradriver.dev"
RESOURCE = f"{DRIVER}/mock"
NODE = "node-1"
R = RESOURCE_V1
# Survives one kubelet retry (prepare, or a container restart's 10 s back-off).
DEADLINE = 120
# The DRA devices of the config below (dp-0 is the device plugin's only).
DRA_DEVICES = 4
SHARE_MOUNT = "/opt/dradriver-share"
MISSING_MOUNT = "/opt/dradriver-missing"


def _config(work: Path) -> Obj:
    return {
        "driverName": DRIVER,
        "sources": [
            {
                "static": {
                    "mockDir": str(work / "mock"),
                    "devices": [
                        {"namePrefix": "dev", "count": 2, "attributes": {"kind": "plain"}},
                        {
                            "name": "shared-0",
                            "attributes": {"kind": "shared"},
                            "allowMultipleAllocations": True,
                            "capacity": {
                                "memory": {
                                    "value": "16Gi",
                                    "requestPolicy": {
                                        "default": "4Gi",
                                        "validRange": {"min": "1Gi"},
                                    },
                                }
                            },
                        },
                        {
                            # A spec the runtime rejects: runc cannot bind-mount a
                            # host path that does not exist. Prepare has no reason
                            # to refuse it (the device node is fine).
                            "name": "bad-0",
                            "attributes": {"kind": "bad"},
                            "edits": {
                                "mounts": [
                                    {
                                        "hostPath": str(work / "missing"),
                                        "containerPath": MISSING_MOUNT,
                                        "options": ["bind", "ro"],
                                    }
                                ]
                            },
                        },
                        {
                            "name": "dp-0",
                            "attributes": {"kind": "legacy"},
                            "edits": {
                                "env": {"LEGACY_MODE": "shim"},
                                "mounts": [
                                    {
                                        "hostPath": str(work / "share"),
                                        "containerPath": SHARE_MOUNT,
                                        "options": ["rbind", "ro"],
                                    }
                                ],
                            },
                        },
                    ],
                }
            }
        ],
        "devicePlugin": {
            "enabled": True,
            "mode": "partitioned",
            "resources": [{"resourceName": RESOURCE, "devices": {"names": ["dp-0"]}}],
            "podResourcesIntervalSeconds": 1,
        },
    }


@pytest.fixture(scope="module", autouse=True)
def real_runtime(local_cluster: LocalCluster) -> None:
    if local_cluster.layout.node(1).runtime != "real":
        pytest.skip("node-1 runs the fake runtime (DRADRIVER_RUNTIME=fake)")


@pytest.fixture(scope="module")
def plugin(local_cluster: LocalCluster) -> Iterator[NodePlugin]:
    work = Path(tempfile.mkdtemp(prefix="dradriver-test-runtime-", dir="/tmp"))
    (work / "share").mkdir()
    (work / "share" / "hello").write_text("from the host\n")
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(_config(work)))
    with local_cluster.api() as api:
        for kind in ("plain", "shared", "bad"):
            name = f"{DRIVER}-{kind}"
            api.delete(path_for(R, "deviceclasses", name=name))
            expression = (
                f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].kind == "{kind}"'
            )
            api.create(
                path_for(R, "deviceclasses"),
                {
                    "metadata": {"name": name},
                    "spec": {"selectors": [{"cel": {"expression": expression}}]},
                },
            )
        node_plugin = start_node_plugin(local_cluster, api, config, work, driver=DRIVER)
        try:
            yield node_plugin
        finally:
            node_plugin.stop()
            for s in node_slices(api, NODE, DRIVER):
                api.delete(path_for(R, "resourceslices", name=s["metadata"]["name"]))
            for kind in ("plain", "shared", "bad"):
                api.delete(path_for(R, "deviceclasses", name=f"{DRIVER}-{kind}"))
            shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def published(plugin: NodePlugin, api: AdminAPI) -> NodePlugin:
    """Registered, with every DRA device in the node's slices (dp-0 is the shim's only)."""
    if plugin.process is None:
        plugin.start()
    plugin.wait_ready()
    wait_until(
        "the node's slices",
        lambda: (
            sum(len(s["spec"].get("devices", [])) for s in node_slices(api, NODE, DRIVER))
            == DRA_DEVICES
        ),
        60,
    )
    return plugin


# ----- helpers ------------------------------------------------------------------


def request(
    cls: str,
    *,
    index: int | None = None,
    capacity: str | None = None,
    admin: bool = False,
) -> Obj:
    exactly: Obj = {"deviceClassName": f"{DRIVER}-{cls}", "count": 1}
    if index is not None:
        expression = f'device.attributes["{DRIVER}"].index == {index}'
        exactly["selectors"] = [{"cel": {"expression": expression}}]
    if capacity:
        exactly["capacity"] = {"requests": {"memory": capacity}}  # as the slice spells it
    if admin:
        exactly["adminAccess"] = True
    return {"name": "dev", "exactly": exactly}


def claim_spec(req: Obj, env: dict[str, str] | None = None) -> Obj:
    devices: Obj = {"requests": [req]}
    if env:
        devices["config"] = [
            {
                "opaque": {
                    "driver": DRIVER,
                    "parameters": {
                        "apiVersion": f"{DRIVER}/v1alpha1",
                        "kind": "DeviceConfig",
                        "env": env,
                    },
                }
            }
        ]
    return {"devices": devices}


def make_claim(api: AdminAPI, ns: str, name: str, spec: Obj) -> None:
    api.create(path_for(R, "resourceclaims", ns), {"metadata": {"name": name}, "spec": spec})


def make_template(api: AdminAPI, ns: str, name: str, spec: Obj) -> None:
    api.create(
        path_for(R, "resourceclaimtemplates", ns),
        {"metadata": {"name": name}, "spec": {"spec": spec}},
    )


def probe_container(name: str, *, claim: bool = True, **extra: Any) -> Obj:
    container: Obj = {"name": name, "image": PROBE_IMAGE, "imagePullPolicy": "Never", **extra}
    if claim:
        container["resources"] = {"claims": [{"name": "dev"}]}
    return container


def make_pod(
    api: AdminAPI,
    ns: str,
    name: str,
    containers: list[Obj],
    *,
    claim: str | None = None,
    template: str | None = None,
    **spec: Any,
) -> None:
    body: Obj = {"terminationGracePeriodSeconds": 1, "containers": containers, **spec}
    if claim or template:
        ref: Obj = {"name": "dev"}
        if claim:
            ref["resourceClaimName"] = claim
        else:
            ref["resourceClaimTemplateName"] = template
        body["resourceClaims"] = [ref]
    api.create(path_for("v1", "pods", ns), {"metadata": {"name": name}, "spec": body})


def pod_events(api: AdminAPI, ns: str, name: str) -> list[str]:
    return [
        f"{e['reason']}: {e.get('message', '')}"
        for e in api.items(
            path_for("v1", "events", ns), fieldSelector=f"involvedObject.name={name}"
        )
    ]


def report(api: AdminAPI, ns: str, pod: str, container: str) -> Report:
    try:
        return read_report(api, ns, pod, container, DEADLINE)
    except TimeoutError as e:
        raise AssertionError(f"{e}; events: {pod_events(api, ns, pod)}") from e


def pod_claim(api: AdminAPI, ns: str, pod: str) -> Obj:
    obj = api.get(path_for("v1", "pods", ns, pod))
    for status in obj.get("status", {}).get("resourceClaimStatuses", []):
        return api.get(path_for(R, "resourceclaims", ns, status["resourceClaimName"]))
    return api.get(
        path_for(R, "resourceclaims", ns, obj["spec"]["resourceClaims"][0]["resourceClaimName"])
    )


def result(claim: Obj) -> Obj:
    [only] = claim["status"]["allocation"]["devices"]["results"]
    out: Obj = only
    return out


@dataclass(frozen=True)
class SpecNode:
    """A device node as the CDI spec names it, with the host node's type and numbers."""

    path: str
    type: str
    rdev: str


def spec_node(node: DeviceNode) -> SpecNode:
    assert node.host_path is not None
    st = os.stat(node.host_path)
    kind = "char" if stat.S_ISCHR(st.st_mode) else "block" if stat.S_ISBLK(st.st_mode) else "?"
    return SpecNode(node.path, kind, f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}")


def claim_nodes(plugin: NodePlugin, local_cluster: LocalCluster, claim: Obj) -> list[SpecNode]:
    """The device nodes of the CDI devices the kubelet recorded for ``claim``."""
    ids = kubelet_cdi_ids(local_cluster.layout.kubelet_root, claim["metadata"]["uid"], DRIVER)
    assert ids, "the kubelet recorded no CDI devices for the claim"
    edits = CDIRegistry(plugin.cdi_dir, DRIVER).resolve_many(ids)
    return [spec_node(n) for n in edits.device_nodes]


def assert_sees(seen: Report, node: SpecNode) -> None:
    entry = seen.paths.get(node.path)
    assert entry is not None, f"{node.path} is not in the container: {sorted(seen.paths)}"
    assert (entry.type, entry.rdev) == (node.type, node.rdev)


def claim_env(ns: str, claim: Obj) -> str:
    return f"{ns}/{claim['metadata']['name']}"


# ----- tests --------------------------------------------------------------------


def test_both_containers_see_the_device_env_and_config_and_a_new_pod_gets_it_again(
    published: NodePlugin, api: AdminAPI, namespace: str, local_cluster: LocalCluster
) -> None:
    make_template(api, namespace, "one", claim_spec(request("plain", index=0), {"MODE": "turbo"}))
    make_pod(api, namespace, "p", [probe_container("c0"), probe_container("c1")], template="one")
    seen = [report(api, namespace, "p", c) for c in ("c0", "c1")]
    claim = pod_claim(api, namespace, "p")
    assert result(claim)["device"] == "dev-0"
    [node] = claim_nodes(published, local_cluster, claim)
    assert node == SpecNode("/dev/dradriver/dev-0", "char", "1:3")
    for container in seen:
        assert_sees(container, node)
        assert container.env["DRADRIVER_CLAIM"] == claim_env(namespace, claim)
        assert container.env["DRADRIVER_DEVICE_DEV_0"] == node.path
        assert container.env["MODE"] == "turbo"
        # Nothing of the other device reaches this pod.
        assert "/dev/dradriver/dev-1" not in container.paths

    cdi = CDIRegistry(published.cdi_dir, DRIVER)
    uid = claim["metadata"]["uid"]
    assert cdi.read_claim(uid) is not None
    api.delete(path_for("v1", "pods", namespace, "p"))
    wait_until("the claim's CDI spec removed", lambda: cdi.read_claim(uid) is None, DEADLINE)

    make_pod(api, namespace, "q", [probe_container("c0")], template="one")
    again = report(api, namespace, "q", "c0")
    claim_q = pod_claim(api, namespace, "q")
    assert claim_q["metadata"]["uid"] != uid and result(claim_q)["device"] == "dev-0"
    assert_sees(again, node)
    assert again.env["DRADRIVER_CLAIM"] == claim_env(namespace, claim_q)


METADATA_DIR = "/var/run/kubernetes.io/dra-device-attributes"


def json_stream(text: str) -> list[Obj]:
    """The JSON objects of a KEP-5304 metadata file, in order."""
    decoder, out, at = json.JSONDecoder(), [], 0
    while text[at:].strip():
        while text[at].isspace():
            at += 1
        obj, at = decoder.raw_decode(text, at)
        out.append(obj)
    return out


def test_the_container_reads_the_device_metadata_file_of_its_claims(
    published: NodePlugin, api: AdminAPI, namespace: str
) -> None:
    """KEP-5304: the file the 1.37 helper would mount, at the path a workload can compute
    from its own pod spec (template claims by the pod's name for them, direct claims by
    their name), read by the container itself."""
    make_template(api, namespace, "meta", claim_spec(request("plain", index=1)))
    make_claim(api, namespace, "meta-direct", claim_spec(request("shared", capacity="1Gi")))
    from_template = f"{METADATA_DIR}/resourceclaimtemplates/dev/dev/{DRIVER}-metadata.json"
    direct = f"{METADATA_DIR}/resourceclaims/meta-direct/dev/{DRIVER}-metadata.json"
    # The container stays up once it has printed: the resourceclaim controller re-creates
    # a deleted template claim even for a finished pod and names the new one in the pod's
    # status, so only a running pod's status names the claim it was given.
    script = f"cat {from_template}; echo '---'; cat {direct}; echo '==='; exec sleep 3600"
    body: Obj = {
        "terminationGracePeriodSeconds": 1,
        "restartPolicy": "Never",
        "resourceClaims": [
            {"name": "dev", "resourceClaimTemplateName": "meta"},
            {"name": "direct", "resourceClaimName": "meta-direct"},
        ],
        "containers": [
            {
                "name": "c0",
                "image": PROBE_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                "resources": {"claims": [{"name": "dev"}, {"name": "direct"}]},
            }
        ],
    }
    api.create(path_for("v1", "pods", namespace), {"metadata": {"name": "meta"}, "spec": body})

    def printed_all() -> str | None:
        pod = api.get(path_for("v1", "pods", namespace, "meta"))
        phase = pod.get("status", {}).get("phase")
        if phase in ("Failed", "Succeeded"):
            raise AssertionError(
                f"container exited: {api.pod_log(namespace, 'meta', 'c0')}; events: "
                f"{pod_events(api, namespace, 'meta')}"
            )
        if phase != "Running":
            return None
        log = api.pod_log(namespace, "meta", "c0")
        return log if "===\n" in log else None

    try:
        printed = wait_until("the metadata printed", printed_all, DEADLINE)
    except TimeoutError as e:
        raise AssertionError(f"{e}; events: {pod_events(api, namespace, 'meta')}") from e
    first, second = printed.split("===\n")[0].split("---\n")
    pod = api.get(path_for("v1", "pods", namespace, "meta"))
    generated = {s["name"]: s["resourceClaimName"] for s in pod["status"]["resourceClaimStatuses"]}
    given = api.get(path_for(R, "resourceclaims", namespace, generated["dev"]))
    template_objects = json_stream(first)
    assert [o["apiVersion"] for o in template_objects] == [
        "metadata.resource.k8s.io/v1beta1",
        "metadata.resource.k8s.io/v1alpha1",
    ]
    newest = template_objects[0]
    assert newest["kind"] == "DeviceMetadata" and newest["podClaimName"] == "dev"
    assert newest["metadata"]["name"] == generated["dev"]
    assert newest["metadata"]["uid"] == given["metadata"]["uid"]
    assert newest["metadata"]["namespace"] == namespace
    [request_entry] = newest["requests"]
    assert request_entry["name"] == "dev"
    [device] = request_entry["devices"]
    assert (device["driver"], device["pool"], device["name"]) == (DRIVER, NODE, "dev-1")
    # The attributes as the slice publishes them: the driver's own without its domain.
    assert device["attributes"]["kind"] == {"string": "plain"}
    assert device["attributes"]["index"] == {"int": 1}
    [direct_newest, _] = json_stream(second)
    assert "podClaimName" not in direct_newest
    assert direct_newest["metadata"]["name"] == "meta-direct"
    assert direct_newest["requests"][0]["devices"][0]["name"] == "shared-0"


def test_a_shared_claim_gives_both_pods_the_same_device(
    published: NodePlugin, api: AdminAPI, namespace: str, local_cluster: LocalCluster
) -> None:
    make_claim(api, namespace, "both", claim_spec(request("plain", index=1)))
    for pod in ("a", "b"):
        make_pod(api, namespace, pod, [probe_container("c")], claim="both")
    seen = {pod: report(api, namespace, pod, "c") for pod in ("a", "b")}
    claim = api.get(path_for(R, "resourceclaims", namespace, "both"))
    assert len(claim["status"]["reservedFor"]) == 2
    [node] = claim_nodes(published, local_cluster, claim)
    assert node.path == "/dev/dradriver/dev-1"
    for container in seen.values():
        assert_sees(container, node)
        assert container.env["DRADRIVER_CLAIM"] == f"{namespace}/both"


def test_consumable_capacity_device_with_two_share_ids(
    published: NodePlugin, api: AdminAPI, namespace: str, local_cluster: LocalCluster
) -> None:
    for share, size in (("a", "4Gi"), ("b", "2Gi")):
        make_claim(
            api,
            namespace,
            f"cap-{share}",
            claim_spec(request("shared", capacity=size), {"SHARE": share}),
        )
        make_pod(api, namespace, f"p-{share}", [probe_container("c")], claim=f"cap-{share}")
    seen = {share: report(api, namespace, f"p-{share}", "c") for share in ("a", "b")}
    claims = {s: api.get(path_for(R, "resourceclaims", namespace, f"cap-{s}")) for s in "ab"}
    results = {s: result(c) for s, c in claims.items()}
    assert {r["device"] for r in results.values()} == {"shared-0"}
    assert results["a"]["shareID"] != results["b"]["shareID"]
    assert results["a"]["consumedCapacity"]["memory"] == "4Gi"
    assert results["b"]["consumedCapacity"]["memory"] == "2Gi"
    for share, container in seen.items():
        [node] = claim_nodes(published, local_cluster, claims[share])
        assert node.path == "/dev/dradriver/shared-0"
        assert_sees(container, node)
        assert container.env["SHARE"] == share
        assert container.env["DRADRIVER_CLAIM"] == f"{namespace}/cap-{share}"


def test_admin_access_sees_the_device_another_pod_holds(
    published: NodePlugin, api: AdminAPI, namespace: str, local_cluster: LocalCluster
) -> None:
    api.merge_patch(
        path_for("v1", "namespaces", name=namespace),
        {"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}},
    )
    make_claim(api, namespace, "holder", claim_spec(request("plain", index=0), {"ROLE": "user"}))
    make_pod(api, namespace, "user", [probe_container("c")], claim="holder")
    user = report(api, namespace, "user", "c")
    make_claim(
        api,
        namespace,
        "admin",
        claim_spec(request("plain", index=0, admin=True), {"ROLE": "admin"}),
    )
    make_pod(api, namespace, "monitor", [probe_container("c")], claim="admin")
    admin = report(api, namespace, "monitor", "c")

    holder = api.get(path_for(R, "resourceclaims", namespace, "holder"))
    admin_claim = api.get(path_for(R, "resourceclaims", namespace, "admin"))
    assert result(holder)["device"] == result(admin_claim)["device"] == "dev-0"
    assert result(admin_claim)["adminAccess"] is True
    for container, claim, role in ((user, holder, "user"), (admin, admin_claim, "admin")):
        [node] = claim_nodes(published, local_cluster, claim)
        assert node.path == "/dev/dradriver/dev-0"
        assert_sees(container, node)
        assert container.env["ROLE"] == role
        assert container.env["DRADRIVER_CLAIM"] == claim_env(namespace, claim)


def test_device_plugin_pod_sees_the_node_env_and_mounts_allocate_returned(
    published: NodePlugin, api: AdminAPI, namespace: str
) -> None:
    wait_until(
        f"{RESOURCE} in node-1's allocatable",
        lambda: (
            api.get(path_for("v1", "nodes", name=NODE))["status"]["allocatable"].get(RESOURCE)
            == "1"
        ),
        DEADLINE,
    )
    make_pod(
        api,
        namespace,
        "legacy",
        [
            probe_container(
                "c",
                claim=False,
                args=["report", "/dev", SHARE_MOUNT],
                resources={"limits": {RESOURCE: "1"}},
            )
        ],
    )
    seen = report(api, namespace, "legacy", "c")
    # What Allocate answered is in the CDI spec of kind <driver>/deviceplugin.
    specs = CDIRegistry(published.cdi_dir, DRIVER, CDI_CLASS)
    allocation = seen.env["DRADRIVER_ALLOCATION"]
    edits = specs.resolve_many([specs.cdi_id(allocation, "dp-0")])
    [node] = [spec_node(n) for n in edits.device_nodes]
    assert node == SpecNode("/dev/dradriver/dp-0", "char", "1:3")
    assert_sees(seen, node)
    assert seen.env["DRADRIVER_RESOURCE"] == RESOURCE
    assert seen.env["DRADRIVER_DEVICE_DP_0"] == node.path
    assert seen.env["LEGACY_MODE"] == "shim"
    mount = seen.mount_at(SHARE_MOUNT)
    assert mount is not None and mount.options.split(",")[0] == "ro"
    hello = seen.paths.get(f"{SHARE_MOUNT}/hello")
    assert hello is not None and hello.type == "file"


def test_a_spec_the_runtime_rejects_is_a_clear_pod_event(
    published: NodePlugin, api: AdminAPI, namespace: str
) -> None:
    make_template(api, namespace, "bad", claim_spec(request("bad")))
    make_pod(api, namespace, "p", [probe_container("c")], template="bad")
    missing = str(published.workdir / "missing")

    def runtime_refusal() -> str | None:
        for event in pod_events(api, namespace, "p"):
            if event.startswith("Failed: ") and missing in event:
                return event
        return None

    event = wait_until("the runtime's refusal as a pod event", runtime_refusal, DEADLINE)
    # runc's own words, naming the host path it could not mount.
    assert "OCI runtime create failed" in event and "no such file or directory" in event
    # Prepare succeeded: the kubelet has the claim's CDI device; the runtime refused it.
    claim = pod_claim(api, namespace, "p")
    assert CDIRegistry(published.cdi_dir, DRIVER).read_claim(claim["metadata"]["uid"])
    # The container never ran. (Not the pod phase: once the failed start is recorded as
    # the container's termination, the kubelet reports a restartPolicy Always pod Running,
    # "restarting", though nothing ever started.)
    pod = api.get(path_for("v1", "pods", namespace, "p"))
    [status] = pod["status"]["containerStatuses"]
    assert "running" not in status["state"] and not status.get("started")
    for state in (status["state"], status.get("lastState") or {}):
        if "terminated" in state:
            assert state["terminated"]["reason"] == "StartError", state


def release(fifo: Path) -> bool:
    """Let the container's ``cat`` of ``fifo`` return: open it for writing, then close.

    Non-blocking, so that it fails (ENXIO) rather than hangs while no reader has it open.
    """
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ENXIO:
            return False
        raise
    os.close(fd)
    return True


def test_after_the_cdi_dir_is_wiped_and_the_plugin_restarted_a_new_container_gets_its_device(
    published: NodePlugin,
    api: AdminAPI,
    namespace: str,
    local_cluster: LocalCluster,
    sock_dir: Path,
) -> None:
    fifo = sock_dir / "exit"
    os.mkfifo(fifo)
    # Reports, then waits for the test to release it and exits 0; restartPolicy
    # Always makes the kubelet create a new container of the same pod.
    script = "probe report & cat /ctl/exit; kill $!; wait"
    make_template(api, namespace, "one", claim_spec(request("plain", index=1)))
    make_pod(
        api,
        namespace,
        "p",
        [
            probe_container(
                "c",
                command=["sh", "-c", script],
                volumeMounts=[{"name": "ctl", "mountPath": "/ctl"}],
            )
        ],
        template="one",
        restartPolicy="Always",
        volumes=[{"name": "ctl", "hostPath": {"path": str(sock_dir), "type": "Directory"}}],
    )
    first = report(api, namespace, "p", "c")
    claim = pod_claim(api, namespace, "p")
    [node] = claim_nodes(published, local_cluster, claim)
    assert_sees(first, node)

    cdi = CDIRegistry(published.cdi_dir, DRIVER)
    shutil.rmtree(published.cdi_dir)  # what a reboot does to /var/run/cdi
    published.stop()
    published.start()
    published.wait_ready()
    assert cdi.read_claim(claim["metadata"]["uid"]) is not None  # rewritten at start

    wait_until("the container to take its exit", lambda: release(fifo), DEADLINE)

    def restarted() -> bool:
        pod = api.get(path_for("v1", "pods", namespace, "p"))
        statuses = pod.get("status", {}).get("containerStatuses", [])
        return (
            bool(statuses)
            and statuses[0]["restartCount"] >= 1
            and "running" in statuses[0]["state"]
        )

    try:
        wait_until("a new container of the pod running", restarted, DEADLINE)
    except TimeoutError as e:
        raise AssertionError(f"{e}; events: {pod_events(api, namespace, 'p')}") from e
    second = report(api, namespace, "p", "c")
    assert_sees(second, node)
    assert second.env["DRADRIVER_CLAIM"] == claim_env(namespace, claim)


def test_the_cri_client_sees_the_pod_sandboxes_teardown_will_remove(
    api: AdminAPI, namespace: str, local_cluster: LocalCluster
) -> None:
    """What ``down`` removes through the CRI before containerd stops: every sandbox."""
    # No claim pins it: node-2 (fake runtime) would do for the scheduler.
    make_pod(
        api,
        namespace,
        "p",
        [probe_container("c", claim=False)],
        nodeSelector={"kubernetes.io/hostname": NODE},
    )
    report(api, namespace, "p", "c")
    uid = api.get(path_for("v1", "pods", namespace, "p"))["metadata"]["uid"]
    ctrd = local_cluster.layout.node(1).containerd
    assert ctrd is not None
    with CRIClient(ctrd.address) as client:
        conditions = {c.type: c.status for c in client.status()}
        sandboxes = client.list_pod_sandboxes()
    assert conditions["RuntimeReady"] and conditions["NetworkReady"]
    [sandbox] = [s for s in sandboxes if s.uid == uid]
    assert (sandbox.namespace, sandbox.name, sandbox.ready) == (namespace, "p", True)
    assert len(sandbox.id) == 64
