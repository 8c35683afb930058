"""Torture: immediate claims and pods' claims competing for a small pool, while the apiserver
stops, kube-scheduler restarts and the controller's leader is killed; devices in two
allocations counted as they happen.

``python -m bench.torture [--rounds N] [--seed S] [--outage-min S] [--outage-max S]
[--observe S] [--observe-outage S] [--scheduler-catchup S] [--controller-tree DIR]``

An isolated cluster of its own (free ports, a temporary state dir; kube-apiserver,
kube-controller-manager with the resourceclaim controller, kube-scheduler), two Nodes without
kubelets, each with a real dradriver node plugin that publishes ``--devices`` devices and
that this bench drives as the kubelet would (:class:`bench.torture_checks.KubeletPlay`), and
two dradriver-controller replicas, leader-elected. Each round:

1. wave 1: immediate claims and pods with template claims, about half the pool;
2. at a seeded random point, one fault (the kinds take turns in a seeded order): the apiserver
   stopped for a seeded ``--outage-min``..``--outage-max`` seconds; kube-scheduler stopped
   and started again; the leading controller replica killed (``kill -9``), started again
   once the standby leads (the Lease expired);
3. wave 2, once the fault is over: pods first (template claims and claims this bench creates
   for them), immediate claims a few seconds later (one of them used by a pod), so demand
   exceeds what is left of the pool and both allocators want the same devices;
4. ``--observe`` seconds (``--observe-outage`` after an outage, long enough for the
   scheduler's informers to come back), then every pod and claim is deleted.

A watch-based checker (:class:`bench.torture_checks.DoubleChecker`) counts every moment one
exclusive device is in two claims' allocations, and how long each lasted. Nothing is
asserted; the table is the result. ``--controller-tree`` runs the controllers from another
source tree (e.g. main's, for a before/after comparison).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import PluginUnderTest, ours_plugin, table, wait_published
from bench.controller_allocation import isolated_layout, now_micro, serving
from bench.torture_checks import DoubleChecker, KubeletPlay
from devtools.cluster.api import AdminAPI
from devtools.cluster.local import LocalCluster, running_cluster
from devtools.cluster.wait import wait_until
from devtools.harness.controller import NAMESPACE, ControllerProcess, controller_kubeconfig
from dradriver.api.wellknown import ALLOCATION_ANNOTATION
from dradriver.k8s.client import KubeClient, load_connection
from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.runtime import Informer
from dradriver.runtime.ratelimit import Backoff

SMOKE_ARGS = (
    *("--rounds", "4", "--outage-min", "3", "--outage-max", "4"),  # every kind of fault
    *("--observe", "4", "--observe-outage", "6"),
)
CLUSTER = "own"

DRIVER = "dradriver.dev"
NODES = ("torture-1", "torture-2")
TEMPLATE = "one-device"
LEASE = "dradriver-controller"
KINDS = ("outage", "scheduler", "outage", "leader")
R = RESOURCE_V1


@dataclass
class Settings:
    rounds: int = 8
    seed: int = 1
    devices: int = 3  # per node
    outage_min: float = 20.0
    outage_max: float = 40.0
    observe: float = 25.0
    observe_outage: float = 75.0
    scheduler_catchup: float | None = None
    controller_tree: Path | None = None
    kinds: tuple[str, ...] = ()  # the faults in this order (default: KINDS in a seeded order)


@dataclass
class RoundResult:
    kind: str
    fault_seconds: float
    immediate: int = 0
    immediate_allocated: int = 0
    pod_claims: int = 0
    pod_claims_allocated: int = 0


@dataclass
class Outcome:
    rounds: list[RoundResult] = field(default_factory=list)
    doubles: int = 0
    longest: float = 0.0
    doubles_prepared: int = 0
    prepares: int = 0
    refused: int = 0
    versions: int = 0
    catchups: Counter[str] = field(default_factory=Counter)
    double_lines: list[str] = field(default_factory=list)


# --- cluster objects -------------------------------------------------------------------


def create_nodes(api: AdminAPI) -> None:
    """Ready Nodes without kubelets (room for 100 pods each), with their Leases."""
    room = {"cpu": "1000", "memory": "1000Gi", "pods": "100"}
    for name in NODES:
        api.create("/api/v1/nodes", {"metadata": {"name": name}})
        stamp = now_micro()[:19] + "Z"
        status = {
            "capacity": room,
            "allocatable": room,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "torture node without a kubelet",
                    "lastHeartbeatTime": stamp,
                    "lastTransitionTime": stamp,
                }
            ],
        }
        # A merge patch: the node lifecycle controller writes the Node meanwhile.
        api.merge_patch(path_for("v1", "nodes", name=name) + "/status", {"status": status})
        api.create(
            path_for("coordination.k8s.io/v1", "leases", "kube-node-lease"),
            {
                "metadata": {"name": name},
                "spec": {
                    "holderIdentity": name,
                    "leaseDurationSeconds": 40,
                    "renewTime": now_micro(),
                },
            },
        )


def renew_node_leases(api: AdminAPI, stop: threading.Event) -> None:
    """The kubelets' heartbeat (it fails while the apiserver is down, as theirs would)."""
    while not stop.wait(5.0):
        for name in NODES:
            with contextlib.suppress(Exception):
                api.merge_patch(
                    path_for("coordination.k8s.io/v1", "leases", "kube-node-lease", name),
                    {"spec": {"renewTime": now_micro()}},
                )


def claim_spec() -> Obj:
    return {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": DRIVER}}]}}


def immediate_claim(name: str) -> Obj:
    return {
        "metadata": {"name": name, "annotations": {ALLOCATION_ANNOTATION: "Immediate"}},
        "spec": claim_spec(),
    }


def pod(name: str, template: bool, claim: str = "") -> Obj:
    ref: Obj = {"name": "r"}
    if template:
        ref["resourceClaimTemplateName"] = TEMPLATE
    else:
        ref["resourceClaimName"] = claim
    return {
        "metadata": {"name": name},
        "spec": {
            "resourceClaims": [ref],
            "containers": [
                {
                    "name": "c",
                    "image": "torture.invalid/none",
                    "resources": {"claims": [{"name": "r"}]},
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


# --- one round -------------------------------------------------------------------------


@dataclass
class Run:
    s: Settings
    api: AdminAPI
    cluster: LocalCluster
    namespace: str
    controllers: dict[str, ControllerProcess]
    rng: random.Random
    claims: Informer
    counts: Counter[str] = field(default_factory=Counter)

    def create(self, resource: str, obj: Obj) -> None:
        """Create ``obj``, retried while an apiserver that just came back refuses it."""
        path = path_for("v1" if resource == "pods" else R, resource, self.namespace)

        def attempt() -> bool:
            try:
                self.api.create(path, obj)
            except KubeAPIError as e:
                if e.status != 409:  # 409: an earlier attempt got through
                    raise
            return True

        wait_until(
            f"{resource} {obj['metadata']['name']} created", attempt, 60, ignore=(Exception,)
        )

    async def wave(self, r: int, w: int, immediate: int, template_pods: int, own_pods: int) -> None:
        """Pods first (their claims), immediate claims a little later (see the docstring)."""
        prefix = f"r{r}w{w}"
        for i in range(template_pods):
            await asyncio.to_thread(self.create, "pods", pod(f"{prefix}-t{i}", True))
        for i in range(own_pods):
            await asyncio.to_thread(
                self.create,
                "resourceclaims",
                {"metadata": {"name": f"{prefix}-c{i}"}, "spec": claim_spec()},
            )
            await asyncio.to_thread(
                self.create, "pods", pod(f"{prefix}-n{i}", False, f"{prefix}-c{i}")
            )
        if w == 2:
            await asyncio.sleep(self.rng.uniform(1.0, 5.0))  # the seeded gap between the two
        for i in range(immediate):
            await asyncio.to_thread(
                self.create, "resourceclaims", immediate_claim(f"{prefix}-i{i}")
            )
        if immediate and w == 2:
            await asyncio.to_thread(self.create, "pods", pod(f"{prefix}-u0", False, f"{prefix}-i0"))

    async def fault(self, kind: str) -> float:
        """Inject one fault; returns how long it lasted (seconds)."""
        began = time.monotonic()
        self.counts[kind] += 1
        if kind == "outage":
            down = self.rng.uniform(self.s.outage_min, self.s.outage_max)

            def outage() -> None:
                time.sleep(down)  # the outage itself: its length is the fault's parameter

            await asyncio.to_thread(self.cluster.restart_component, "kube-apiserver", 120, outage)
            await asyncio.to_thread(
                wait_until, "the apiserver answering", lambda: serving(self.api), 120
            )
        elif kind == "scheduler":
            down = self.rng.uniform(1.0, 5.0)
            await asyncio.to_thread(
                self.cluster.restart_component, "kube-scheduler", 60, lambda: time.sleep(down)
            )
        else:
            victim = self.controllers.get(await asyncio.to_thread(self.leader))
            if victim is None:
                self.counts[kind] -= 1
                self.counts["leader (no leader to kill)"] += 1
            else:
                victim.kill()  # kill -9: the Lease is not released
                # A restarted process has a new identity (hostname_random): the standby
                # takes over once the Lease expires; the victim comes back as the standby.
                gone = victim.name
                await asyncio.to_thread(
                    wait_until, "the standby leading", lambda: self.leader() not in ("", gone), 90
                )
                victim.start()
        return time.monotonic() - began

    async def round(self, r: int, kind: str) -> RoundResult:
        await self.wave(r, 1, immediate=1, template_pods=1, own_pods=1)
        await asyncio.sleep(self.rng.uniform(1.0, 6.0))  # the seeded fault point
        result = RoundResult(kind, await self.fault(kind))
        await self.wave(r, 2, immediate=2, template_pods=2, own_pods=1)
        await asyncio.sleep(self.s.observe_outage if kind == "outage" else self.s.observe)
        self.tally(result)
        await asyncio.to_thread(self.cleanup)
        return result

    def leader(self) -> str:
        lease = self.api.get_or_none(path_for("coordination.k8s.io/v1", "leases", NAMESPACE, LEASE))
        return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")

    def tally(self, result: RoundResult) -> None:
        for c in self.claims.items():
            allocated = bool((c.get("status") or {}).get("allocation"))
            if ALLOCATION_ANNOTATION in (c["metadata"].get("annotations") or {}):
                result.immediate += 1
                result.immediate_allocated += allocated
            else:
                result.pod_claims += 1
                result.pod_claims_allocated += allocated

    def cleanup(self) -> None:
        pods = path_for("v1", "pods", self.namespace)
        claims = path_for(R, "resourceclaims", self.namespace)
        self.api.request("DELETE", pods, params={"gracePeriodSeconds": 0})
        wait_until("pods deleted", lambda: not self.api.items(pods, limit=1), 120)
        self.api.request("DELETE", claims)
        try:
            wait_until("claims deleted", lambda: not self.api.items(claims, limit=1), 150)
        except TimeoutError:
            self.counts["claims left over after a round"] += len(self.api.items(claims))


# --- the whole run ---------------------------------------------------------------------


@contextlib.contextmanager
def controller_tree(tree: Path | None) -> Iterator[None]:
    """Start the controllers from ``tree`` (PYTHONPATH for their processes) if given."""
    if tree is None:
        yield
        return
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(tree)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


def start_controllers(
    s: Settings, kubeconfig: Path, work: Path, namespace: str
) -> dict[str, ControllerProcess]:
    args = [f"--allocation-namespace={namespace}", "--log-level=info"]
    if s.scheduler_catchup is not None:
        args.append(f"--scheduler-catchup={s.scheduler_catchup:g}")
    controllers = {n: ControllerProcess(n, kubeconfig, work, extra_args=args) for n in ("a", "b")}
    for c in controllers.values():
        c.start()
    return controllers


async def plugins_up(
    api: AdminAPI, work: Path, kubeconfig: Path, s: Settings
) -> list[PluginUnderTest]:
    plugins = [
        ours_plugin(work / "p", DRIVER, node, s.devices, kubeconfig, label=f"n{i}")
        for i, node in enumerate(NODES)
    ]
    for p in plugins:
        p.start()
    for p in plugins:
        await p.register()
        if not await asyncio.to_thread(wait_published, api, p, s.devices, 60):
            raise RuntimeError(f"{p.label}: slices not published")
    return plugins


async def run_rounds(
    s: Settings, cluster: LocalCluster, api: AdminAPI, kubeconfig: Path, work: Path
) -> Outcome:
    namespace = f"torture-{uuid.uuid4().hex[:6]}"
    api.create_namespace(namespace)
    api.apply(
        path_for(R, "deviceclasses", name=DRIVER),
        {
            "apiVersion": R,
            "kind": "DeviceClass",
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        },
        "bench-torture",
    )
    api.create(
        path_for(R, "resourceclaimtemplates", namespace),
        {"metadata": {"name": TEMPLATE}, "spec": {"spec": claim_spec()}},
    )
    create_nodes(api)
    stop_leases = threading.Event()
    leases = threading.Thread(target=renew_node_leases, args=(api, stop_leases), daemon=True)
    leases.start()
    client = KubeClient(load_connection(str(kubeconfig)), "bench-torture")
    fast = Backoff(base=0.2, cap=1.0)
    claims = Informer(client, path_for(R, "resourceclaims", namespace), name="claims", backoff=fast)
    pods = Informer(
        client, path_for("v1", "pods", namespace), name="pods", backoff=Backoff(base=0.2, cap=1.0)
    )
    checker = DoubleChecker()
    checker.attach(claims)
    claims.start()
    pods.start()
    plugins = await plugins_up(api, work, kubeconfig, s)
    kubelets = [KubeletPlay(p, pods, claims, namespace) for p in plugins]
    stop = asyncio.Event()
    playing = [asyncio.create_task(k.run(stop)) for k in kubelets]
    with controller_tree(s.controller_tree):
        controllers = start_controllers(
            s, controller_kubeconfig(api, cluster, work), work, namespace
        )
    outcome = Outcome()
    try:
        await asyncio.to_thread(
            wait_until,
            "a controller ready",
            lambda: any(c.ready() for c in controllers.values()),
            90,
        )
        rng = random.Random(s.seed)
        kinds = list(s.kinds) or [KINDS[i % len(KINDS)] for i in range(s.rounds)]
        if not s.kinds:
            rng.shuffle(kinds)
        runner = Run(s, api, cluster, namespace, controllers, rng, claims)
        for r, kind in enumerate(kinds):
            began = time.monotonic()
            with controller_tree(s.controller_tree):  # a killed leader starts from the same tree
                result = await runner.round(r, kind)
            outcome.rounds.append(result)
            print(
                f"round {r} ({kind}, fault {result.fault_seconds:.0f}s): "
                f"{time.monotonic() - began:.0f}s, doubles so far {len(checker.doubles)}",
                file=sys.stderr,
                flush=True,
            )
        outcome.catchups = runner.counts
    finally:
        stop.set()
        await asyncio.gather(*playing, return_exceptions=True)
        stop_leases.set()
        for c in controllers.values():
            c.stop()
        for p in plugins:
            p.stop()
        await claims.stop()
        await pods.stop()
        await client.aclose()
    outcome.doubles = len(checker.doubles)
    outcome.longest = checker.longest()
    outcome.versions = checker.versions
    now = time.monotonic()
    outcome.double_lines = [
        f"{'/'.join(d.device)}: {', '.join(sorted(d.claims))} for {d.seconds(now):.1f}s"
        for d in checker.doubles
    ]
    outcome.doubles_prepared = sum(k.doubles_prepared for k in kubelets)
    outcome.prepares = sum(k.prepares for k in kubelets)
    outcome.refused = sum(k.refused for k in kubelets)
    logs = "".join(
        c.log_path.read_text(errors="replace") for c in controllers.values() if c.log_path.exists()
    )
    outcome.catchups["catch-up ended by evidence"] += logs.count("kube-scheduler has caught up")
    outcome.catchups["catch-up periods started"] += logs.count("watch gap: kube-scheduler")
    return outcome


def report(s: Settings, outcome: Outcome, seconds: float) -> str:
    faults = Counter(r.kind for r in outcome.rounds)
    rounds = outcome.rounds
    immediate = f"{sum(r.immediate_allocated for r in rounds)}/{sum(r.immediate for r in rounds)}"
    pods = f"{sum(r.pod_claims_allocated for r in rounds)}/{sum(r.pod_claims for r in rounds)}"
    summary = [
        ["rounds", str(len(outcome.rounds))],
        ["faults: apiserver outages", str(faults["outage"])],
        ["faults: kube-scheduler restarts", str(faults["scheduler"])],
        ["faults: controller leader kills", str(faults["leader"])],
        ["doubles seen in the API", str(outcome.doubles)],
        ["doubles prepared", str(outcome.doubles_prepared)],
        ["longest double (s)", f"{outcome.longest:.1f}"],
        ["claim versions checked", str(outcome.versions)],
        ["prepares (refused claims)", f"{outcome.prepares} ({outcome.refused})"],
        ["immediate claims allocated at round end", immediate],
        ["pods' claims allocated at round end", pods],
        *([k, str(v)] for k, v in sorted(outcome.catchups.items()) if k not in faults),
        ["run time (s)", f"{seconds:.0f}"],
    ]
    catchup = "default" if s.scheduler_catchup is None else f"{s.scheduler_catchup:g}s"
    head = (
        f"Torture (seed {s.seed}): {len(NODES)} nodes x {s.devices} devices, per round 3 claims "
        f"before the fault and 5 after it; outages {s.outage_min:g}-{s.outage_max:g}s, observed "
        f"{s.observe_outage:g}s after an outage and {s.observe:g}s after other faults; "
        f"--scheduler-catchup {catchup}; controllers from {s.controller_tree or 'this tree'}\n"
    )
    lines = "\n".join(f"  double: {line}" for line in outcome.double_lines[:20])
    return head + "\n" + table(["metric", "value"], summary) + ("\n" + lines if lines else "")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--devices", type=int, default=3, help="devices per node (2 nodes)")
    parser.add_argument("--outage-min", type=float, default=20.0)
    parser.add_argument("--outage-max", type=float, default=40.0)
    parser.add_argument("--observe", type=float, default=25.0)
    parser.add_argument("--observe-outage", type=float, default=75.0)
    parser.add_argument("--scheduler-catchup", type=float, help="passed to the controllers")
    parser.add_argument("--controller-tree", type=Path, help="run the controllers from here")
    args = parser.parse_args(argv)
    s = Settings(
        rounds=args.rounds,
        seed=args.seed,
        devices=args.devices,
        outage_min=args.outage_min,
        outage_max=max(args.outage_min, args.outage_max),
        observe=args.observe,
        observe_outage=args.observe_outage if args.observe_outage is not None else args.observe,
        scheduler_catchup=args.scheduler_catchup,
        controller_tree=args.controller_tree,
    )
    if s.rounds < 1 or s.devices < 1 or s.outage_min < 0:
        parser.error("--rounds and --devices must be positive, --outage-min not negative")
    work = Path(tempfile.mkdtemp(prefix="drt-", dir="/tmp"))
    began = time.monotonic()
    try:
        layout = isolated_layout(work)
        print(f"starting an isolated cluster (state {layout.state_dir})", file=sys.stderr)
        with running_cluster(layout) as (cluster, state, _), cluster.api() as api:
            outcome = asyncio.run(run_rounds(s, cluster, api, Path(state.kubeconfig), work))
    finally:
        if os.environ.get("DRADRIVER_BENCH_KEEP") is None:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}", file=sys.stderr)
    print(report(s, outcome, time.monotonic() - began))


if __name__ == "__main__":
    main()
