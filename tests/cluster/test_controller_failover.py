"""Controller allocation survives a leader crash: the standby finishes, nothing twice.

Two dradriver-controller replicas (leader election on a test-only Lease with short
timings) allocate immediate claims in the test's namespace. The leader is killed with
SIGKILL while it is working through them (some allocated, not all), so it neither
releases the Lease nor finishes in-flight work; a claim may be left with the finalizer
but no allocation. The standby takes over and allocates the rest: every claim ends
with exactly one allocation, the controller finalizer once, and no device twice.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.cluster.api import AdminAPI
from devtools.cluster.local import LocalCluster
from devtools.cluster.wait import wait_until
from devtools.harness.controller import NAMESPACE, ControllerProcess, controller_kubeconfig
from dradriver.api.wellknown import CONFLICT_ANNOTATION, FINALIZER, STATUS_ANNOTATION
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from tests.cluster.test_controller_allocation import DEADLINE, Rig, describe, devices_of

CLAIMS = 30
# Short Lease timings: the standby may take over LEASE seconds after the last renewal.
LEASE, RENEW, RETRY = 4.0, 3.0, 0.5
TAKEOVER = LEASE + 4 * RETRY + 10  # plus the apiserver's and the poll's latency


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dradriver-failover-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def holder(api: AdminAPI, lease_name: str) -> str | None:
    lease = api.get_or_none(path_for("coordination.k8s.io/v1", "leases", NAMESPACE, lease_name))
    value: str | None = ((lease or {}).get("spec") or {}).get("holderIdentity")
    return value


def claims(api: AdminAPI, namespace: str) -> list[Obj]:
    return api.items(path_for(RESOURCE_V1, "resourceclaims", namespace))


def allocated(api: AdminAPI, namespace: str) -> list[Obj]:
    return [c for c in claims(api, namespace) if (c.get("status") or {}).get("allocation")]


def without_controller_finalizer(api: AdminAPI, namespace: str) -> None:
    """Last resort when no replica is left to deallocate: let the namespace go."""
    for c in claims(api, namespace):
        kept = [f for f in c["metadata"].get("finalizers") or [] if f != FINALIZER]
        if kept != (c["metadata"].get("finalizers") or []):
            api.merge_patch(
                path_for(RESOURCE_V1, "resourceclaims", namespace, c["metadata"]["name"]),
                {"metadata": {"finalizers": kept or None}},
            )


def test_standby_finishes_allocating_after_the_leader_is_killed(
    api: AdminAPI,
    local_cluster: LocalCluster,
    namespace: str,
    unique_name: str,
    workdir: Path,
) -> None:
    kubeconfig = controller_kubeconfig(api, local_cluster, workdir)
    lease_name = f"failover-{unique_name}"
    common = [
        f"--allocation-namespace={namespace}",
        f"--lease-duration={LEASE}",
        f"--renew-deadline={RENEW}",
        f"--retry-period={RETRY}",
    ]
    # One worker in the leader: it allocates one claim after the other, so the kill
    # reliably lands while it is busy.
    leader = ControllerProcess(
        "leader", kubeconfig, workdir, lease_name, [*common, "--workers=1", "--claim-workers=1"]
    )
    standby = ControllerProcess("standby", kubeconfig, workdir, lease_name, common)
    # As many devices as claims: a device given twice leaves a claim unallocatable.
    with Rig(api, namespace, devices=CLAIMS) as rig:
        try:
            leader.start()
            wait_until("leader leads", lambda: holder(api, lease_name) == "leader", DEADLINE)
            standby.start()
            wait_until("both ready", lambda: leader.ready() and standby.ready(), DEADLINE)

            for i in range(CLAIMS):
                rig.claim(f"c-{i:02d}")

            def midway() -> int:
                done = len(allocated(api, namespace))
                return done if 0 < done < CLAIMS else 0

            at_kill = wait_until("some claims allocated, not all", midway, DEADLINE, 0.02)
            leader.kill()
            after_kill = len(allocated(api, namespace))
            assert after_kill < CLAIMS, "the leader finished before it was killed"

            wait_until("standby leads", lambda: holder(api, lease_name) == "standby", TAKEOVER)

            def all_allocated() -> list[Obj] | None:
                current = claims(api, namespace)
                if len(current) == CLAIMS and all(devices_of(c) for c in current):
                    return current
                return None

            try:
                final = wait_until("every claim allocated", all_allocated, DEADLINE)
            except TimeoutError:
                print(describe(api, namespace))
                raise

            # Exactly once: one device per claim, no device in two claims, our finalizer once.
            held = Counter(d for c in final for d in devices_of(c))
            assert all(n == 1 for n in held.values()), held
            assert len(held) == CLAIMS
            for c in final:
                name = c["metadata"]["name"]
                assert len(c["status"]["allocation"]["devices"]["results"]) == 1, name
                assert c["metadata"]["finalizers"].count(FINALIZER) == 1, name
                annotations = c["metadata"].get("annotations") or {}
                assert STATUS_ANNOTATION not in annotations, (name, annotations)
            # The standby did the rest, and no claim was allocated by both: the leader logs
            # each allocation once its write returned (one worker: at most one write was
            # in flight when it died, which may have landed unlogged).
            by_leader = leader.log_path.read_text().count('msg="claim allocated"')
            by_standby = standby.log_path.read_text().count('msg="claim allocated"')
            print(
                f"allocated when the leader was killed: {at_kill} seen, {after_kill} after; "
                f"by the leader: {by_leader}, by the standby: {by_standby}"
            )
            assert by_standby >= 1
            assert CLAIMS - 1 <= by_leader + by_standby <= CLAIMS, (by_leader, by_standby)

            # The same in the API: each replica posts an Allocated event per allocation it
            # wrote, so a claim allocated by both would have two (the write in flight at
            # the kill may have landed without its event). And no conflict: neither
            # replica ever found a device of its claims held by another claim.
            def events() -> list[Obj]:
                return api.items(path_for("v1", "events", namespace))

            def allocated_events() -> Counter[str] | None:
                found = Counter(
                    e["involvedObject"]["name"] for e in events() if e["reason"] == "Allocated"
                )
                return found if sum(found.values()) >= CLAIMS - 1 else None

            per_claim = wait_until("Allocated events", allocated_events, DEADLINE)
            assert all(n == 1 for n in per_claim.values()), per_claim
            conflicts = [e["message"] for e in events() if e["reason"] == "AllocationConflict"]
            assert not conflicts, conflicts
            assert not any(
                CONFLICT_ANNOTATION in (c["metadata"].get("annotations") or {}) for c in final
            )

            rig.delete_all()  # the standby deallocates and removes its finalizer
        finally:
            leader.kill()
            if standby.process is not None and standby.process.alive():
                rig.delete_all()
            standby.stop()
            without_controller_finalizer(api, namespace)
            api.delete(path_for("coordination.k8s.io/v1", "leases", NAMESPACE, lease_name))
