"""The device-plugin shim with the real kubelet device manager, scheduler and apiserver.

Two plugin processes run side by side, each with its own driver name and extended
resource: one in ``shared`` mode (both APIs see the same four devices), one in
``partitioned`` mode (two devices each). Neither touches the ``dradriver.dev`` driver other
tests use.
"""

from __future__ import annotations

import base64
import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from devtools.cluster.api import AdminAPI
from devtools.cluster.gates import apiserver_gates, why_off
from devtools.cluster.kubeletstate import kubelet_cdi_ids
from devtools.cluster.local import LocalCluster
from devtools.cluster.wait import wait_until
from devtools.harness.nodeplugin import NodePlugin, node_slices, start_node_plugin
from dradriver.devices.static import create_mock_device
from dradriver.host.cdi import CDIRegistry
from dradriver.host.state.ledger import Ledger
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.kubeletapi.gen import deviceplugin_v1beta1_pb2 as dp
from dradriver.kubeletapi.gen import podresources_v1_pb2 as pr
from dradriver.kubeletapi.gen import podresources_v1_pb2_grpc as pr_grpc
from kubeletplugin.legacy.podresources import DEFAULT_SETTLE_SECONDS as SETTLE_SECONDS
from kubeletplugin.legacy.shim import CDI_CLASS, held_taint_key
from tests.cluster.conftest import Recorder

NODE = "node-1"
SHARED = "dpshared.dradriver.dev"
PARTED = "dpparted.dradriver.dev"
R = RESOURCE_V1
# Survives a kubelet prepare retry (~10-15 s) plus a pod-resources poll and node status sync.
DEADLINE = 120
ROUNDS = 4


# ----- plugin processes -----------------------------------------------------------------


PRESTART = """\
echo "prestart $DRADRIVER_RESOURCE $DRADRIVER_DEVICE $DRADRIVER_ALLOCATION" >> {work}/prestart.log
if [ -e {work}/fail-prestart ]; then
  echo "FPGA bitstream rejected by $DRADRIVER_DEVICE" >&2
  exit 4
fi
"""


def plugin_config(work: Path, driver: str, mode: str, plugin_devices: list[str]) -> Obj:
    return {
        "driverName": driver,
        "sources": [
            {
                "static": {
                    "mockDir": str(work / "mock"),
                    "devices": [{"namePrefix": "dev", "count": 4}],
                }
            }
        ],
        "devicePlugin": {
            "enabled": True,
            "mode": mode,
            "resources": [{"resourceName": f"{driver}/mock", "devices": {"names": plugin_devices}}],
            "preStart": {"command": ["sh", str(work / "prestart.sh")], "timeoutSeconds": 20},
            "podResourcesIntervalSeconds": 1,
            "releaseGraceSeconds": 30,
        },
    }


@dataclass
class Shim:
    plugin: NodePlugin
    driver: str
    api: AdminAPI = field(repr=False)

    @property
    def resource(self) -> str:
        return f"{self.driver}/mock"

    @property
    def work(self) -> Path:
        return self.plugin.workdir

    def ledger(self) -> Ledger:
        return Ledger.load(self.plugin.state_dir / "ledger.json")

    def cdi(self, cdi_class: str = CDI_CLASS) -> CDIRegistry:
        return CDIRegistry(self.plugin.cdi_dir, self.driver, cdi_class)

    def metric(self, name: str, **labels: str) -> float:
        want = [f'{k}="{v}"' for k, v in labels.items()]
        total = 0.0
        for line in self.plugin.metrics().splitlines():
            if line.startswith((name + "{", name + " ")) and all(w in line for w in want):
                total += float(line.rsplit(" ", 1)[1])
        return total


def start_shim(local_cluster: LocalCluster, driver: str, mode: str, devices: list[str]) -> Shim:
    work = Path(f"/tmp/dradriver-test-{driver.split('.')[0]}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(mode=0o700)
    (work / "prestart.sh").write_text(PRESTART.format(work=work))
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(plugin_config(work, driver, mode, devices)))
    api = local_cluster.api()
    api.delete(path_for(R, "deviceclasses", name=driver))
    api.create(
        path_for(R, "deviceclasses"),
        {
            "metadata": {"name": driver},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        },
    )
    return Shim(start_node_plugin(local_cluster, api, config, work, driver=driver), driver, api)


def stop_shim(shim: Shim) -> None:
    """Stop the plugin and remove what it published (the node forgets the resource itself,
    5 minutes after the plugin is gone)."""
    shim.plugin.stop()
    for s in node_slices(shim.api, NODE, shim.driver):
        shim.api.delete(path_for(R, "resourceslices", name=s["metadata"]["name"]))
    shim.api.delete(path_for(R, "deviceclasses", name=shim.driver))
    shim.api.close()


@pytest.fixture(scope="module")
def shared(local_cluster: LocalCluster) -> Iterator[Shim]:
    shim = start_shim(local_cluster, SHARED, "shared", ["dev-*"])
    try:
        yield shim
    finally:
        stop_shim(shim)


@pytest.fixture(scope="module")
def parted(local_cluster: LocalCluster) -> Iterator[Shim]:
    shim = start_shim(local_cluster, PARTED, "partitioned", ["dev-0", "dev-1"])
    try:
        yield shim
    finally:
        stop_shim(shim)


@pytest.fixture
def ready(shared: Shim, api: AdminAPI) -> Shim:
    """The shared-mode plugin is registered, the node advertises all 4 devices, slices are up."""
    shared.plugin.wait_ready()
    wait_until("4 devices allocatable", lambda: allocatable(api, shared.resource) == 4, DEADLINE)
    wait_until("the node's slices", lambda: len(slice_devices(api, SHARED)) == 4, DEADLINE)
    return shared


# ----- what the node, the kubelet and the ledger say --------------------------------------


def node_resource(api: AdminAPI, resource: str) -> tuple[int, int]:
    status = api.get(path_for("v1", "nodes", name=NODE))["status"]
    return (
        int(status.get("capacity", {}).get(resource, "0")),
        int(status.get("allocatable", {}).get(resource, "0")),
    )


def allocatable(api: AdminAPI, resource: str) -> int:
    return node_resource(api, resource)[1]


def slice_devices(api: AdminAPI, driver: str) -> dict[str, Obj]:
    return {
        d["name"]: d for s in node_slices(api, NODE, driver) for d in s["spec"].get("devices") or []
    }


def pod_resources(local_cluster: LocalCluster) -> dict[tuple[str, str], dict[str, list[str]]]:
    """(namespace, pod) -> resource -> device IDs, from the kubelet's pod-resources API."""
    sock = local_cluster.layout.kubelet_root / "pod-resources" / "kubelet.sock"
    with grpc.insecure_channel(f"unix://{sock}") as channel:
        response = pr_grpc.PodResourcesListerStub(channel).List(
            pr.ListPodResourcesRequest(), timeout=10
        )
    out: dict[tuple[str, str], dict[str, list[str]]] = {}
    for pod in response.pod_resources:
        for c in pod.containers:
            for d in c.devices:
                out.setdefault((pod.namespace, pod.name), {}).setdefault(
                    d.resource_name, []
                ).extend(d.device_ids)
    return out


def checkpoint_allocations(local_cluster: LocalCluster, resource: str) -> dict[str, Any]:
    """Pod UID -> the ContainerAllocateResponse the kubelet checkpointed for ``resource``."""
    path = local_cluster.layout.kubelet_root / "device-plugins" / "kubelet_internal_checkpoint"
    try:
        data = json.loads(path.read_text())["Data"]
    except FileNotFoundError:
        return {}
    out = {}
    for entry in data.get("PodDeviceEntries") or []:
        if entry["ResourceName"] == resource:
            out[entry["PodUID"]] = dp.ContainerAllocateResponse.FromString(
                base64.b64decode(entry["AllocResp"])
            )
    return out


# ----- pods -------------------------------------------------------------------------------


def make_plugin_pod(api: AdminAPI, ns: str, name: str, resource: str, count: int = 1) -> None:
    api.create(
        path_for("v1", "pods", ns),
        {
            "metadata": {"name": name, "labels": {"api": "device-plugin"}},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"limits": {resource: str(count)}},
                    }
                ],
            },
        },
    )


def make_template(api: AdminAPI, ns: str, driver: str) -> None:
    api.create(
        path_for(R, "resourceclaimtemplates", ns),
        {
            "metadata": {"name": "one"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "dev", "exactly": {"deviceClassName": driver}}]
                    }
                }
            },
        },
    )


def make_claim_pod(api: AdminAPI, ns: str, name: str) -> None:
    api.create(
        path_for("v1", "pods", ns),
        {
            "metadata": {"name": name, "labels": {"api": "dra"}},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": "one"}],
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"claims": [{"name": "dev"}]},
                    }
                ],
            },
        },
    )


def pod(api: AdminAPI, ns: str, name: str) -> Obj:
    return api.get(path_for("v1", "pods", ns, name))


def phase(obj: Obj) -> str:
    return str(obj.get("status", {}).get("phase", ""))


def events(api: AdminAPI, ns: str, name: str) -> list[str]:
    return [
        f"{e['reason']}: {e.get('message', '')}"
        for e in api.items(
            path_for("v1", "events", ns), fieldSelector=f"involvedObject.name={name}"
        )
    ]


def wait_running(api: AdminAPI, ns: str, name: str) -> Obj:
    try:

        def running() -> Obj | None:
            obj = pod(api, ns, name)
            return obj if phase(obj) == "Running" else None

        return wait_until(f"pod {ns}/{name} Running", running, DEADLINE)
    except TimeoutError as e:
        raise AssertionError(f"{e}; events: {events(api, ns, name)}") from e


def unschedulable(obj: Obj) -> bool:
    return any(
        c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
        for c in obj.get("status", {}).get("conditions", [])
    )


def delete_pods(api: AdminAPI, ns: str, names: list[str]) -> None:
    for name in names:
        api.delete(path_for("v1", "pods", ns, name))
    wait_until(
        f"pods {names} gone",
        lambda: all(api.get_or_none(path_for("v1", "pods", ns, n)) is None for n in names),
        DEADLINE,
    )


def claim_of(api: AdminAPI, ns: str, pod_obj: Obj) -> Obj | None:
    for status in pod_obj.get("status", {}).get("resourceClaimStatuses", []):
        if status.get("resourceClaimName"):
            return api.get(path_for(R, "resourceclaims", ns, status["resourceClaimName"]))
    return None


# ----- the double-allocation check ----------------------------------------------------------


@dataclass
class Usage:
    """Who uses which device right now, seen through every source we have."""

    by_device: dict[str, list[str]] = field(default_factory=dict)  # device -> users
    by_host_path: dict[str, list[str]] = field(default_factory=dict)  # CDI-resolved mock file
    ledger_doubles: list[str] = field(default_factory=list)
    missing_holds: list[str] = field(default_factory=list)

    def doubles(self) -> list[str]:
        out = [f"device {d}: {users}" for d, users in self.by_device.items() if len(users) > 1]
        out += [f"file {p}: {users}" for p, users in self.by_host_path.items() if len(users) > 1]
        return out + self.ledger_doubles


def usage(api: AdminAPI, local_cluster: LocalCluster, shim: Shim, ns: str) -> Usage:
    """Devices of running pods: DP pods via pod-resources + the kubelet's checkpointed CDI IDs,
    DRA pods via the claim allocation + the kubelet's DRA checkpoint; and the ledger."""
    result = Usage()
    listed = pod_resources(local_cluster)
    allocations = checkpoint_allocations(local_cluster, shim.resource)
    book = shim.ledger()
    held_by_plugin = {r.device for h in book.plugin_holds() for r in h.devices}
    held_by_claims = {(c.uid, d.device) for c in book.claims() for d in c.devices}
    for obj in api.items(path_for("v1", "pods", ns)):
        if phase(obj) != "Running":
            continue
        name, uid = obj["metadata"]["name"], obj["metadata"]["uid"]
        user = f"{obj['metadata']['labels']['api']} pod {name}"
        devices: list[str] = []
        cdi_ids: list[str] = []
        registry = shim.cdi()
        if obj["metadata"]["labels"]["api"] == "device-plugin":
            devices = listed.get((ns, name), {}).get(shim.resource, [])
            if uid in allocations:
                cdi_ids = [c.name for c in allocations[uid].cdi_devices]
            result.missing_holds += [f"{user}: {d}" for d in devices if d not in held_by_plugin]
        else:
            claim = claim_of(api, ns, obj)
            if claim is not None:
                results = claim["status"]["allocation"]["devices"]["results"]
                devices = [r["device"] for r in results if r["driver"] == shim.driver]
                claim_uid = claim["metadata"]["uid"]
                cdi_ids = kubelet_cdi_ids(local_cluster.layout.kubelet_root, claim_uid, shim.driver)
                registry = shim.cdi("device")
                result.missing_holds += [
                    f"{user}: {d}" for d in devices if (claim_uid, d) not in held_by_claims
                ]
        for d in devices:
            result.by_device.setdefault(d, []).append(user)
        if cdi_ids:
            for node in registry.resolve_many(cdi_ids).device_nodes:
                result.by_host_path.setdefault(str(node.host_path), []).append(user)
    for device in ("dev-0", "dev-1", "dev-2", "dev-3"):
        holders = [h for h in book.holders(NODE, device) if h.exclusive]
        if len(holders) > 1:
            result.ledger_doubles.append(
                f"ledger {device}: " + "; ".join(h.describe() for h in holders)
            )
    return result


# ----- tests: device plugin basics (shared-mode plugin) --------------------------------------


def test_node_capacity_and_allocatable_show_the_resource(ready: Shim, api: AdminAPI) -> None:
    assert node_resource(api, ready.resource) == (4, 4)
    assert ready.metric("dradriver_deviceplugin_registered", resource=ready.resource) == 1


@pytest.mark.compat("shim")
def test_pod_gets_cdi_devices_from_allocate_and_prestart_runs(
    ready: Shim,
    api: AdminAPI,
    namespace: str,
    local_cluster: LocalCluster,
    matrix_notes: Recorder,
) -> None:
    make_plugin_pod(api, namespace, "legacy", ready.resource)
    obj = wait_running(api, namespace, "legacy")
    [device] = pod_resources(local_cluster)[(namespace, "legacy")][ready.resource]
    response = checkpoint_allocations(local_cluster, ready.resource)[obj["metadata"]["uid"]]
    ids = [c.name for c in response.cdi_devices]
    assert len(ids) == 1 and ids[0].startswith(f"{SHARED}/{CDI_CLASS}=alloc-")
    edits = ready.cdi().resolve_many(ids)
    assert [n.host_path for n in edits.device_nodes] == [str(ready.work / "mock" / device)]
    assert response.envs[f"DRADRIVER_DEVICE_{device.upper().replace('-', '_')}"] == (
        f"/dev/dradriver/{device}"
    )
    assert response.envs["DRADRIVER_RESOURCE"] == ready.resource
    alloc = response.annotations[f"{SHARED}/allocation"]
    [hold] = [h for h in ready.ledger().plugin_holds() if h.pod_uid == alloc]
    assert [r.device for r in hold.devices] == [device]
    lines = (ready.work / "prestart.log").read_text().splitlines()
    assert f"prestart {ready.resource} {device} {alloc}" in lines
    # Shared mode: DRA's slices show the device as taken, where the apiserver keeps taints;
    # without them the node plugin's refusal is what keeps DRA off the device.
    off = why_off(apiserver_gates(api), "DRADeviceTaints")
    if off:
        matrix_notes.note("shim", f"held devices are not tainted in DRA's slices ({off})")
        return
    wait_until(
        f"{device} tainted in the ResourceSlices",
        lambda: (
            held_taint_key(SHARED)
            in [t["key"] for t in slice_devices(api, SHARED)[device].get("taints", [])]
        ),
        DEADLINE,
    )


def test_failing_prestart_hook_keeps_the_container_from_starting(
    ready: Shim, api: AdminAPI, namespace: str
) -> None:
    marker = ready.work / "fail-prestart"
    marker.touch()
    try:
        make_plugin_pod(api, namespace, "fpga", ready.resource)

        def refused() -> str | None:
            statuses = pod(api, namespace, "fpga").get("status", {}).get("containerStatuses", [])
            for s in statuses:
                message = s.get("state", {}).get("waiting", {}).get("message", "")
                if "preStart hook" in message:
                    return str(message)
            for e in events(api, namespace, "fpga"):
                if "preStart hook" in e:
                    return e
            return None

        message = wait_until("the preStart failure on the pod", refused, DEADLINE)
        assert "FPGA bitstream rejected" in message
        assert phase(pod(api, namespace, "fpga")) != "Running"
    finally:
        marker.unlink(missing_ok=True)
    wait_running(api, namespace, "fpga")  # the kubelet retries the start


def test_unhealthy_device_lowers_allocatable(ready: Shim, api: AdminAPI) -> None:
    mock = ready.work / "mock" / "dev-3"
    mock.unlink()
    try:
        wait_until("allocatable 3", lambda: node_resource(api, ready.resource) == (4, 3), DEADLINE)
    finally:
        create_mock_device(str(mock))  # a device node again, or Allocate refuses it
    wait_until("allocatable 4", lambda: node_resource(api, ready.resource) == (4, 4), DEADLINE)


def test_kubelet_restart_reregisters_without_restarting_the_plugin(
    ready: Shim, api: AdminAPI, namespace: str, local_cluster: LocalCluster
) -> None:
    def restarts() -> float:
        return ready.metric(
            "dradriver_deviceplugin_registrations_total",
            reason="kubelet-restart",
            resource=ready.resource,
        )

    make_plugin_pod(api, namespace, "survivor", ready.resource)
    wait_running(api, namespace, "survivor")
    holds = {h.pod_uid for h in ready.ledger().plugin_holds()}
    assert len(holds) == 1
    releases = ready.metric("dradriver_deviceplugin_releases_total")
    before = restarts()
    pid = ready.plugin.process.pid if ready.plugin.process else None
    local_cluster.restart_component("kubelet")
    wait_until("re-registration after the kubelet restart", lambda: restarts() > before, DEADLINE)
    wait_until(
        "capacity and allocatable restored",
        lambda: node_resource(api, ready.resource) == (4, 4),
        DEADLINE,
    )
    assert ready.plugin.process is not None and ready.plugin.process.pid == pid
    assert ready.plugin.process.alive()
    # A fresh kubelet may not list its pods yet: the running pod's hold must survive until
    # the kubelet has settled and several polls have seen the pod again.
    sock = local_cluster.layout.kubelet_root / "pod-resources" / "kubelet.sock"
    polls: list[float] = []

    def settled_polls() -> bool:
        if time.time() - sock.stat().st_ctime < SETTLE_SECONDS:
            return False
        polls.append(ready.metric("dradriver_deviceplugin_pod_resources_polls_total"))
        return polls[-1] >= polls[0] + 3

    wait_until("three pod-resources polls after the kubelet settled", settled_polls, DEADLINE)
    assert {h.pod_uid for h in ready.ledger().plugin_holds()} == holds
    assert ready.metric("dradriver_deviceplugin_releases_total") == releases
    assert phase(pod(api, namespace, "survivor")) == "Running"


def test_deleting_a_device_plugin_pod_gives_its_devices_back_to_dra(
    ready: Shim, api: AdminAPI, namespace: str
) -> None:
    make_plugin_pod(api, namespace, "all4", ready.resource, count=4)
    wait_running(api, namespace, "all4")
    wait_until(
        "all devices tainted for DRA",
        lambda: all(
            held_taint_key(SHARED) in [t["key"] for t in d.get("taints", [])]
            for d in slice_devices(api, SHARED).values()
        ),
        DEADLINE,
    )
    make_template(api, namespace, SHARED)
    make_claim_pod(api, namespace, "dra")
    wait_until(
        "the claim pod unschedulable", lambda: unschedulable(pod(api, namespace, "dra")), DEADLINE
    )
    delete_pods(api, namespace, ["all4"])
    wait_running(api, namespace, "dra")
    # And the reverse: the claim's device is Unhealthy for the kubelet's device manager.
    wait_until("allocatable 3", lambda: node_resource(api, ready.resource) == (4, 3), DEADLINE)


def settled(api: AdminAPI, ns: str, names: list[str]) -> bool:
    """Every pod is Running, Failed (admission refused), unschedulable, or waiting on a
    prepare that the kubelet retries."""
    for name in names:
        obj = pod(api, ns, name)
        if phase(obj) in ("Running", "Failed") or unschedulable(obj):
            continue
        if not any(e.startswith("FailedPrepareDynamicResources") for e in events(api, ns, name)):
            return False
    return True


def test_shared_mode_never_hands_a_device_out_twice(
    ready: Shim, api: AdminAPI, namespace: str, local_cluster: LocalCluster
) -> None:
    make_template(api, namespace, SHARED)
    samples: list[list[str]] = []
    outcome = {"dp_running": 0, "dp_refused": 0, "dra_running_first": 0, "dra_waited": 0}

    def check() -> None:
        found = usage(api, local_cluster, ready, namespace)
        samples.append(found.doubles())
        assert not found.missing_holds, found.missing_holds

    for r in range(ROUNDS):
        dp_pods = [f"dp-{r}-{i}" for i in range(3)]
        dra_pods = [f"dra-{r}-{i}" for i in range(3)]
        if r % 2 == 0:
            # Both kinds at once: device-plugin pods usually win (no claim to allocate).
            for a, b in zip(dp_pods, dra_pods, strict=True):
                make_plugin_pod(api, namespace, a, ready.resource)
                make_claim_pod(api, namespace, b)
        else:
            # Claims first: the device-plugin pods arrive when DRA holds three devices (the
            # node's allocatable may not say so yet; the kubelet's device manager does).
            for b in dra_pods:
                make_claim_pod(api, namespace, b)
            for b in dra_pods:
                wait_running(api, namespace, b)
            for a in dp_pods:
                make_plugin_pod(api, namespace, a, ready.resource)

        round_pods = dp_pods + dra_pods
        wait_until(f"round {r} settled", partial(settled, api, namespace, round_pods), DEADLINE)
        check()
        phases = {n: phase(pod(api, namespace, n)) for n in dp_pods + dra_pods}
        outcome["dp_running"] += sum(phases[n] == "Running" for n in dp_pods)
        outcome["dp_refused"] += sum(phases[n] == "Failed" for n in dp_pods)
        outcome["dra_running_first"] += sum(phases[n] == "Running" for n in dra_pods)
        # Ending the device-plugin pods gives every claim pod a device.
        delete_pods(api, namespace, dp_pods)
        for name in dra_pods:
            if phases[name] != "Running":
                outcome["dra_waited"] += 1
            wait_running(api, namespace, name)
        check()
        delete_pods(api, namespace, dra_pods)
        wait_until(
            "the ledger empty again",
            lambda: not ready.ledger().plugin_holds() and not ready.ledger().claims(),
            DEADLINE,
        )
    doubles = [d for s in samples for d in s]
    conflicts = ready.metric("dradriver_deviceplugin_conflicts_total")
    print(
        f"\nshared mode, {ROUNDS} rounds: {outcome}; samples {len(samples)}; "
        f"double allocations {len(doubles)}; conflicts metric {conflicts}"
    )
    assert doubles == []
    assert conflicts == 0
    assert outcome["dp_running"] > 0 and outcome["dra_running_first"] > 0


# ----- partitioned mode --------------------------------------------------------------------


def test_partitioned_mode_sets_never_overlap(
    parted: Shim, api: AdminAPI, namespace: str, local_cluster: LocalCluster
) -> None:
    parted.plugin.wait_ready()
    wait_until(
        "2 devices allocatable", lambda: node_resource(api, parted.resource) == (2, 2), DEADLINE
    )
    wait_until(
        "the DRA half in the slices",
        lambda: sorted(slice_devices(api, PARTED)) == ["dev-2", "dev-3"],
        DEADLINE,
    )
    make_template(api, namespace, PARTED)
    for i in range(3):
        make_plugin_pod(api, namespace, f"dp-{i}", parted.resource)
        make_claim_pod(api, namespace, f"dra-{i}")

    def placed() -> dict[str, list[str]] | None:
        used: dict[str, list[str]] = {"device-plugin": [], "dra": []}
        waiting = 0
        for obj in api.items(path_for("v1", "pods", namespace)):
            kind = obj["metadata"]["labels"]["api"]
            if phase(obj) == "Running":
                if kind == "device-plugin":
                    listed = pod_resources(local_cluster)
                    used[kind] += listed.get((namespace, obj["metadata"]["name"]), {}).get(
                        parted.resource, []
                    )
                else:
                    claim = claim_of(api, namespace, obj)
                    assert claim is not None
                    used[kind] += [
                        r["device"] for r in claim["status"]["allocation"]["devices"]["results"]
                    ]
            elif not unschedulable(obj):
                waiting += 1
        return used if waiting == 0 and all(len(v) == 2 for v in used.values()) else None

    used = wait_until("two pods of each kind running, the third unschedulable", placed, DEADLINE)
    assert sorted(used["device-plugin"]) == ["dev-0", "dev-1"]
    assert sorted(used["dra"]) == ["dev-2", "dev-3"]
    assert not set(used["device-plugin"]) & set(used["dra"])
    assert usage(api, local_cluster, parted, namespace).doubles() == []
