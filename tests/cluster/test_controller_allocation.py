"""Controller allocation on the real cluster: dradriver-controller with its manifests' RBAC.

Every test publishes its own slices (a unique driver name, devices on ``node-1``) and
DeviceClass as admin, runs one controller process restricted to the test's namespace
(``--allocation-namespace``) and deletes its claims while the controller still runs, so
the controller's finalizer never outlives it. No kubelet plugin serves the test drivers:
pods get scheduled (the claim reserved for them), they never start.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.claims import fence_rules as fence
from controller.claims.staleness import DEFAULT_CATCHUP
from devtools.cluster.api import AdminAPI
from devtools.cluster.gates import apiserver_gates, why_off
from devtools.cluster.local import LocalCluster
from devtools.cluster.wait import wait_until
from devtools.harness import finalizerpolicy
from devtools.harness.controller import (
    NAMESPACE,
    ControllerProcess,
    controller_kubeconfig,
    install_crds,
    namespaced_controller,
)
from devtools.harness.nodeplugin import NodePlugin, node_slices, start_node_plugin, wait_for_slices
from dradriver.api import parameters as params
from dradriver.api.wellknown import (
    ALLOCATION_ANNOTATION,
    CONFLICT_ANNOTATION,
    FINALIZER,
    STATUS_ANNOTATION,
)
from dradriver.api.wellknown import CLAIM_STAGE_METRIC as STAGE_METRIC
from dradriver.k8s.client import KubeClient, connection_from_files
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from tests.cluster.conftest import Recorder

R = RESOURCE_V1
NODE = "node-1"
DEADLINE = 60
# The first allocation after a controller starts on a cluster that is itself just up: an
# apiserver error the controller met while the cluster started (a 503 from an apiserver
# not yet ready) opens a scheduler catch-up period, and with no pod being scheduled no
# evidence ends it early, so the claim may wait the whole period (by design).
FIRST_ALLOCATION = DEFAULT_CATCHUP + DEADLINE
PARAMS_API = f"dradriver.dev/{params.VERSION}"


class Rig:
    """A unique driver's node-local pool on node-1, its class, claims and pods."""

    def __init__(self, api: AdminAPI, namespace: str, devices: int) -> None:
        self.api = api
        self.namespace = namespace
        self.id = uuid.uuid4().hex[:8]
        self.driver = f"ca-{self.id}.test.dradriver.dev"
        self.cls = f"ca-{self.id}"
        self.slice = f"ca-{self.id}"
        self.devices = devices

    def __enter__(self) -> Rig:
        self.api.create(
            path_for(R, "deviceclasses"),
            {
                "metadata": {"name": self.cls},
                "spec": {
                    "selectors": [{"cel": {"expression": f'device.driver == "{self.driver}"'}}]
                },
            },
        )
        self.api.create(
            path_for(R, "resourceslices"),
            {
                "metadata": {"name": self.slice},
                "spec": {
                    "driver": self.driver,
                    "nodeName": NODE,
                    "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": f"dev-{i}"} for i in range(self.devices)],
                },
            },
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.api.delete(path_for(R, "resourceslices", name=self.slice))
        self.api.delete(path_for(R, "deviceclasses", name=self.cls))

    def claim(
        self,
        name: str,
        immediate: bool = True,
        config: list[Obj] | None = None,
        count: int = 1,
        finalizers: list[str] | None = None,
    ) -> Obj:
        meta: Obj = {"name": name, "namespace": self.namespace}
        if immediate:
            meta["annotations"] = {ALLOCATION_ANNOTATION: "Immediate"}
        if finalizers:
            meta["finalizers"] = finalizers
        devices: Obj = {
            "requests": [{"name": "r", "exactly": {"deviceClassName": self.cls, "count": count}}]
        }
        if config:
            devices["config"] = config
        return self.api.create(
            path_for(R, "resourceclaims", self.namespace),
            {"metadata": meta, "spec": {"devices": devices}},
        )

    def get_claim(self, name: str) -> Obj | None:
        return self.api.get_or_none(path_for(R, "resourceclaims", self.namespace, name))

    def allocated(self, name: str) -> Obj | None:
        claim = self.get_claim(name)
        return claim if claim and (claim.get("status") or {}).get("allocation") else None

    def pod(self, name: str, claim: Obj) -> Obj:
        return self.api.create(
            path_for("v1", "pods", self.namespace),
            {
                "metadata": {"name": name},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "resourceClaims": [{"name": "c", **claim}],
                    "containers": [
                        {
                            "name": "c",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "c"}]},
                        }
                    ],
                },
            },
        )

    def template(self, name: str) -> None:
        self.api.create(
            path_for(R, "resourceclaimtemplates", self.namespace),
            {
                "metadata": {"name": name},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [{"name": "r", "exactly": {"deviceClassName": self.cls}}]
                        }
                    }
                },
            },
        )

    def events(self, name: str, reason: str) -> list[Obj]:
        return [
            e
            for e in self.api.items(
                path_for("v1", "events", self.namespace),
                fieldSelector=f"involvedObject.name={name},involvedObject.kind=ResourceClaim",
            )
            if e.get("reason") == reason
        ]

    def delete_all(self) -> None:
        """Pods first (frees reservedFor), then claims: while the controller still runs."""
        ns = self.namespace
        for pod in self.api.items(path_for("v1", "pods", ns)):
            self.api.request(
                "DELETE",
                path_for("v1", "pods", ns, pod["metadata"]["name"]),
                {"gracePeriodSeconds": 0},
            )
        for claim in self.api.items(path_for(R, "resourceclaims", ns)):
            self.api.delete(path_for(R, "resourceclaims", ns, claim["metadata"]["name"]))
        wait_until(
            "pods and claims gone",
            lambda: (
                not self.api.items(path_for("v1", "pods", ns))
                and not self.api.items(path_for(R, "resourceclaims", ns))
            ),
            DEADLINE,
        )


def devices_of(claim: Obj) -> list[str]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return [
        f"{r['pool']}/{r['device']}"
        for r in (allocation.get("devices") or {}).get("results") or []
        if not r.get("adminAccess") and not r.get("shareID")
    ]


def fences_of(api: AdminAPI, driver: str) -> list[Obj]:
    """The fence claims (in the controller's namespace) holding devices of ``driver``."""
    out = []
    for c in api.items(
        path_for(R, "resourceclaims", NAMESPACE), labelSelector=f"{fence.FENCE_LABEL}=true"
    ):
        devices = json.loads(c["metadata"]["annotations"][fence.DEVICES_ANNOTATION])
        if any(d[0] == driver for d in devices):
            out.append(c)
    return out


def usable(claims: list[Obj]) -> list[Obj]:
    """Claims that can be used: not held after a conflict (the node refuses those)."""
    return [
        c for c in claims if CONFLICT_ANNOTATION not in (c["metadata"].get("annotations") or {})
    ]


def describe(api: AdminAPI, namespace: str) -> str:
    """What the claims and pods look like (for a failure message)."""
    lines = []
    for c in api.items(path_for(R, "resourceclaims", namespace)):
        annotations = c["metadata"].get("annotations") or {}
        lines.append(
            f"claim {c['metadata']['name']}: devices={devices_of(c)} "
            f"finalizers={c['metadata'].get('finalizers')} "
            f"status={annotations.get(STATUS_ANNOTATION)!r}"
        )
    for p in api.items(path_for("v1", "pods", namespace)):
        conditions = [
            (c["type"], c["status"], c.get("reason"), c.get("message"))
            for c in p.get("status", {}).get("conditions") or []
        ]
        lines.append(f"pod {p['metadata']['name']}: node={p['spec'].get('nodeName')} {conditions}")
    return "\n".join(lines)


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dradriver-alloc-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubeconfig(api: AdminAPI, local_cluster: LocalCluster, workdir: Path) -> Path:
    return controller_kubeconfig(api, local_cluster, workdir)


def controller(kubeconfig: Path, workdir: Path, namespace: str) -> ControllerProcess:
    return ControllerProcess(
        f"alloc-{namespace}",
        kubeconfig,
        workdir,
        extra_args=["--no-leader-elect", f"--allocation-namespace={namespace}"],
    )


@pytest.fixture
def running(
    api: AdminAPI, local_cluster: LocalCluster, namespace: str
) -> Iterator[ControllerProcess]:
    with namespaced_controller(api, local_cluster, namespace, "alloc", DEADLINE) as proc:
        yield proc


@pytest.mark.compat("immediate")
def test_immediate_claim_is_allocated_without_a_pod_then_used_by_one(
    api: AdminAPI, namespace: str, running: ControllerProcess, matrix_notes: Recorder
) -> None:
    # What this release lacks is said once, in one line, at start-up; allocation goes on.
    gates = apiserver_gates(api)
    lacking = [
        name
        for name, gate in (
            ("device taints", "DRADeviceTaints"),
            ("binding conditions", "DRADeviceBindingConditions"),
        )
        if why_off(gates, gate)
    ]
    lines = [
        line
        for line in running.log_path.read_text().splitlines()
        if "not available on this cluster" in line
    ]
    assert len(lines) == (1 if lacking else 0), lines
    assert all(name in lines[0] for name in lacking)
    with Rig(api, namespace, devices=2) as rig:
        try:
            rig.claim("early")
            claim = wait_until("early allocated", lambda: rig.allocated("early"), FIRST_ALLOCATION)
            allocation = claim["status"]["allocation"]
            assert FINALIZER in claim["metadata"]["finalizers"]
            # Found on 1.34 (not 1.35): with binding conditions off the apiserver drops it.
            if "allocationTimestamp" not in allocation:
                timestamp_off = why_off(gates, "DRADeviceBindingConditions")
                assert timestamp_off, allocation
                matrix_notes.note("immediate", f"allocationTimestamp dropped ({timestamp_off})")
            else:
                assert allocation["allocationTimestamp"]
            assert allocation["nodeSelector"] == {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                ]
            }
            [result] = allocation["devices"]["results"]
            assert result["driver"] == rig.driver and result["request"] == "r"
            assert not claim["status"].get("reservedFor")
            assert wait_until("Allocated event", lambda: rig.events("early", "Allocated"), 30)

            pod = rig.pod("user", {"resourceClaimName": "early"})
            reserved = wait_until(
                "pod reserved the claim",
                lambda: [
                    r
                    for r in (rig.get_claim("early") or {}).get("status", {}).get("reservedFor")
                    or []
                    if r.get("uid") == pod["metadata"]["uid"]
                ],
                DEADLINE,
            )
            assert reserved[0]["name"] == "user"
            bound = wait_until(
                "pod bound",
                lambda: (api.get(path_for("v1", "pods", namespace, "user"))["spec"]).get(
                    "nodeName"
                ),
                DEADLINE,
            )
            assert bound == NODE
            # The scheduler used our allocation as it was: same devices.
            assert devices_of(rig.get_claim("early") or {}) == devices_of(claim)

            # Deleting the claim while reserved: the controller waits; then deallocates.
            api.delete(path_for(R, "resourceclaims", namespace, "early"))
            still = rig.get_claim("early")
            assert still is not None and still["status"].get("allocation")
            rig.delete_all()
        finally:
            rig.delete_all()


def test_with_the_chart_finalizer_policy_allocating_is_one_controller_write(
    api: AdminAPI, namespace: str, running: ControllerProcess
) -> None:
    """The chart's MutatingAdmissionPolicy (1.36+) gives an immediate claim the finalizer
    as it is created: the controller skips its finalizer patch and writes only the
    allocation. A claim the policy marked that cannot be allocated still goes when
    deleted (the controller removes the finalizer)."""
    if not finalizerpolicy.served(api):
        pytest.skip("this cluster does not serve admissionregistration.k8s.io/v1 policies")
    stage = f"{STAGE_METRIC}_count{{stage="
    with (
        Rig(api, namespace, devices=2) as rig,
        finalizerpolicy.installed(api, namespace, classes=[rig.cls]),
    ):
        try:
            created = rig.claim("one")
            assert FINALIZER in created["metadata"]["finalizers"]
            wait_until("one allocated", lambda: rig.allocated("one"), DEADLINE)
            assert running.metric(f'{stage}"status_write"}}') == 1.0
            assert running.metric(f'{stage}"finalizer_write"}}') in (None, 0.0)

            too_big = rig.claim("too-big", count=3)
            assert FINALIZER in too_big["metadata"]["finalizers"]
            wait_until("too-big refused", lambda: rig.events("too-big", "AllocationFailed"), 30)
        finally:
            rig.delete_all()  # waits until both are gone: the finalizers were removed


def test_parameters_reference_is_resolved_and_pinned(
    api: AdminAPI, namespace: str, running: ControllerProcess
) -> None:
    install_crds(api)
    spec = {"env": {"MODE": "fast"}, "profile": "fast", "allocationMode": "Immediate"}
    api.create(
        path_for(PARAMS_API, params.PLURAL, namespace),
        {
            "apiVersion": PARAMS_API,
            "kind": params.KIND,
            "metadata": {"name": "p", "namespace": namespace},
            "spec": spec,
        },
    )
    reference = {"apiVersion": PARAMS_API, "kind": params.REFERENCE_KIND, "name": "p"}
    with Rig(api, namespace, devices=1) as rig:
        try:
            # Immediate through the parameters alone (no annotation).
            rig.claim(
                "c",
                immediate=False,
                config=[{"opaque": {"driver": "dradriver.dev", "parameters": reference}}],
            )
            claim = wait_until("c allocated", lambda: rig.allocated("c"), DEADLINE)
            assert claim["status"]["allocation"]["devices"]["config"] == [
                {
                    "source": "FromClaim",
                    "opaque": {
                        "driver": "dradriver.dev",
                        "parameters": {
                            "apiVersion": PARAMS_API,
                            "kind": "DeviceConfig",
                            "env": {"MODE": "fast"},
                            "profile": "fast",
                        },
                    },
                }
            ]
        finally:
            rig.delete_all()


def test_missing_parameters_and_unsatisfiable_claims_are_explained(
    api: AdminAPI, namespace: str, running: ControllerProcess
) -> None:
    install_crds(api)
    reference = {"apiVersion": PARAMS_API, "kind": params.REFERENCE_KIND, "name": "later"}
    with Rig(api, namespace, devices=2) as rig:
        try:
            rig.claim(
                "missing", config=[{"opaque": {"driver": "dradriver.dev", "parameters": reference}}]
            )
            rig.claim("greedy", count=3)

            def status(name: str) -> str | None:
                claim = rig.get_claim(name) or {}
                value: str | None = (claim["metadata"].get("annotations") or {}).get(
                    STATUS_ANNOTATION
                )
                return value

            text = wait_until("missing explained", lambda: status("missing"), DEADLINE)
            assert f"DeviceClaimParameters {namespace}/later does not exist" in text
            assert "spec.devices.config[0].opaque.parameters.name" in text
            [event] = wait_until("event", lambda: rig.events("missing", "AllocationFailed"), 30)
            assert event["message"] == text and event["type"] == "Warning"
            assert not rig.allocated("missing")

            greedy = wait_until("greedy explained", lambda: status("greedy"), DEADLINE)
            assert greedy.startswith("request r:"), greedy
            assert "needs 3 device(s), 2 available" in greedy, greedy
            assert wait_until("event", lambda: rig.events("greedy", "AllocationFailed"), 30)
            assert not rig.allocated("greedy")

            # Creating the parameters object resolves the claim: allocated, annotation gone.
            api.create(
                path_for(PARAMS_API, params.PLURAL, namespace),
                {
                    "apiVersion": PARAMS_API,
                    "kind": params.KIND,
                    "metadata": {"name": "later", "namespace": namespace},
                    "spec": {"profile": "late"},
                },
            )
            claim = wait_until("missing allocated", lambda: rig.allocated("missing"), DEADLINE)
            wait_until("annotation removed", lambda: status("missing") is None, DEADLINE)
            config = claim["status"]["allocation"]["devices"]["config"]
            assert config[0]["opaque"]["parameters"]["profile"] == "late"
        finally:
            rig.delete_all()


def test_restart_between_finalizer_and_allocation_recovers(
    api: AdminAPI, namespace: str, kubeconfig: Path, workdir: Path
) -> None:
    """A claim that already has our finalizer but no allocation (the controller died
    after the finalizer write): the next controller allocates it."""
    with Rig(api, namespace, devices=1) as rig:
        proc = controller(kubeconfig, workdir, namespace)
        try:
            rig.claim("half-done", finalizers=[FINALIZER])
            proc.start()
            wait_until("controller ready", proc.ready, DEADLINE)
            claim = wait_until("allocated", lambda: rig.allocated("half-done"), DEADLINE)
            assert claim["metadata"]["finalizers"].count(FINALIZER) == 1
            rig.delete_all()
        finally:
            if proc.process is not None:
                rig.delete_all()
            proc.stop()


def in_use(claim: Obj) -> bool:
    """A claim a pod can use right now: reserved for it, and not held after a conflict.

    An allocated claim no pod has reserved cannot be prepared (the kubelet prepares only
    the claims reserved for its pods), and the node plugin refuses a held one.
    """
    return bool((claim.get("status") or {}).get("reservedFor")) and bool(usable([claim]))


class ClaimWatch:
    """Every version of a namespace's ResourceClaims, from a watch in a thread of its own.

    After each event it checks the README's promise on the claims as they are at that
    version: no device is held by two claims in use (:func:`in_use`). It also records the
    versions at which a device is held by two claims not held after a conflict, one of
    them unreserved: the moment between the controller's write and its hold (they must
    be resolved by the end of a round, which the test asserts on the API).
    """

    def __init__(self, local_cluster: LocalCluster, namespace: str) -> None:
        layout = local_cluster.layout
        self.conn = connection_from_files(
            layout.apiserver_url,
            layout.pki / "ca.crt",
            layout.pki / "admin.crt",
            layout.pki / "admin.key",
        )
        self.path = path_for(R, "resourceclaims", namespace)
        self.claims: dict[str, Obj] = {}
        self.versions = 0
        self.violations: list[str] = []
        self.transient: list[str] = []
        self.error: BaseException | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="claim-watch", daemon=True)
        self._task: asyncio.Task[None] | None = None
        self._listed = threading.Event()

    def __enter__(self) -> ClaimWatch:
        self._thread.start()
        if not self._listed.wait(30):
            raise TimeoutError("the claim watch did not start")
        if self.error is not None:
            raise self.error
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(30)

    def _run(self) -> None:
        async def main() -> None:
            self._task = asyncio.current_task()
            try:
                await self._watch()
            except asyncio.CancelledError:
                pass
            except BaseException as e:  # reported by the test
                self.error = e
                self._listed.set()

        self._loop.run_until_complete(main())
        self._loop.close()

    async def _watch(self) -> None:
        client = KubeClient(self.conn, "dradriver-test-claim-watch")
        try:
            listed = await client.list(self.path)
            self.claims = {c["metadata"]["name"]: c for c in listed.get("items", [])}
            rv = listed["metadata"]["resourceVersion"]
            self._listed.set()
            while True:  # the server ends a watch after its timeout: resume
                async for event in client.watch(self.path, rv):
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        raise RuntimeError(f"claim watch failed: {obj}")
                    rv = obj["metadata"]["resourceVersion"]
                    if event.get("type") == "BOOKMARK":
                        continue
                    name = obj["metadata"]["name"]
                    if event.get("type") == "DELETED":
                        self.claims.pop(name, None)
                    else:
                        self.claims[name] = obj
                    self.versions += 1
                    self._check(rv)
        finally:
            await client.aclose()

    def _check(self, rv: str) -> None:
        claims = list(self.claims.values())
        used = Counter(d for c in claims if in_use(c) for d in devices_of(c))
        for device, n in used.items():
            if n > 1:
                holders = [c["metadata"]["name"] for c in claims if device in devices_of(c)]
                self.violations.append(f"rv {rv}: {device} in use by {holders}")
        held = Counter(d for c in usable(claims) for d in devices_of(c))
        for device, n in held.items():
            if n > 1 and used[device] <= 1:
                holders = [c["metadata"]["name"] for c in usable(claims) if device in devices_of(c)]
                self.transient.append(f"rv {rv}: {device} held by {holders}")

    def check(self) -> None:
        """Raise if the watch failed or saw a device in use by two claims."""
        if self.error is not None:
            raise AssertionError(f"the claim watch failed: {self.error!r}")
        assert not self.violations, self.violations


def test_controller_and_scheduler_race_for_a_small_pool(
    api: AdminAPI, local_cluster: LocalCluster, namespace: str, running: ControllerProcess
) -> None:
    """4 immediate claims and 4 pods for 2 devices, 3 rounds: no device is ever in use by
    two claims (checked at every version of the claims), and any double holding the race
    produces is resolved (a held claim, unusable, or given back) by the end of a round."""
    immediate, pods, rounds = 4, 4, 3
    held_claims: set[str] = set()
    with Rig(api, namespace, devices=2) as rig, ClaimWatch(local_cluster, namespace) as watch:
        rig.template("tpl")
        try:
            for n in range(rounds):
                for i in range(max(immediate, pods)):
                    if i < immediate:
                        rig.claim(f"r{n}-imm-{i}")
                    if i < pods:
                        rig.pod(f"r{n}-pod-{i}", {"resourceClaimTemplateName": "tpl"})

                def settled() -> list[Obj] | None:
                    watch.check()  # fail at once, not at the timeout
                    claims = api.items(path_for(R, "resourceclaims", namespace))
                    held = Counter(d for c in usable(claims) for d in devices_of(c))
                    if any(count > 1 for count in held.values()):
                        return None  # the controller must resolve it: wait (or time out)
                    pod_list = api.items(path_for("v1", "pods", namespace))
                    if len(pod_list) < pods:
                        return None
                    for c in claims:
                        annotations = c["metadata"].get("annotations") or {}
                        if annotations.get(ALLOCATION_ANNOTATION) and not (
                            devices_of(c) or annotations.get(STATUS_ANNOTATION)
                        ):
                            return None
                    for pod in pod_list:
                        conditions = pod.get("status", {}).get("conditions") or []
                        if not pod["spec"].get("nodeName") and not any(
                            c["type"] == "PodScheduled" and c["status"] == "False"
                            for c in conditions
                        ):
                            return None
                    # Template claims: allocated for a bound pod or left for an unschedulable one.
                    if sum(1 for c in usable(claims) if devices_of(c)) < 2:
                        return None
                    return claims

                try:
                    claims = wait_until(f"round {n} settled", settled, DEADLINE)
                except TimeoutError:
                    print(describe(api, namespace))
                    for line in running.log_path.read_text().splitlines():
                        if f"r{n}-" in line and "cannot be allocated" not in line:
                            print(line[:400])
                    raise
                held = Counter(d for c in usable(claims) for d in devices_of(c))
                assert all(count == 1 for count in held.values()), held  # resolved
                assert len(held) == 2
                for c in claims:
                    annotations = c["metadata"].get("annotations") or {}
                    if annotations.get(CONFLICT_ANNOTATION):
                        held_claims.add(c["metadata"]["name"])
                        assert "held unused" in annotations[STATUS_ANNOTATION]
                        assert not (c["status"].get("reservedFor"))
                    elif annotations.get(ALLOCATION_ANNOTATION) and not devices_of(c):
                        assert "allocated to other claims" in annotations[STATUS_ANNOTATION]
                for pod in api.items(path_for("v1", "pods", namespace)):
                    if not pod["spec"].get("nodeName"):
                        [cond] = [
                            c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"
                        ]
                        assert cond["reason"] == "Unschedulable", cond
                rig.delete_all()
                # A fence lives only while another claim holds its device: none is left.
                wait_until("fences deleted", lambda: not fences_of(api, rig.driver), DEADLINE)
                watch.check()
            # Every claim the controller held after a conflict (its AllocationConflict
            # events, in the API) let go of the device in the end, given back or
            # deallocated, and each of those clears was followed by the check for other
            # holders of its devices (fenced if one was left).
            held_ever = {
                e["involvedObject"]["name"]
                for e in api.items(path_for("v1", "events", namespace))
                if e.get("reason") == "AllocationConflict" and "held unused" in e["message"]
            }
            text = running.log_path.read_text()

            def per_claim(message: str) -> Counter[str]:
                found: Counter[str] = Counter()
                for line in text.splitlines():
                    if f'msg="{message}"' in line:
                        claim = line.split(" claim=", 1)[1].split(" ", 1)[0]
                        if claim.startswith(f"{namespace}/"):
                            found[claim.split("/", 1)[1]] += 1
                return found

            gave_back = per_claim("held claim gave its allocation back")
            deallocated = per_claim("claim deallocated")
            checked = per_claim("fence check after removal")
            print(
                f"claim versions watched: {watch.versions}; devices held by two claims not "
                f"held (one unreserved) at some version: {len(watch.transient)}; "
                f"claims held after a conflict: {sorted(held_ever)} "
                f"(at the end of a round: {sorted(held_claims)}); given back: "
                f"{sum(gave_back.values())}; deallocated: {sum(deallocated.values())}"
            )
            for line in watch.transient:
                print(line)
            assert held_claims <= held_ever
            for name in held_ever:
                assert gave_back[name] + deallocated[name] >= 1, (name, text[-4000:])
            for name in set(gave_back) | set(deallocated):
                assert checked[name] >= gave_back[name] + deallocated[name], (name, checked)
            checks = [line for line in text.splitlines() if "fence check after removal" in line]
            # (A fence deletion may wait for a quiet scheduler; anything else is a failure.)
            assert not [line for line in checks if "failed" in line and "waits" not in line], checks
        finally:
            rig.delete_all()
            api.delete(path_for(R, "resourceclaimtemplates", namespace, "tpl"))


def test_conflict_is_held_then_fenced_and_reallocated(
    api: AdminAPI, namespace: str, running: ControllerProcess
) -> None:
    """Force the double allocation the scheduler race produces and follow it through.

    ``theirs`` (not the controller's) gets the device ``ours`` holds, written with the
    admin API. The controller holds ``ours`` (annotated, unusable) instead of clearing
    it, so the scheduler's device set keeps the device: a pod wanting it stays
    unschedulable. Deleting ``theirs`` is a removal the scheduler applies although
    ``ours`` still holds the device: the controller fences it, then, with the scheduler
    quiet, gives ``ours`` back, deletes the fence and allocates ``ours`` again.
    """
    with Rig(api, namespace, devices=1) as rig:
        rig.template("tpl")
        try:
            rig.claim("ours")
            held = wait_until("ours allocated", lambda: rig.allocated("ours"), DEADLINE)
            allocation = held["status"]["allocation"]
            [result] = allocation["devices"]["results"]
            rig.claim("theirs", immediate=False)
            double = {
                "devices": {"results": [{**result, "request": "r"}]},
                "nodeSelector": allocation["nodeSelector"],
                "allocationTimestamp": allocation["allocationTimestamp"],
            }
            api.merge_patch(
                path_for(R, "resourceclaims", namespace, "theirs") + "/status",
                {"status": {"allocation": double}},
            )

            def holding() -> Obj | None:
                claim = rig.get_claim("ours") or {}
                annotations = claim["metadata"].get("annotations") or {}
                return claim if annotations.get(CONFLICT_ANNOTATION) else None

            ours = wait_until("ours held after the conflict", holding, DEADLINE)
            assert devices_of(ours) == devices_of(held)  # not cleared: no removal yet
            assert f"{namespace}/theirs" in ours["metadata"]["annotations"][CONFLICT_ANNOTATION]
            assert "held unused" in ours["metadata"]["annotations"][STATUS_ANNOTATION]

            # The scheduler still counts the device as allocated: a pod wanting it waits.
            rig.pod("wants", {"resourceClaimTemplateName": "tpl"})

            def unschedulable() -> bool:
                pod = api.get(path_for("v1", "pods", namespace, "wants"))
                return any(
                    c["type"] == "PodScheduled" and c["status"] == "False"
                    for c in pod.get("status", {}).get("conditions") or []
                )

            wait_until("pod judged unschedulable", unschedulable, DEADLINE)
            # No pod may race for the device from here on: then the outcome is certain.
            api.request(
                "DELETE", path_for("v1", "pods", namespace, "wants"), {"gracePeriodSeconds": 0}
            )
            wait_until(
                "pod gone",
                lambda: api.get_or_none(path_for("v1", "pods", namespace, "wants")) is None,
                DEADLINE,
            )
            for c in api.items(path_for(R, "resourceclaims", namespace)):
                if c["metadata"]["name"].startswith("wants-"):
                    api.delete(path_for(R, "resourceclaims", namespace, c["metadata"]["name"]))

            # theirs goes while ours holds the device: the device is fenced.
            api.delete(path_for(R, "resourceclaims", namespace, "theirs"))

            def fenced() -> Obj | None:
                found = [
                    f for f in fences_of(api, rig.driver) if f.get("status", {}).get("allocation")
                ]
                return found[0] if found else None

            fence_claim = wait_until("the device fenced", fenced, DEADLINE)
            meta = fence_claim["metadata"]
            assert meta["labels"] == {fence.FENCE_LABEL: "true"}
            assert meta["annotations"][fence.HOLDER_ANNOTATION] == f"{namespace}/ours"
            fence_allocation = fence_claim["status"]["allocation"]
            assert fence_allocation["devices"]["results"] == [
                {
                    "request": fence.REQUEST,
                    "driver": rig.driver,
                    "pool": result["pool"],
                    "device": result["device"],
                }
            ]
            assert fence_allocation["nodeSelector"] == allocation["nodeSelector"]
            assert not fence_claim["status"].get("reservedFor")

            def reallocated() -> Obj | None:
                claim = rig.allocated("ours")
                if claim is None or CONFLICT_ANNOTATION in (
                    claim["metadata"].get("annotations") or {}
                ):
                    return None
                return claim

            again = wait_until("ours allocated again", reallocated, DEADLINE)
            assert devices_of(again) == devices_of(held)
            assert again["status"]["allocation"]["allocationTimestamp"]
            wait_until("fence deleted", lambda: not fences_of(api, rig.driver), DEADLINE)
            events = rig.events("ours", "AllocationConflict")
            assert any("held unused" in e["message"] for e in events), events
        finally:
            rig.delete_all()
            api.delete(path_for(R, "resourceclaimtemplates", namespace, "tpl"))


HELD_DRIVER = "heldclaim.dradriver.dev"


@pytest.fixture
def held_plugin(api: AdminAPI, local_cluster: LocalCluster) -> Iterator[NodePlugin]:
    """dradriver's kubelet plugin on node-1 for a driver of its own, with one device."""
    work = Path("/tmp/dradriver-test-heldclaim")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(mode=0o700)
    config = work / "config.yaml"
    config.write_text(
        json.dumps(
            {
                "driverName": HELD_DRIVER,
                "sources": [
                    {
                        "static": {
                            "mockDir": str(work / "mock"),
                            "devices": [{"namePrefix": "dev", "count": 1}],
                        }
                    }
                ],
            }
        )
    )
    api.delete(path_for(R, "deviceclasses", name=HELD_DRIVER))
    api.create(
        path_for(R, "deviceclasses"),
        {
            "metadata": {"name": HELD_DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{HELD_DRIVER}"'}}]},
        },
    )
    plugin = start_node_plugin(local_cluster, api, config, work, node=NODE, driver=HELD_DRIVER)
    try:
        wait_for_slices(api, NODE, HELD_DRIVER, 1)
        yield plugin
    finally:
        plugin.stop()
        for s in node_slices(api, NODE, HELD_DRIVER):
            api.delete(path_for(R, "resourceslices", name=s["metadata"]["name"]))
        api.delete(path_for(R, "deviceclasses", name=HELD_DRIVER))
        shutil.rmtree(work, ignore_errors=True)


def test_the_node_plugin_refuses_to_prepare_a_held_claim(
    api: AdminAPI, namespace: str, running: ControllerProcess, held_plugin: NodePlugin
) -> None:
    """A claim held after a conflict is not usable: a pod that names it is scheduled (the
    scheduler does not read our annotation) but the node plugin refuses to prepare it,
    which the kubelet reports as the pod's FailedPrepareDynamicResources event naming the
    conflict. Once the other claim is gone, the hold is lifted and the pod runs."""
    claims = path_for(R, "resourceclaims", namespace)

    def claim(name: str, immediate: bool) -> None:
        meta: Obj = {"name": name}
        if immediate:
            meta["annotations"] = {ALLOCATION_ANNOTATION: "Immediate"}
        spec = {
            "devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": HELD_DRIVER}}]}
        }
        api.create(claims, {"metadata": meta, "spec": spec})

    def get(name: str) -> Obj:
        return api.get(path_for(R, "resourceclaims", namespace, name))

    def annotations(name: str) -> dict[str, str]:
        return get(name)["metadata"].get("annotations") or {}

    def pod_running() -> bool:
        pod = api.get_or_none(path_for("v1", "pods", namespace, "user")) or {}
        return bool((pod.get("status") or {}).get("phase") == "Running")

    def pod_events() -> list[Obj]:
        return api.items(
            path_for("v1", "events", namespace),
            fieldSelector="involvedObject.name=user,involvedObject.kind=Pod",
        )

    try:
        claim("ours", immediate=True)
        ours = wait_until(
            "ours allocated",
            lambda: (lambda c: c if devices_of(c) else None)(get("ours")),
            DEADLINE,
        )
        allocation = ours["status"]["allocation"]
        claim("theirs", immediate=False)
        api.merge_patch(
            path_for(R, "resourceclaims", namespace, "theirs") + "/status",
            {"status": {"allocation": allocation}},
        )
        wait_until("ours held", lambda: CONFLICT_ANNOTATION in annotations("ours"), DEADLINE)

        api.create(
            path_for("v1", "pods", namespace),
            {
                "metadata": {"name": "user"},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "resourceClaims": [{"name": "c", "resourceClaimName": "ours"}],
                    "containers": [
                        {
                            "name": "c",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "c"}]},
                        }
                    ],
                },
            },
        )

        def refused(times: int) -> Obj | None:
            for event in pod_events():
                failed = event["reason"] == "FailedPrepareDynamicResources"
                if failed and (event.get("count") or 1) >= times:
                    return event
            return None

        # One kubelet prepare retry after the Node authorizer's lag.
        event = wait_until("the pod's FailedPrepareDynamicResources", lambda: refused(1), 90)
        message = event["message"]
        assert "is held by dradriver-controller after an allocation conflict" in message, message
        assert f"also allocated to claim {namespace}/theirs" in message, message
        # The kubelet retries: refused again, the claim still held (a pod reserved it, but
        # the device is still shared: neither released nor lifted), not running.
        wait_until("refused again, or running", lambda: refused(2) or pod_running(), 90)
        assert not pod_running(), "the pod runs on a device another claim holds"
        held = get("ours")
        assert held["status"]["reservedFor"][0]["name"] == "user"
        assert devices_of(held) == devices_of(ours)
        assert CONFLICT_ANNOTATION in held["metadata"]["annotations"]  # still held

        # The other claim goes: the device is ours alone, the hold is lifted (the claim in
        # use keeps its allocation) and the kubelet's next retry prepares it.
        api.delete(path_for(R, "resourceclaims", namespace, "theirs"))
        wait_until("hold lifted", lambda: CONFLICT_ANNOTATION not in annotations("ours"), DEADLINE)
        assert devices_of(get("ours")) == devices_of(ours)
        wait_until("pod running", pod_running, 90)
    finally:
        api.request("DELETE", path_for("v1", "pods", namespace, "user"), {"gracePeriodSeconds": 0})
        for name in ("theirs", "ours"):
            api.delete(path_for(R, "resourceclaims", namespace, name))
        wait_until(
            "pod and claims gone",
            lambda: not api.items(path_for("v1", "pods", namespace)) and not api.items(claims),
            DEADLINE,
        )
        wait_until("fence deleted", lambda: not fences_of(api, HELD_DRIVER), DEADLINE)
