"""Host devices (``sources[].host`` profiles) used for real in containers on node-1.

node-1 runs containerd + runc, so a device reaches a container only if the kubelet,
containerd's CDI support and runc put it there, and runc's device cgroup lets the
container open it. Every container runs ``probe use KIND:PATH`` (runtimebin/cmd/probe),
which really uses the device (creates a VM on /dev/kvm, a tun interface in its own
network namespace, attaches a file of its own to a loop device and reads it back) and
prints what each step gave; the tests read that through the pod log API.

The same pods without the claim, with the host node bind-mounted in by ``hostPath``, must
get EPERM on open: the device cgroup is what the claim changes. (tun is the exception runc
makes: every container may open /dev/net/tun; there the claim puts the node in the
container, which has none without it.)

Host safety: the loop profile is a glob of at most two loop devices that were free when
the module started; the containers attach files of their own and detach them; tun
interfaces live in the pods' network namespaces only. (Hot-plug: test_host_hotplug.py.)
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from devtools.cluster.api import AdminAPI
from devtools.cluster.images import PROBE_IMAGE
from devtools.cluster.local import LocalCluster
from devtools.cluster.probe import Use, read_uses
from devtools.cluster.wait import wait_until
from devtools.harness.nodeplugin import NodePlugin, node_slices, start_node_plugin
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from kubeletplugin.hostdevices import CAPACITY, SLOTS
from tests.cluster.conftest import Recorder

DRIVER = "hostdev.dradriver.dev"
NODE = "node-1"
R = RESOURCE_V1
# Survives one kubelet retry (the Node authorizer's lag on a fresh claim: 10 s + jitter).
DEADLINE = 120
KINDS = ("kvm", "fuse", "tun", "loop")
SHARE = {"kvm": 2, "fuse": 4, "tun": 4}
NODES = {"kvm": "/dev/kvm", "fuse": "/dev/fuse", "tun": "/dev/net/tun"}
# What each kind's container needs besides the device (CDI cannot add capabilities).
CAPABILITIES = {"tun": ["NET_ADMIN"], "loop": ["SYS_ADMIN"]}
MAX_LOOPS = 2


def free_loop_devices() -> list[str]:
    """Loop devices with no backing file now (free), at most :data:`MAX_LOOPS`, highest first.

    Only single-digit ones, so that one glob character class names exactly them.
    """
    free = []
    for n in range(9, -1, -1):
        sys_dir = Path(f"/sys/block/loop{n}")
        node = Path(f"/dev/loop{n}")
        if (
            node.is_block_device()
            and sys_dir.is_dir()
            and not (sys_dir / "loop/backing_file").exists()
        ):
            free.append(str(node))
        if len(free) == MAX_LOOPS:
            break
    return free


def loop_glob(loops: list[str]) -> str:
    return "/dev/loop[" + "".join(sorted(p.removeprefix("/dev/loop") for p in loops)) + "]"


def _config(work: Path, loops: list[str]) -> Obj:
    def attrs(kind: str) -> Obj:
        return {"attributes": {"kind": kind}}

    sources: list[Obj] = [
        {
            "host": {
                "name": kind,
                "nodes": [{"path": NODES[kind]}],
                "share": SHARE[kind],
                **attrs(kind),
            }
        }
        for kind in ("kvm", "fuse", "tun")
    ]
    if loops:
        sources.append(
            {"host": {"name": "loop", "nodes": [{"path": loop_glob(loops)}], **attrs("loop")}}
        )
    return {"driverName": DRIVER, "sources": sources}


@pytest.fixture(scope="module", autouse=True)
def real_runtime(local_cluster: LocalCluster) -> None:
    if local_cluster.layout.node(1).runtime != "real":
        pytest.skip("node-1 runs the fake runtime (DRADRIVER_RUNTIME=fake)")


@pytest.fixture(scope="module")
def loops() -> list[str]:
    """The loop devices the module may use: free when it started."""
    return free_loop_devices()


@pytest.fixture(scope="module")
def table() -> Iterator[dict[str, dict[str, str]]]:
    """What each kind gave, printed at the end of the module (``-s`` shows it)."""
    rows: dict[str, dict[str, str]] = {}
    yield rows
    print("\nhost devices in real containers (node-1: containerd + runc):")
    print(f"  {'kind':6} {'published as':34} {'with the claim':48} without the claim")
    for kind, row in rows.items():
        print(
            f"  {kind:6} {row.get('form', '-'):34} {row.get('with', '-'):48} "
            f"{row.get('without', '-')}"
        )


@pytest.fixture(scope="module")
def plugin(local_cluster: LocalCluster, loops: list[str]) -> Iterator[NodePlugin]:
    work = Path(tempfile.mkdtemp(prefix="dradriver-test-hostdev-", dir="/tmp"))
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(_config(work, loops)))
    with local_cluster.api() as api:
        for kind in KINDS:
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
            for kind in KINDS:
                api.delete(path_for(R, "deviceclasses", name=f"{DRIVER}-{kind}"))
            shutil.rmtree(work, ignore_errors=True)


def slice_devices(api: AdminAPI) -> list[Obj]:
    return [d for s in node_slices(api, NODE, DRIVER) for d in s["spec"].get("devices", [])]


def kind_of(device: Obj) -> str:
    value: str = device.get("attributes", {}).get("kind", {}).get("string", "")
    return value


def devices_of(api: AdminAPI, kind: str) -> list[Obj]:
    return [d for d in slice_devices(api) if kind_of(d) == kind]


def expected_counts(form: str, loops: list[str]) -> dict[str, int]:
    shared = {k: 1 if form == CAPACITY else n for k, n in SHARE.items()}
    return {**shared, "loop": len(loops)}


def started_form(plugin: NodePlugin) -> str:
    """The form the plugin's start-up line says it publishes shared host devices as."""
    found = re.findall(r"shared_host_devices_as\W+([a-z ]+?)[\"'\n,}]", plugin.log_path.read_text())
    assert found, f"no shared_host_devices_as in {plugin.log_path}"
    return str(found[-1])


@pytest.fixture
def published(plugin: NodePlugin, api: AdminAPI, loops: list[str]) -> str:
    """The plugin registered, every static profile's devices published; returns the form."""
    plugin.wait_ready()
    form = wait_until(
        "the start-up line", lambda: started_form(plugin), 60, ignore=(AssertionError,)
    )
    assert form in (CAPACITY, SLOTS)
    want = expected_counts(form, loops)

    def complete() -> bool:
        devices = slice_devices(api)
        return all(sum(kind_of(d) == k for d in devices) == n for k, n in want.items())

    wait_until(f"the node's slices with {want}", complete, 60)
    return form


# ----- pods ---------------------------------------------------------------------


def make_template(api: AdminAPI, ns: str, kind: str) -> None:
    spec = {
        "devices": {
            "requests": [{"name": "dev", "exactly": {"deviceClassName": f"{DRIVER}-{kind}"}}]
        }
    }
    api.create(
        path_for(R, "resourceclaimtemplates", ns),
        {"metadata": {"name": kind}, "spec": {"spec": spec}},
    )


def make_pod(
    api: AdminAPI,
    ns: str,
    name: str,
    kind: str,
    args: list[str],
    *,
    claim: bool = True,
    host_path: tuple[str, str] | None = None,
    shell: bool = False,
) -> None:
    """A pod whose container runs ``probe use`` (or ``sh -c``) with the kind's capabilities.

    ``claim``: the device through a claim from the kind's template, else the pod is pinned
    to node-1; ``host_path``: (node, hostPath type) bind-mounted at the same path.
    """
    container: Obj = {
        "name": "c",
        "image": PROBE_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", *args] if shell else ["/bin/probe", "use", *args],
    }
    caps = CAPABILITIES.get(kind)
    if caps:
        container["securityContext"] = {"capabilities": {"add": caps}}
    spec: Obj = {
        "terminationGracePeriodSeconds": 1,
        "restartPolicy": "Never",
        "containers": [container],
    }
    if claim:
        container["resources"] = {"claims": [{"name": "dev"}]}
        spec["resourceClaims"] = [{"name": "dev", "resourceClaimTemplateName": kind}]
    else:
        spec["nodeSelector"] = {"kubernetes.io/hostname": NODE}  # the real runtime's node
    if host_path is not None:
        node, path_type = host_path
        spec["volumes"] = [{"name": "node", "hostPath": {"path": node, "type": path_type}}]
        container["volumeMounts"] = [{"name": "node", "mountPath": node}]
    api.create(path_for("v1", "pods", ns), {"metadata": {"name": name}, "spec": spec})


def pod_events(api: AdminAPI, ns: str, name: str) -> list[str]:
    return [
        f"{e['reason']}: {e.get('message', '')}"
        for e in api.items(
            path_for("v1", "events", ns), fieldSelector=f"involvedObject.name={name}"
        )
    ]


def uses(api: AdminAPI, ns: str, pod: str) -> list[Use]:
    try:
        return read_uses(api, ns, pod, "c", DEADLINE)
    except TimeoutError as e:
        raise AssertionError(f"{e}; events: {pod_events(api, ns, pod)}") from e


def one_use(api: AdminAPI, ns: str, pod: str) -> Use:
    found = uses(api, ns, pod)
    assert len(found) == 1, [u.text() for u in found]
    return found[0]


def allocated(api: AdminAPI, ns: str, pod: str) -> list[str]:
    """The devices the pod's claim was given."""
    obj = api.get(path_for("v1", "pods", ns, pod))
    [status] = obj["status"]["resourceClaimStatuses"]
    claim = api.get(path_for(R, "resourceclaims", ns, status["resourceClaimName"]))
    return [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]


def summary(use: Use) -> str:
    return " ".join(f"{k}={v}" for k, v in use.steps.items())


# ----- tests --------------------------------------------------------------------


@pytest.mark.compat("host-shared")
def test_kvm_shared_by_count_two_pods_create_vms_and_a_third_waits_for_a_slot(
    published: str,
    api: AdminAPI,
    namespace: str,
    matrix_notes: Recorder,
    table: dict[str, dict[str, str]],
) -> None:
    form = published
    print(f"\nshared host devices are published as {form} on this cluster")
    kvm = devices_of(api, "kvm")
    if form == CAPACITY:
        [device] = kvm
        assert device["name"] == "kvm" and device.get("allowMultipleAllocations") is True
        assert device["capacity"]["slots"]["value"] == "2", device
    else:
        assert sorted(d["name"] for d in kvm) == ["kvm-0", "kvm-1"]
        for d in kvm:
            assert d["attributes"]["hostDevice"] == {"string": "kvm"}
            assert "allowMultipleAllocations" not in d
    matrix_notes.note("host-shared", form)
    table.setdefault("kvm", {})["form"] = f"{form} (share 2)"

    make_template(api, namespace, "kvm")
    for pod in ("a", "b"):
        make_pod(api, namespace, pod, "kvm", ["kvm:/dev/kvm"])
    for pod in ("a", "b"):
        use = one_use(api, namespace, pod)
        assert (use.get("open"), use.get("api"), use.get("vm")) == ("ok", "12", "created"), (
            use.text()
        )
    held = {pod: allocated(api, namespace, pod) for pod in ("a", "b")}
    if form == SLOTS:
        assert sorted(d for ds in held.values() for d in ds) == ["kvm-0", "kvm-1"]
    table["kvm"]["with"] = summary(use)

    make_pod(api, namespace, "c", "kvm", ["kvm:/dev/kvm"])

    def unschedulable() -> str | None:
        for event in pod_events(api, namespace, "c"):
            if event.startswith("FailedScheduling: ") and "cannot allocate" in event:
                return event
        return None

    event = wait_until("the third pod's FailedScheduling event", unschedulable, DEADLINE)
    print(f"third pod: {event}")
    pod_c = api.get(path_for("v1", "pods", namespace, "c"))
    assert pod_c["status"]["phase"] == "Pending" and not pod_c["spec"].get("nodeName")

    api.delete(path_for("v1", "pods", namespace, "a"))
    use = one_use(api, namespace, "c")
    assert (use.get("open"), use.get("api"), use.get("vm")) == ("ok", "12", "created"), use.text()
    if form == SLOTS:
        assert allocated(api, namespace, "c") == held["a"]


def host_interfaces() -> set[str]:
    return set(os.listdir("/sys/class/net"))


def test_tun_a_container_with_net_admin_makes_an_interface_in_its_own_netns(
    published: str, api: AdminAPI, namespace: str, table: dict[str, dict[str, str]]
) -> None:
    before = host_interfaces()
    make_template(api, namespace, "tun")
    make_pod(api, namespace, "t", "tun", ["tun:/dev/net/tun"])
    use = one_use(api, namespace, "t")
    assert (use.get("open"), use.get("ifname"), use.get("sysfs")) == ("ok", "dratun0", "present"), (
        use.text()
    )
    # The container holds its tun fd (the interface lives) while the host is looked at.
    assert api.get(path_for("v1", "pods", namespace, "t"))["status"]["phase"] == "Running"
    after = host_interfaces()
    assert after == before and "dratun0" not in after, sorted(after ^ before)
    table.setdefault("tun", {}).update({"form": f"{published} (share 4)", "with": summary(use)})


def test_fuse_opened_read_write_with_the_claim(
    published: str, api: AdminAPI, namespace: str, table: dict[str, dict[str, str]]
) -> None:
    make_template(api, namespace, "fuse")
    make_pod(api, namespace, "f", "fuse", ["fuse:/dev/fuse"])
    use = one_use(api, namespace, "f")
    assert use.get("open") == "ok", use.text()
    table.setdefault("fuse", {}).update({"form": f"{published} (share 4)", "with": summary(use)})


# Each pod's container uses whichever loop device its claim put in its /dev.
LOOP_SCRIPT = 'for d in /dev/loop[0-9]*; do set -- "$@" "loop:$d"; done; exec /bin/probe use "$@"'


def test_loop_two_pods_get_different_devices_and_attach_files_of_their_own(
    published: str,
    api: AdminAPI,
    namespace: str,
    loops: list[str],
    table: dict[str, dict[str, str]],
) -> None:
    if len(loops) < 2:
        pytest.skip(f"fewer than 2 free loop devices on this machine: {loops}")
    names = sorted(d["name"] for d in devices_of(api, "loop"))
    make_template(api, namespace, "loop")
    for pod in ("x", "y"):
        make_pod(api, namespace, pod, "loop", [LOOP_SCRIPT], shell=True)
    seen = {pod: one_use(api, namespace, pod) for pod in ("x", "y")}
    for use in seen.values():
        steps = (use.get("open"), use.get("attached"), use.get("readback"), use.get("detached"))
        assert steps == ("ok", "ok", "ok", "ok"), use.text()
        assert use.path in loops
    assert seen["x"].path != seen["y"].path
    given = {pod: allocated(api, namespace, pod) for pod in ("x", "y")}
    assert sorted(d for ds in given.values() for d in ds) == names
    for device in devices_of(api, "loop"):
        assert device["attributes"]["identity"]["string"].startswith("path:/dev/loop")
    # Detached again: the host's loop devices are as free as they were.
    assert free_loop_devices() == loops
    table["loop"] = {
        "form": f"exclusive, {len(names)} by path identity",
        "with": summary(seen["x"]),
    }


def test_without_the_claim_the_host_node_mounted_in_gives_eperm(
    published: str,
    api: AdminAPI,
    namespace: str,
    loops: list[str],
    table: dict[str, dict[str, str]],
) -> None:
    """The same containers, the host node bind-mounted by hostPath, no claim: the device
    cgroup refuses the open, so what the claims gave them was the claim's doing.

    Except tun: runc allows 10:200 (/dev/net/tun) in every container's device cgroup by
    default, so a bind-mounted /dev/net/tun opens without a claim; there the claim is what
    puts the node in the container (without it and without hostPath it is not there).
    """
    nodes = {kind: (path, "CharDevice") for kind, path in NODES.items()}
    if loops:
        nodes["loop"] = (loops[0], "BlockDevice")
    for kind, host_path in nodes.items():
        make_pod(
            api, namespace, kind, kind, [f"{kind}:{host_path[0]}"], claim=False, host_path=host_path
        )
    make_pod(api, namespace, "tun-bare", "tun", [f"tun:{NODES['tun']}"], claim=False)
    results = {kind: one_use(api, namespace, kind) for kind in nodes}
    bare = one_use(api, namespace, "tun-bare")
    for kind, use in results.items():
        table.setdefault(kind, {})["without"] = f"hostPath: {summary(use)}"
    table["tun"]["without"] += f"; no hostPath: {summary(bare)}"
    opened = {kind: use.get("open") for kind, use in results.items()}
    expected = {kind: "ok" if kind == "tun" else "EPERM" for kind in nodes}
    assert opened == expected, {k: u.text() for k, u in results.items()}
    assert bare.get("open") == "ENOENT", bare.text()


def test_nothing_of_the_module_is_left_on_the_host(loops: list[str]) -> None:
    """Ran last: the loop devices are free and no dratun interface is on the host."""
    assert free_loop_devices()[: len(loops)] == loops
    assert not [i for i in host_interfaces() if i.startswith("dratun")]
