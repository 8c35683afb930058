"""dradriver's kubelet plugin on the real cluster: the kubelet, scheduler and apiserver are real."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from dradriver.kubeletapi.gen import dra_v1_pb2, dra_v1_pb2_grpc

from devtools.cluster.api import AdminAPI
from devtools.cluster.gates import apiserver_gates, kubelet_gates, why_off
from devtools.cluster.kubeletstate import kubelet_cdi_ids as read_kubelet_cdi_ids
from devtools.cluster.local import LocalCluster
from devtools.cluster.wait import wait_until
from devtools.harness.controller import install_crds, namespaced_controller
from devtools.harness.nodeplugin import NodePlugin, free_port, node_slices, start_node_plugin
from dradriver.api import parameters as params
from dradriver.api.wellknown import ALLOCATION_ANNOTATION
from dradriver.devices.model import Device
from dradriver.devices.static import create_mock_device
from dradriver.host.cdi import CDIDevice, CDIRegistry
from dradriver.host.containeredits import ContainerEdits
from dradriver.host.ledger import ClaimDevice, Ledger
from dradriver.k8s.client import KubeClient, load_connection
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.resourceslice.builder import build_slices
from dradriver.resourceslice.pool import node_pool
from dradriver.resourceslice.publisher import SlicePublisher, slice_informer
from tests.cluster.conftest import Recorder

DRIVER = "dradriver.dev"
NODE = "node-1"
R = RESOURCE_V1
# Survives one kubelet prepare retry after a failure or Node-authorizer lag.
DEADLINE = 90
PLAIN_DEVICES = 6
ALL_DEVICES = PLAIN_DEVICES + 4


def _config(work: Path) -> Obj:
    return {
        "driverName": DRIVER,
        "counterSets": [{"name": "card-0", "counters": {"memory": "32Gi"}}],
        "sources": [
            {
                "static": {
                    "mockDir": str(work / "mock"),
                    "devices": [
                        {
                            "namePrefix": "dev",
                            "count": PLAIN_DEVICES,
                            "attributes": {"kind": "plain"},
                        },
                        {
                            "name": "part-a",
                            "attributes": {"kind": "partition"},
                            "consumesCounters": [
                                {"counterSet": "card-0", "counters": {"memory": "16Gi"}}
                            ],
                        },
                        {
                            "name": "part-b",
                            "attributes": {"kind": "partition"},
                            "consumesCounters": [
                                {"counterSet": "card-0", "counters": {"memory": "16Gi"}}
                            ],
                        },
                        {
                            "name": "part-whole",
                            "attributes": {"kind": "partition"},
                            "consumesCounters": [
                                {"counterSet": "card-0", "counters": {"memory": "32Gi"}}
                            ],
                        },
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
                    ],
                }
            }
        ],
        "hooks": {
            "setup": {"command": ["sh", str(work / "setup.sh")], "timeoutSeconds": 120},
            "teardown": {"command": ["sh", str(work / "teardown.sh")], "timeoutSeconds": 30},
        },
    }


@pytest.fixture(scope="module")
def plugin(local_cluster: LocalCluster) -> Iterator[NodePlugin]:
    work = Path("/tmp/dradriver-test-plugin")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(mode=0o700)
    (work / "setup.sh").write_text(
        f'echo "setup $DRADRIVER_CLAIM_UID $DRADRIVER_DEVICE profile=$DRADRIVER_PROFILE" '
        f">> {work}/hooks.log\n"
        'if [ "$DRADRIVER_PROFILE" = fail ]; then echo "refusing profile fail" >&2; exit 3; fi\n'
        f"if [ -e {work}/block-setup ]; then touch {work}/setup-started; sleep 120; fi\n"
    )
    (work / "teardown.sh").write_text(
        f'echo "teardown $DRADRIVER_CLAIM_UID $DRADRIVER_DEVICE" >> {work}/hooks.log\n'
    )
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(_config(work)))
    with local_cluster.api() as api:
        for kind in ("plain", "partition", "shared"):
            name = f"{DRIVER}-{kind}"
            api.delete(path_for(R, "deviceclasses", name=name))
            api.create(
                path_for(R, "deviceclasses"),
                {
                    "metadata": {"name": name},
                    "spec": {
                        "selectors": [
                            {
                                "cel": {
                                    "expression": f'device.driver == "{DRIVER}" && '
                                    f'device.attributes["{DRIVER}"].kind == "{kind}"'
                                }
                            }
                        ]
                    },
                },
            )
        node_plugin = start_node_plugin(local_cluster, api, config, work)
    try:
        yield node_plugin
    finally:
        node_plugin.stop()


@pytest.fixture
def published(plugin: NodePlugin, api: AdminAPI) -> NodePlugin:
    """The plugin is running and registered, and the node's slices are all there."""
    if plugin.process is None:
        plugin.start()
    plugin.wait_ready()

    def all_there() -> bool:
        slices = node_slices(api, NODE, DRIVER)
        # A counters-only slice whose counters a gate dropped comes back as devices: null.
        return sum(len(s["spec"].get("devices") or []) for s in slices) == ALL_DEVICES

    wait_until("the node's slices", all_there, 60)
    return plugin


# ----- helpers ----------------------------------------------------------------


def claim_spec(
    cls: str,
    count: int = 1,
    config: list[Obj] | None = None,
    capacity: str | None = None,
    selector: str | None = None,
) -> Obj:
    exactly: Obj = {"deviceClassName": f"{DRIVER}-{cls}", "count": count}
    if capacity:
        exactly["capacity"] = {"requests": {"memory": capacity}}  # as the slice spells it
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    devices: Obj = {"requests": [{"name": "dev", "exactly": exactly}]}
    if config:
        devices["config"] = config
    return {"devices": devices}


def make_claim(api: AdminAPI, ns: str, name: str, spec: Obj) -> None:
    api.create(path_for(R, "resourceclaims", ns), {"metadata": {"name": name}, "spec": spec})


def make_template(api: AdminAPI, ns: str, name: str, spec: Obj) -> None:
    api.create(
        path_for(R, "resourceclaimtemplates", ns),
        {"metadata": {"name": name}, "spec": {"spec": spec}},
    )


def make_pod(
    api: AdminAPI,
    ns: str,
    name: str,
    *,
    claim: str | None = None,
    template: str | None = None,
    containers: int = 1,
) -> None:
    ref: Obj = {"name": "dev"}
    if claim:
        ref["resourceClaimName"] = claim
    else:
        ref["resourceClaimTemplateName"] = template
    api.create(
        path_for("v1", "pods", ns),
        {
            "metadata": {"name": name},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "resourceClaims": [ref],
                "containers": [
                    {
                        "name": f"c{i}",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"claims": [{"name": "dev"}]},
                    }
                    for i in range(containers)
                ],
            },
        },
    )


def wait_running(api: AdminAPI, ns: str, name: str) -> Obj:
    def running() -> Obj | None:
        pod = api.get(path_for("v1", "pods", ns, name))
        return pod if pod.get("status", {}).get("phase") == "Running" else None

    try:
        return wait_until(f"pod {ns}/{name} Running", running, DEADLINE)
    except TimeoutError as e:
        raise AssertionError(f"{e}; events: {pod_events(api, ns, name)}") from e


def wait_pod_gone(api: AdminAPI, ns: str, name: str) -> None:
    api.delete(path_for("v1", "pods", ns, name))
    wait_until(
        f"pod {ns}/{name} gone",
        lambda: api.get_or_none(path_for("v1", "pods", ns, name)) is None,
        DEADLINE,
    )


def pod_events(api: AdminAPI, ns: str, name: str) -> list[str]:
    return [
        f"{e['reason']}: {e.get('message', '')}"
        for e in api.items(
            path_for("v1", "events", ns), fieldSelector=f"involvedObject.name={name}"
        )
    ]


def pod_claim(api: AdminAPI, ns: str, pod: str) -> Obj:
    obj = api.get(path_for("v1", "pods", ns, pod))
    for status in obj.get("status", {}).get("resourceClaimStatuses", []):
        return api.get(path_for(R, "resourceclaims", ns, status["resourceClaimName"]))
    claim_name = obj["spec"]["resourceClaims"][0]["resourceClaimName"]
    return api.get(path_for(R, "resourceclaims", ns, claim_name))


def kubelet_cdi_ids(local_cluster: LocalCluster, claim_uid: str) -> list[str]:
    return read_kubelet_cdi_ids(local_cluster.layout.kubelet_root, claim_uid, DRIVER)


def hook_lines(plugin: NodePlugin, kind: str, claim_uid: str) -> list[str]:
    log = plugin.workdir / "hooks.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [line for line in lines if line.startswith(f"{kind} {claim_uid} ")]


def ledger(plugin: NodePlugin) -> Ledger:
    return Ledger.load(plugin.state_dir / "ledger.json")


def cdi(plugin: NodePlugin) -> CDIRegistry:
    return CDIRegistry(plugin.cdi_dir, DRIVER)


def kubelet_calls(plugin: NodePlugin) -> dict[tuple[str, str], float]:
    """(service, method) -> calls, from the plugin's ``dradriver_kubelet_calls_total``."""
    calls: dict[tuple[str, str], float] = {}
    for line in plugin.metrics().splitlines():
        if line.startswith("dradriver_kubelet_calls_total{"):
            labels, value = line.split("{", 1)[1].rsplit("}", 1)
            parsed = dict(part.split("=", 1) for part in labels.split(",") if "=" in part)
            calls[(parsed["service"].strip('"'), parsed["method"].strip('"'))] = float(value)
    return calls


# ----- tests --------------------------------------------------------------------


@pytest.mark.compat("prepare")
def test_pod_gets_a_device_whose_cdi_ids_resolve(
    published: NodePlugin, api: AdminAPI, namespace: str, local_cluster: LocalCluster
) -> None:
    make_template(api, namespace, "one", claim_spec("plain"))
    make_pod(api, namespace, "p", template="one")
    wait_running(api, namespace, "p")
    claim = pod_claim(api, namespace, "p")
    result = claim["status"]["allocation"]["devices"]["results"][0]
    ids = kubelet_cdi_ids(local_cluster, claim["metadata"]["uid"])
    assert len(ids) == 1 and ids[0].startswith(f"{DRIVER}/device=")
    edits = cdi(published).resolve_many(ids)
    assert edits.device_nodes[0].host_path == str(published.workdir / "mock" / result["device"])
    assert edits.device_nodes[0].path == f"/dev/dradriver/{result['device']}"
    assert edits.env["DRADRIVER_CLAIM"] == f"{namespace}/{claim['metadata']['name']}"
    assert len(hook_lines(published, "setup", claim["metadata"]["uid"])) == 1


def test_prepared_claim_gets_its_device_status_published_and_the_policy_admits_it(
    published: NodePlugin, api: AdminAPI, namespace: str, local_cluster: LocalCluster
) -> None:
    """status.devices written by the plugin itself, with the DaemonSet's identity: its RBAC
    and claim-status-policy.yaml (installed by the harness) both admit the write."""
    make_template(api, namespace, "status", claim_spec("plain"))
    make_pod(api, namespace, "s", template="status")
    wait_running(api, namespace, "s")
    claim = pod_claim(api, namespace, "s")
    [result] = claim["status"]["allocation"]["devices"]["results"]
    path = path_for(R, "resourceclaims", namespace, claim["metadata"]["name"])

    def published_entry() -> Obj | None:
        for entry in api.get(path).get("status", {}).get("devices") or []:
            if (entry["driver"], entry["pool"], entry["device"]) == (
                DRIVER,
                NODE,
                result["device"],
            ) and entry.get("conditions"):
                return dict(entry)
        return None

    entry = wait_until("the claim's device status", published_entry, DEADLINE)
    [ready] = entry["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "Prepared")
    assert entry["data"]["node"] == NODE
    # What the kubelet got for the claim (the metadata mount included).
    uid = claim["metadata"]["uid"]
    assert entry["data"]["cdiDeviceIDs"] == read_kubelet_cdi_ids(
        local_cluster.layout.kubelet_root, uid, DRIVER, with_metadata=True
    )


@pytest.mark.compat("dra-service")
def test_the_kubelet_prepares_through_one_dra_service_version(
    published: NodePlugin, api: AdminAPI, namespace: str, matrix_notes: Recorder
) -> None:
    """Which of the advertised DRA services (v1, v1beta1) this release's kubelet calls."""
    make_template(api, namespace, "one", claim_spec("plain"))
    make_pod(api, namespace, "p", template="one")
    wait_running(api, namespace, "p")
    wait_pod_gone(api, namespace, "p")
    calls = kubelet_calls(published)
    used = {service for (service, method) in calls if method == "NodePrepareResources"}
    assert len(used) == 1, calls
    assert (used.pop(), "NodeUnprepareResources") in calls, calls
    service = next(s for (s, m) in calls if m == "NodePrepareResources")
    matrix_notes.note("dra-service", service.removesuffix(".DRAPlugin"))


@pytest.mark.compat("slices")
def test_the_plugin_says_once_what_this_cluster_lacks(published: NodePlugin, api: AdminAPI) -> None:
    """One start-up line for the gated slice features the apiserver drops; none if it keeps all.

    The plugin is serving (published) either way: the rest keeps working.
    """
    gates = apiserver_gates(api)
    lacking = [
        name
        for name, gate in (
            ("device taints", "DRADeviceTaints"),
            ("partitionable devices", "DRAPartitionableDevices"),
            ("consumable capacity", "DRAConsumableCapacity"),
        )
        if why_off(gates, gate)
    ]
    lines = [
        line
        for line in published.log_path.read_text().splitlines()
        if "not available on this cluster" in line
    ]
    assert len(lines) == (1 if lacking else 0), lines
    assert all(name in lines[0] for name in lacking), lines


@pytest.mark.compat("dra-health")
def test_the_kubelet_watches_device_health(
    published: NodePlugin, local_cluster: LocalCluster, matrix_notes: Recorder
) -> None:
    """The kubelet opens the health stream right after registration, if it has the gate on."""

    def streams() -> set[str]:
        return {s for (s, m) in kubelet_calls(published) if m == "NodeWatchResources"}

    try:
        opened = wait_until("the kubelet's health stream", lambda: streams() or None, 30)
    except TimeoutError:
        gate = why_off(kubelet_gates(local_cluster, NODE), "ResourceHealthStatus")
        pytest.skip(f"the kubelet opened no health stream: {gate or 'no gate reported off'}")
    assert len(opened) == 1, opened
    matrix_notes.note("dra-health", opened.pop().removesuffix(".DRAResourceHealth"))


def test_shared_claim_is_prepared_once_and_unprepared_after_the_last_pod(
    published: NodePlugin, api: AdminAPI, namespace: str
) -> None:
    make_claim(api, namespace, "shared", claim_spec("plain"))
    for i in range(3):
        make_pod(api, namespace, f"p{i}", claim="shared")
    for i in range(3):
        wait_running(api, namespace, f"p{i}")
    uid = api.get(path_for(R, "resourceclaims", namespace, "shared"))["metadata"]["uid"]
    assert len(hook_lines(published, "setup", uid)) == 1
    for i in range(2):
        wait_pod_gone(api, namespace, f"p{i}")
    entry = ledger(published).get_claim(uid)
    assert entry is not None and entry.state == "prepared"
    assert cdi(published).read_claim(uid) is not None
    wait_pod_gone(api, namespace, "p2")
    wait_until("claim unprepared", lambda: ledger(published).get_claim(uid) is None, DEADLINE)
    assert cdi(published).read_claim(uid) is None
    assert len(hook_lines(published, "teardown", uid)) == 1


def test_controller_allocated_claim_shared_by_many_pods_is_set_up_once(
    published: NodePlugin, api: AdminAPI, namespace: str, local_cluster: LocalCluster
) -> None:
    """The controller's allocation path: one immediate claim, many consumers."""
    pods = 12
    with namespaced_controller(api, local_cluster, namespace, "kp"):
        api.create(
            path_for(R, "resourceclaims", namespace),
            {
                "metadata": {"name": "shared", "annotations": {ALLOCATION_ANNOTATION: "Immediate"}},
                "spec": claim_spec("plain"),
            },
        )

        def allocated() -> Obj | None:
            claim = api.get(path_for(R, "resourceclaims", namespace, "shared"))
            return claim if (claim.get("status") or {}).get("allocation") else None

        claim = wait_until("immediate claim allocated", allocated, DEADLINE)
        uid = claim["metadata"]["uid"]
        for i in range(pods):
            make_pod(api, namespace, f"p{i}", claim="shared")
        for i in range(pods):
            wait_running(api, namespace, f"p{i}")
        claim = api.get(path_for(R, "resourceclaims", namespace, "shared"))
        assert len(claim["status"]["reservedFor"]) == pods
        assert len(hook_lines(published, "setup", uid)) == 1
        for i in range(pods - 1):
            wait_pod_gone(api, namespace, f"p{i}")
        entry = ledger(published).get_claim(uid)
        assert entry is not None and entry.state == "prepared"
        assert hook_lines(published, "teardown", uid) == []
        wait_pod_gone(api, namespace, f"p{pods - 1}")
        wait_until("claim unprepared", lambda: ledger(published).get_claim(uid) is None, DEADLINE)
        assert len(hook_lines(published, "teardown", uid)) == 1
        # Still allocated (the controller owns it) until the claim itself is deleted.
        assert allocated() is not None
        api.delete(path_for(R, "resourceclaims", namespace, "shared"))
        wait_until(
            "claim deallocated and gone",
            lambda: api.get_or_none(path_for(R, "resourceclaims", namespace, "shared")) is None,
            DEADLINE,
        )


def test_scheduler_allocated_claim_gets_referenced_parameters_pinned(
    published: NodePlugin, api: AdminAPI, namespace: str, local_cluster: LocalCluster
) -> None:
    """WaitForFirstConsumer: the scheduler allocates, the controller pins the referenced
    parameters into status.devices, the node prepares with them; a later change of the
    parameters object does not reach the claim."""
    install_crds(api)
    params_api = f"{DRIVER}/{params.VERSION}"
    api.create(
        path_for(params_api, params.PLURAL, namespace),
        {
            "apiVersion": params_api,
            "kind": params.KIND,
            "metadata": {"name": "fast"},
            "spec": {"profile": "fast", "env": {"MODE": "turbo"}},
        },
    )
    reference = {
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": params_api,
                "kind": params.REFERENCE_KIND,
                "name": "fast",
            },
        }
    }
    with namespaced_controller(api, local_cluster, namespace, "kp"):
        make_template(api, namespace, "ref", claim_spec("plain", config=[reference]))
        make_pod(api, namespace, "p", template="ref")
        wait_running(api, namespace, "p")
        claim = pod_claim(api, namespace, "p")
        uid = claim["metadata"]["uid"]
        [entry] = [e for e in claim["status"]["devices"] if e["driver"] == DRIVER]
        pin = entry["data"]["parameters"]["fast"]
        assert pin["config"]["env"] == {"MODE": "turbo"}
        [line] = hook_lines(published, "setup", uid)
        assert line.endswith("profile=fast")
        edits = cdi(published).resolve_many(kubelet_cdi_ids(local_cluster, uid))
        assert edits.env["MODE"] == "turbo"

        api.merge_patch(
            path_for(params_api, params.PLURAL, namespace, "fast"),
            {"spec": {"env": {"MODE": "slow"}}},
        )

        def revalidated() -> bool:
            obj = api.get(path_for(params_api, params.PLURAL, namespace, "fast"))
            conditions = (obj.get("status") or {}).get("conditions") or []
            return any(c.get("observedGeneration") == 2 for c in conditions)

        wait_until("the controller saw the change", revalidated, DEADLINE)
        claim = pod_claim(api, namespace, "p")
        [entry] = [e for e in claim["status"]["devices"] if e["driver"] == DRIVER]
        assert entry["data"]["parameters"]["fast"] == pin  # pinned once

        # Clean up while the controller runs: it releases the parameters' in-use finalizer.
        wait_pod_gone(api, namespace, "p")
        api.delete(path_for(params_api, params.PLURAL, namespace, "fast"))
        wait_until(
            "parameters released and deleted",
            lambda: api.get_or_none(path_for(params_api, params.PLURAL, namespace, "fast")) is None,
            DEADLINE,
        )


def test_two_containers_of_one_pod_share_a_claim(
    published: NodePlugin, api: AdminAPI, namespace: str, local_cluster: LocalCluster
) -> None:
    make_template(api, namespace, "one", claim_spec("plain"))
    make_pod(api, namespace, "p", template="one", containers=2)
    pod = wait_running(api, namespace, "p")
    assert len(pod["status"]["containerStatuses"]) == 2
    uid = pod_claim(api, namespace, "p")["metadata"]["uid"]
    assert len(kubelet_cdi_ids(local_cluster, uid)) == 1
    assert len(hook_lines(published, "setup", uid)) == 1


def _opaque(**params: Any) -> list[Obj]:
    return [
        {
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": f"{DRIVER}/v1alpha1",
                    "kind": "DeviceConfig",
                    **params,
                },
            }
        }
    ]


def test_opaque_config_reaches_the_hook_and_the_container(
    published: NodePlugin, api: AdminAPI, namespace: str, local_cluster: LocalCluster
) -> None:
    spec = claim_spec("plain", config=_opaque(profile="fast", env={"MODE": "turbo"}))
    make_template(api, namespace, "cfg", spec)
    make_pod(api, namespace, "p", template="cfg")
    wait_running(api, namespace, "p")
    uid = pod_claim(api, namespace, "p")["metadata"]["uid"]
    [line] = hook_lines(published, "setup", uid)
    assert line.endswith("profile=fast")
    edits = cdi(published).resolve_many(kubelet_cdi_ids(local_cluster, uid))
    assert edits.env["MODE"] == "turbo"


def test_bad_opaque_config_keeps_the_pod_pending_with_an_event_naming_the_field(
    published: NodePlugin, api: AdminAPI, namespace: str
) -> None:
    make_template(api, namespace, "bad", claim_spec("plain", config=_opaque(env={"1BAD": "x"})))
    make_pod(api, namespace, "p", template="bad")

    def failed_event() -> str | None:
        for event in pod_events(api, namespace, "p"):
            if event.startswith("FailedPrepareDynamicResources") and "field env" in event:
                return event
        return None

    event = wait_until("FailedPrepareDynamicResources naming the field", failed_event, DEADLINE)
    assert "invalid opaque config" in event
    assert api.get(path_for("v1", "pods", namespace, "p"))["status"]["phase"] == "Pending"
    uid = pod_claim(api, namespace, "p")["metadata"]["uid"]
    assert ledger(published).get_claim(uid) is None


def test_kill_during_setup_then_restart_leaks_nothing(
    published: NodePlugin, api: AdminAPI, namespace: str
) -> None:
    block, started = published.workdir / "block-setup", published.workdir / "setup-started"
    started.unlink(missing_ok=True)
    block.touch()
    try:
        make_template(api, namespace, "one", claim_spec("plain"))
        make_pod(api, namespace, "p", template="one")
        wait_until("the setup hook to start", started.exists, DEADLINE)
        published.kill()
    finally:
        block.unlink(missing_ok=True)
    uid = pod_claim(api, namespace, "p")["metadata"]["uid"]
    crashed = ledger(published).get_claim(uid)
    assert crashed is not None and crashed.state == "preparing", "the crash left no started entry"
    published.start()
    published.wait_ready()
    wait_running(api, namespace, "p")
    claim = pod_claim(api, namespace, "p")
    device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
    book = ledger(published)
    entry = book.get_claim(uid)
    assert entry is not None and entry.state == "prepared"
    holders = book.holders(NODE, device)
    assert len(holders) == 1 and uid in holders[0].describe()
    assert cdi(published).claim_uids_on_disk() == {c.uid for c in book.claims()}
    # The interrupted attempt was rolled back (teardown) before the retry set it up again.
    assert len(hook_lines(published, "setup", uid)) == 2
    assert len(hook_lines(published, "teardown", uid)) == 1


def test_kubelet_restart_reregisters_and_republishes(
    published: NodePlugin, api: AdminAPI, local_cluster: LocalCluster
) -> None:
    def registrations() -> float:
        for line in published.metrics().splitlines():
            if line.startswith("dradriver_kubelet_registrations_total "):
                return float(line.split()[1])
        return 0.0

    before = registrations()
    slice_uids = {s["metadata"]["uid"] for s in node_slices(api, NODE, DRIVER)}
    local_cluster.restart_component("kubelet")
    wait_until("re-registration", lambda: registrations() > before, DEADLINE)

    def republished() -> bool:
        slices = node_slices(api, NODE, DRIVER)
        count = sum(len(s["spec"].get("devices", [])) for s in slices)
        # The kubelet deletes the node's slices at start; new ones have new UIDs.
        return count == ALL_DEVICES and not ({s["metadata"]["uid"] for s in slices} & slice_uids)

    wait_until("slices republished after the kubelet's wipe", republished, DEADLINE)
    assert published.process is not None and published.process.alive()


def test_wiped_cdi_dir_is_regenerated_at_start(
    published: NodePlugin, api: AdminAPI, namespace: str, local_cluster: LocalCluster
) -> None:
    make_template(api, namespace, "one", claim_spec("plain"))
    make_pod(api, namespace, "p", template="one")
    wait_running(api, namespace, "p")
    uid = pod_claim(api, namespace, "p")["metadata"]["uid"]
    before = cdi(published).read_claim(uid)
    published.stop()
    shutil.rmtree(published.cdi_dir)  # what a reboot does to /var/run/cdi
    published.start()
    published.wait_ready()
    assert cdi(published).read_claim(uid) == before
    assert cdi(published).resolve_many(kubelet_cdi_ids(local_cluster, uid)).device_nodes


def test_partitionable_devices_share_counters(
    published: NodePlugin, api: AdminAPI, namespace: str
) -> None:
    make_template(api, namespace, "two", claim_spec("partition", count=2))
    make_pod(api, namespace, "p", template="two")
    wait_running(api, namespace, "p")
    results = pod_claim(api, namespace, "p")["status"]["allocation"]["devices"]["results"]
    # part-whole needs the card's whole 32Gi, so two devices can only be the halves.
    assert sorted(r["device"] for r in results) == ["part-a", "part-b"]
    make_template(api, namespace, "one", claim_spec("partition"))
    make_pod(api, namespace, "q", template="one")

    def unschedulable() -> bool:
        pod = api.get(path_for("v1", "pods", namespace, "q"))
        return any(
            c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in pod.get("status", {}).get("conditions", [])
        )

    wait_until("the scheduler to find no counters left", unschedulable, DEADLINE)


def test_consumable_capacity_shares_one_device(
    published: NodePlugin, api: AdminAPI, namespace: str, local_cluster: LocalCluster
) -> None:
    make_template(api, namespace, "slice", claim_spec("shared", capacity="8Gi"))
    for name in ("a", "b"):
        make_pod(api, namespace, name, template="slice")
    results = []
    for name in ("a", "b"):
        wait_running(api, namespace, name)
        claim = pod_claim(api, namespace, name)
        [result] = claim["status"]["allocation"]["devices"]["results"]
        results.append((result, kubelet_cdi_ids(local_cluster, claim["metadata"]["uid"])))
    assert {r["device"] for r, _ in results} == {"shared-0"}
    assert results[0][0]["shareID"] != results[1][0]["shareID"]
    assert results[0][1] != results[1][1]
    assert all(r["consumedCapacity"]["memory"] == "8Gi" for r, _ in results)


def test_unhealthy_device_is_tainted_and_not_allocated(
    published: NodePlugin, api: AdminAPI, namespace: str
) -> None:
    mock = published.workdir / "mock" / "dev-5"

    def taints_of(device: str) -> list[Obj]:
        for s in node_slices(api, NODE, DRIVER):
            for d in s["spec"].get("devices", []):
                if d["name"] == device:
                    return list(d.get("taints", []))
        return []

    mock.unlink()
    try:
        wait_until(
            "dev-5 tainted",
            lambda: any(t["key"] == f"{DRIVER}/unhealthy" for t in taints_of("dev-5")),
            DEADLINE,
        )
        only_dev5 = claim_spec("plain", selector='device.attributes["dradriver.dev"].index == 5')
        make_template(api, namespace, "dev5", only_dev5)
        make_pod(api, namespace, "p", template="dev5")

        def unschedulable() -> bool:
            pod = api.get(path_for("v1", "pods", namespace, "p"))
            return any(
                c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                for c in pod.get("status", {}).get("conditions", [])
            )

        wait_until("the scheduler to refuse the tainted device", unschedulable, DEADLINE)
    finally:
        create_mock_device(str(mock))  # a device node again: the claim's prepare checks it
    wait_until("dev-5 untainted", lambda: not taints_of("dev-5"), DEADLINE)
    wait_running(api, namespace, "p")


def test_plugin_identity_cannot_write_another_nodes_slices(
    published: NodePlugin, local_cluster: LocalCluster
) -> None:
    kubeconfig = yaml.safe_load(published.kubeconfig.read_text())
    token = kubeconfig["users"][0]["user"]["token"]
    tls = ssl.create_default_context(cafile=str(local_cluster.layout.pki / "ca.crt"))
    headers = {"Authorization": f"Bearer {token}"}

    def slice_for(node: str, name: str) -> Obj:
        return {
            "apiVersion": R,
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "x"}],
            },
        }

    with httpx.Client(
        base_url=local_cluster.layout.apiserver_url, verify=tls, headers=headers
    ) as client:
        denied = client.post(path_for(R, "resourceslices"), json=slice_for("node-2", "evil"))
        assert denied.status_code == 403, denied.text
        assert "may only write ResourceSlices of that node" in denied.json()["message"]
        own = client.post(path_for(R, "resourceslices"), json=slice_for(NODE, "own-probe"))
        assert own.status_code == 201, own.text
        # The plugin's publisher removes slices of its node it did not write, and may get
        # there first: either way the slice is gone.
        gone = client.delete(path_for(R, "resourceslices", name="own-probe"))
        assert gone.status_code in (200, 404), gone.text


def allocate_directly(api: AdminAPI, ns: str, name: str, device: str) -> str:
    """Create a claim and write its allocation as a controller would (no pod, no scheduler)."""
    claim = api.create(
        path_for(R, "resourceclaims", ns),
        {
            "metadata": {"name": name, "finalizers": ["dradriver.dev/test"]},
            "spec": claim_spec("plain"),
        },
    )
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [{"request": "dev", "driver": DRIVER, "pool": NODE, "device": device}]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                ]
            },
            "allocationTimestamp": "2026-01-01T00:00:00Z",
        }
    }
    api.replace(path_for(R, "resourceclaims", ns, name) + "/status", claim)
    return str(claim["metadata"]["uid"])


def release_directly(api: AdminAPI, ns: str, name: str) -> None:
    claim = api.get(path_for(R, "resourceclaims", ns, name))
    claim["status"] = {}
    claim = api.replace(path_for(R, "resourceclaims", ns, name) + "/status", claim)
    claim["metadata"]["finalizers"] = []
    api.replace(path_for(R, "resourceclaims", ns, name), claim)
    api.delete(path_for(R, "resourceclaims", ns, name))


def test_concurrent_calls_for_one_claim_do_the_work_once(
    published: NodePlugin, api: AdminAPI, namespace: str
) -> None:
    uid = allocate_directly(api, namespace, "direct", "dev-4")
    socket = published.kubelet_root / "plugins" / DRIVER / "dra.sock"
    claim = dra_v1_pb2.Claim(namespace=namespace, uid=uid, name="direct")

    async def calls() -> tuple[list[Any], list[Any]]:
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
            prepared = await asyncio.gather(
                *(
                    stub.NodePrepareResources(
                        dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim])
                    )
                    for _ in range(10)
                )
            )
            unprepared = await asyncio.gather(
                *(
                    stub.NodeUnprepareResources(
                        dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[claim])
                    )
                    for _ in range(10)
                )
            )
            return list(prepared), list(unprepared)

    try:
        prepared, unprepared = asyncio.run(calls())
        ids = {tuple(r.claims[uid].devices[0].cdi_device_ids) for r in prepared}
        assert len(ids) == 1 and all(r.claims[uid].error == "" for r in prepared)
        assert all(r.claims[uid].error == "" for r in unprepared)
        assert len(hook_lines(published, "setup", uid)) == 1
        assert len(hook_lines(published, "teardown", uid)) == 1
        assert ledger(published).get_claim(uid) is None
    finally:
        release_directly(api, namespace, "direct")


def test_failed_setup_is_rolled_back(published: NodePlugin, api: AdminAPI, namespace: str) -> None:
    make_template(api, namespace, "f", claim_spec("plain", config=_opaque(profile="fail")))
    make_pod(api, namespace, "p", template="f")

    def failed_event() -> str | None:
        for event in pod_events(api, namespace, "p"):
            if event.startswith("FailedPrepareDynamicResources") and "exited 3" in event:
                return event
        return None

    event = wait_until("the setup hook's failure as a pod event", failed_event, DEADLINE)
    assert "refusing profile fail" in event
    uid = pod_claim(api, namespace, "p")["metadata"]["uid"]
    assert ledger(published).get_claim(uid) is None
    assert cdi(published).read_claim(uid) is None
    assert len(hook_lines(published, "teardown", uid)) >= 1


@pytest.mark.parametrize("loss", ["corrupt", "missing"])
def test_a_lost_ledger_is_rebuilt_and_nothing_is_lost(
    published: NodePlugin, api: AdminAPI, namespace: str, loss: str
) -> None:
    make_template(api, namespace, "one", claim_spec("plain"))
    make_pod(api, namespace, "p", template="one")
    wait_running(api, namespace, "p")
    uid = pod_claim(api, namespace, "p")["metadata"]["uid"]
    published.stop()
    path = published.state_dir / "ledger.json"
    if loss == "corrupt":
        path.write_text(path.read_text().replace('"prepared"', '"prepaXed"'))
    else:
        path.unlink()
    published.start()
    published.wait_ready()
    if loss == "corrupt":
        assert list(published.state_dir.glob("ledger.json.corrupt-*")), "no copy of the bad file"
    assert cdi(published).read_claim(uid) is not None, "a running pod's CDI spec was deleted"
    # The hold is back, from the spec and the apiserver, with no setup hook run again.
    entry = ledger(published).get_claim(uid)
    assert entry is not None and entry.state == "prepared" and not entry.recovered
    assert len(hook_lines(published, "setup", uid)) == 1
    wait_pod_gone(api, namespace, "p")
    wait_until("claim unprepared", lambda: ledger(published).get_claim(uid) is None, DEADLINE)
    assert cdi(published).read_claim(uid) is None
    assert len(hook_lines(published, "teardown", uid)) == 1


def test_rolling_update_hands_over_without_a_gap(
    published: NodePlugin, api: AdminAPI, namespace: str
) -> None:
    successor = dataclasses.replace(published, instance="next", port=free_port(), process=None)
    successor.start()
    try:
        successor.wait_ready()
        published.stop()  # the old pod goes away only once the new one is registered
        make_template(api, namespace, "one", claim_spec("plain"))
        make_pod(api, namespace, "p", template="one")
        wait_running(api, namespace, "p")
        uid = pod_claim(api, namespace, "p")["metadata"]["uid"]
        assert f"uid={uid}" in successor.log_path.read_text()
        wait_pod_gone(api, namespace, "p")
        wait_until(
            "unprepared by the successor",
            lambda: ledger(published).get_claim(uid) is None,
            DEADLINE,
        )
    finally:
        successor.stop()
        published.start()
        published.wait_ready()


@pytest.mark.compat("slices")
def test_unchanged_inventory_writes_nothing(local_cluster: LocalCluster) -> None:
    driver, node = "pubtest.dradriver.dev", "pub-node"
    devices = [Device(name=f"d-{i}", attributes={"index": i}) for i in range(300)]

    names = [s["metadata"]["name"] for s in build_slices(node_pool(driver, node, devices, []), 0)]

    async def scenario() -> list[int]:
        client = KubeClient(load_connection(str(local_cluster.layout.admin_kubeconfig)))
        cache = slice_informer(client, driver, node)
        cache.start()
        publisher = SlicePublisher(client, driver, cache, node=node)

        async def publish() -> int:
            publisher.set_pool(node_pool(driver, node, devices, []))
            return (await publisher.sync(node)).writes

        try:
            await cache.wait_for_sync()
            writes = [await publish(), await publish()]
            devices[7] = Device(name="d-7", attributes={"index": 7, "changed": True})
            writes.append(await publish())
            # Someone deletes a slice (as the kubelet does): once the cache has seen it go,
            # the publisher puts it back.
            gone = asyncio.Event()
            cache.add_handler(
                on_delete=lambda s: gone.set() if s["metadata"]["name"] == names[1] else None
            )
            await client.delete(path_for(R, "resourceslices", name=names[1]))
            await asyncio.wait_for(gone.wait(), DEADLINE)
            writes.append(await publish())
            writes.append(await publish())
            return writes
        finally:
            await cache.stop()
            for name in names:
                await client.delete(path_for(R, "resourceslices", name=name))
            await client.aclose()

    first, again, changed, after_delete, settled = asyncio.run(scenario())
    assert first == 3  # 300 devices, 128 per slice
    assert again == 0
    assert changed == 1  # same slices, same devices: only the changed slice is rewritten
    assert after_delete >= 1
    assert settled == 0


def test_start_tears_down_claims_gone_from_the_api_and_deletes_orphan_specs(
    published: NodePlugin,
) -> None:
    gone_uid, orphan_uid = "0d1e2f30-aaaa-4bbb-8ccc-000000000001", "0d1e2f30-aaaa-4bbb-8ccc-2"
    published.stop()
    book = Ledger.load(published.state_dir / "ledger.json")
    book.begin_prepare(
        gone_uid,
        "nowhere",
        "deleted-claim",
        [
            ClaimDevice(
                pool=NODE,
                device="dev-3",
                request_names=["dev"],
                share_id=None,
                admin_access=False,
                exclusive=True,
                cdi_ids=[],
            )
        ],
        "digest",
    )
    book.complete_prepare(gone_uid)
    registry = cdi(published)
    edits = ContainerEdits(env={"X": "1"})
    registry.write_claim(gone_uid, [CDIDevice("dev-3", edits)])
    registry.write_claim(orphan_uid, [CDIDevice("dev-2", edits)])
    published.start()
    published.wait_ready()
    assert ledger(published).get_claim(gone_uid) is None
    assert registry.read_claim(gone_uid) is None
    assert registry.read_claim(orphan_uid) is None
    assert len(hook_lines(published, "teardown", gone_uid)) == 1
