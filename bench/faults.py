"""The fault suite: crashes, API errors, a damaged ledger, an apiserver outage, hostile claims.

Run with ``python -m bench.faults [--quick] [--prepares N] [--kills N] [--outage S] ...``.
It starts an isolated local cluster of its own (a temporary state dir, free ports, no
kubelet: the suite plays the kubelet itself), so no fault reaches the shared cluster the
tests use, and stops it at the end. Every part is the real one (plugin and controller
processes, gRPC over unix sockets, ledger and CDI files on disk, the apiserver), except the
claim-GET errors of row (b), which a real apiserver cannot be made to answer on demand
(:mod:`bench.faultproxy`).

Rows, printed as one table (fault, runs, metric, value, promised); nothing is asserted:

(a) ``kill -9`` of the plugin at random points (seeded) during ``--prepares`` prepares (every
    second claim also unprepared, as when its pod ends): after each kill the plugin is
    started again and the kubelet's call retried; at the end one more restart and start-up
    reconcile, then the ledger and the CDI dir are compared with what the kubelet believes.
(b) the apiserver answering 503, then 403, to the plugin's claim GETs while it starts with
    prepared claims in its ledger: how many of them the start-up reconcile tore down.
(c) the ledger bit-flipped, truncated, deleted, or replaced by a dangling symlink while a DRA
    claim holds one device and the device-plugin shim (shared mode) another, then a restart:
    how many devices the other API then hands out a second time.
(d) the apiserver stopped for ``--outage`` seconds while the controller allocates immediate
    claims: claims never allocated after it returns, devices allocated to two claims.
(f0) the apiserver stopped for ``--outage`` seconds while pods' claims and immediate claims
    compete for a small pool (:mod:`bench.fault_outage_race`, one :mod:`bench.torture` round):
    devices in two allocations in the API, devices prepared for two claims.
(e) one hostile object of each kind (an RE2-backtracking regex and a CEL cost bomb in claim
    selectors, a cost bomb in DeviceClaimParameters, an unsatisfiable ``distinctAttribute``
    count): the worst review latency of the controller-served webhook while each is being
    processed (its own review, and benign reviews sent all along), and how many claims of
    another driver the apiserver admitted meanwhile.
(f1) immediate claims of another driver's class: what the controller did to them
    (:mod:`bench.fault_scope`).
(f3) a claim nested too deep to decode across a controller restart (bench/fault_unreadable.py).
(f2) unsatisfiable claims in one namespace against another namespace's claim
    (:mod:`bench.fault_fairness`).
(f4), (f5), (f6) the controller-served webhook against a huge POST, parallel big reviews and a
    certificate swap (:mod:`bench.fault_webhook`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import ssl
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import yaml

from bench import fault_fairness
from bench.common import (
    BenchClaim,
    BenchError,
    DRAClient,
    PluginUnderTest,
    allocated_claim,
    delete_slices,
    free_port,
    ours_plugin,
    table,
)
from bench.controller_allocation import isolated_layout
from bench.fault_outage_race import FAULT, outage_race
from bench.fault_scope import other_driver_claims
from bench.fault_unreadable import too_deep_claim
from bench.fault_webhook import controller_rows as webhook_rows
from bench.faultproxy import ClaimFaultProxy
from devtools.cluster.api import AdminAPI
from devtools.cluster.local import LocalCluster, running_cluster
from devtools.cluster.wait import wait_until
from devtools.harness.controller import (
    ControllerProcess,
    controller_kubeconfig,
    register_webhook,
    unregister_webhook,
    webhook_tls,
)
from dradriver.api import parameters as params
from dradriver.api.wellknown import ALLOCATION_ANNOTATION, STATUS_ANNOTATION
from dradriver.deviceplugin.endpoints import socket_name
from dradriver.host.cdi import CDIRegistry
from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.http import TransportError
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.kubeletapi.gen import deviceplugin_v1beta1_pb2 as dp
from dradriver.kubeletapi.gen import deviceplugin_v1beta1_pb2_grpc as dp_grpc

SMOKE_ARGS = ("--quick",)
CLUSTER = "own"  # an isolated cluster of its own (bench/__init__.py)
OWN_SMOKE_TEST = "tests/isolated/test_bench_faults.py"  # checks the zeros too

DRIVER = "dradriver.dev"  # the cluster is the suite's own: the CRDs' group is this name
OTHER_CLASS = "gpu.other-vendor.example.com"
POOL = "faults"
SHIM_RESOURCE = f"{DRIVER}/mock"
START_TIMEOUT = 90.0
SETTLE_TIMEOUT = 180.0
LATENCY_PROMISE = 1.0  # seconds: the worst review latency the issue promises
PROBE_PACE = 0.05  # seconds between benign reviews (pacing, not synchronisation)
OTHER_PACE = 0.2  # seconds between claims of the other driver
BACKTRACKING = "a" * 40 + "!"  # exponential for a backtracking engine, linear for RE2
DISTINCT_VALUES = 16
R = RESOURCE_V1


@dataclass
class Row:
    fault: str
    runs: int
    metric: str
    value: str
    promised: str

    def cells(self) -> list[str]:
        return [self.fault, str(self.runs), self.metric, self.value, self.promised]


@dataclass
class Settings:
    prepares: int = 100
    kills: int = 20
    start_claims: int = 10
    outage: float = 60.0
    outage_claims: int = 40
    seed: int = 1
    # The controller's allocation budget (--allocation-timeout); None: its default (10 s,
    # the scheduler's per node). A smoke run shortens the distinctAttribute search with it.
    allocation_timeout: float | None = None
    quick: bool = False  # rows (f4)-(f6) (bench.fault_webhook) at smoke sizes


# --------------------------------------------------------------------------------------------
# The node's state as the plugin left it on disk
# --------------------------------------------------------------------------------------------


def ledger_path(plugin: PluginUnderTest) -> Path:
    return plugin.workdir / "state" / "ledger.json"


def cdi_dir(plugin: PluginUnderTest) -> Path:
    return plugin.workdir / "cdi"


def ledger_data(plugin: PluginUnderTest) -> Obj:
    """The ``data`` of the ledger (the plugin has just rewritten it after its start-up)."""
    path = ledger_path(plugin)
    if not path.exists():
        return {"claims": [], "plugin_holds": []}
    data: Obj = json.loads(path.read_text())["data"]
    return data


def prepared_claims(data: Obj) -> dict[str, list[str]]:
    """uid -> devices of every claim the ledger has in state ``prepared``."""
    return {
        c["uid"]: [d["device"] for d in c.get("devices", [])]
        for c in data.get("claims", [])
        if c.get("state") == "prepared"
    }


def holders_per_device(data: Obj) -> Counter[str]:
    """How many holders (claims in any state, device-plugin holds) each device has."""
    count: Counter[str] = Counter()
    for c in data.get("claims", []):
        for d in c.get("devices", []):
            if not d.get("admin_access") and d.get("share_id") is None:
                count[d["device"]] += 1
    for h in data.get("plugin_holds", []):
        for d in h.get("devices", []):
            count[d["device"]] += 1
    return count


def spec_uids(plugin: PluginUnderTest) -> set[str]:
    return set(CDIRegistry(cdi_dir(plugin), DRIVER).claim_uids_on_disk())


def kill(plugin: PluginUnderTest) -> None:
    """SIGKILL, the crash the ledger must survive."""
    if plugin.process is not None:
        plugin.process.kill()
    plugin.process = None


async def start(plugin: PluginUnderTest) -> None:
    """Start the plugin and register it as the kubelet does; returns once it serves (its
    start-up reconcile runs before it creates the registration socket)."""
    plugin.start()
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            await plugin.register(START_TIMEOUT)
            return
        except grpc.aio.AioRpcError:
            # The socket file of the killed process, or the new one bound but not yet
            # listening: the kubelet's plugin watcher retries too.
            plugin.check_alive()
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def claims_for(
    api: AdminAPI, namespace: str, plugin: PluginUnderTest, prefix: str, devices: list[int]
) -> list[BenchClaim]:
    return [
        allocated_claim(
            api,
            namespace,
            f"{prefix}-{n}",
            plugin.driver,
            plugin.pool,
            plugin.device(i),
            plugin.node,
        )
        for n, i in enumerate(devices)
    ]


# --------------------------------------------------------------------------------------------
# (a) kill -9 during prepares
# --------------------------------------------------------------------------------------------

RETRIES = 5
RETRY_BACKOFF = 0.2  # seconds, growing linearly


async def kill_during_prepares(
    api: AdminAPI, namespace: str, work: Path, kubeconfig: Path, s: Settings
) -> list[Row]:
    rng = random.Random(s.seed)
    plugin = ours_plugin(work / "kill9", DRIVER, "fault-kill9", s.prepares, kubeconfig)
    plugin.workdir.mkdir(parents=True, exist_ok=True)
    await start(plugin)
    claims = claims_for(api, namespace, plugin, "kill9", list(range(s.prepares)))
    ops: list[tuple[str, BenchClaim]] = []
    for i, claim in enumerate(claims):
        ops.append(("prepare", claim))
        if i % 2:
            ops.append(("unprepare", claim))
    kill_at = set(rng.sample(range(len(ops)), min(s.kills, len(ops))))
    latencies: list[float] = []
    failed = 0
    kills = 0
    mid_call = 0  # kills that interrupted the call (the others fell just after it)
    client = DRAClient(plugin.dra_socket)
    try:
        for k, (op, claim) in enumerate(ops):
            if k in kill_at:
                call = client.prepare if op == "prepare" else client.unprepare
                in_flight = asyncio.create_task(call([claim]))
                typical = statistics.median(latencies) if latencies else 0.02
                # The random point of the crash within the call (the fault, not a wait).
                await asyncio.sleep(rng.uniform(0, 2 * typical))
                kill(plugin)
                kills += 1
                try:
                    await in_flight
                except (grpc.aio.AioRpcError, BenchError):
                    mid_call += 1
                await client.close()
                await start(plugin)
                client = DRAClient(plugin.dra_socket)
            for attempt in range(RETRIES):  # the kubelet retries a failed call
                call = client.prepare if op == "prepare" else client.unprepare
                try:
                    latencies.append(await call([claim]))
                    break
                except (grpc.aio.AioRpcError, BenchError):
                    if attempt == RETRIES - 1:
                        failed += 1
                    else:  # the kubelet's backoff between retries (its behaviour, not a wait)
                        await asyncio.sleep(RETRY_BACKOFF * (attempt + 1))
        await client.close()
        kill(plugin)
        await start(plugin)  # the last restart: its reconcile is what is counted
        data = ledger_data(plugin)
        specs = spec_uids(plugin)
    finally:
        plugin.stop()
        delete_slices(api, plugin.node, plugin.driver)
    unprepared = {c.uid for op, c in ops if op == "unprepare"}
    expected = {c.uid for c in claims} - unprepared
    held = prepared_claims(data)
    leaked = sum(len(devices) for uid, devices in held.items() if uid not in expected)
    leaked += sum(
        len(c.get("devices", []))
        for c in data.get("claims", [])
        if c.get("state") != "prepared" and c["uid"] not in expected
    )
    doubled = sum(1 for n in holders_per_device(data).values() if n > 1)
    orphans = len(specs - expected)
    lost = len({u for u in expected if u not in held or u not in specs})
    fault = "(a) kill -9 during prepares"
    runs = f"{kills} kills, {mid_call} mid-call, {len(ops)} calls"
    return [
        Row(fault, kills, f"leaked devices ({runs})", str(leaked), "0"),
        Row(fault, kills, "doubled devices", str(doubled), "0"),
        Row(fault, kills, "orphan CDI specs", str(orphans), "0"),
        Row(fault, kills, "prepared claims lost (hold or spec)", str(lost), "0"),
        Row(fault, kills, "kubelet calls failing after 5 retries", str(failed), "0"),
    ]


# --------------------------------------------------------------------------------------------
# (b) 5xx and 403 for the claim GET at plugin start
# --------------------------------------------------------------------------------------------


async def api_errors_at_start(
    api: AdminAPI, namespace: str, work: Path, kubeconfig: Path, cluster: LocalCluster, s: Settings
) -> list[Row]:
    rows = []
    node = "fault-api"
    plugin = ours_plugin(work / node, DRIVER, node, s.start_claims, kubeconfig)
    proxy = ClaimFaultProxy(cluster.layout.apiserver_url, cluster.layout.pki, free_port())
    proxy.start()
    try:
        faulty = proxy.kubeconfig(work / f"{node}.kubeconfig", cluster.layout.pki / "ca.crt")
        plugin.argv = [
            f"--kubeconfig={faulty}" if a.startswith("--kubeconfig=") else a for a in plugin.argv
        ]
        await start(plugin)
        claims = claims_for(api, namespace, plugin, node, list(range(s.start_claims)))
        for status in (503, 403):
            # Prepared (again, if the last round tore them down) with no fault injected.
            client = DRAClient(plugin.dra_socket)
            try:
                await client.prepare(claims)
            finally:
                await client.close()
            kill(plugin)
            with proxy_fault(proxy, status):
                await start(plugin)
                await asyncio.to_thread(
                    wait_until,
                    f"the plugin's {s.start_claims} claim GETs answered {status}",
                    lambda: proxy.faulted >= s.start_claims,
                    60,
                )
                held = prepared_claims(ledger_data(plugin))
                specs = spec_uids(plugin)
                faulted = proxy.faulted
            torn = sum(1 for c in claims if c.uid not in held or c.uid not in specs)
            rows.append(
                Row(
                    f"(b) claim GET answers {status} at plugin start",
                    s.start_claims,
                    f"claims torn down ({faulted} GETs failed)",
                    str(torn),
                    "0",
                )
            )
    finally:
        proxy.stop()
        plugin.stop()
        delete_slices(api, plugin.node, plugin.driver)
    return rows


@contextlib.contextmanager
def proxy_fault(proxy: ClaimFaultProxy, status: int) -> Iterator[None]:
    proxy.faulted = 0
    proxy.status = status
    try:
        yield
    finally:
        proxy.status = None


# --------------------------------------------------------------------------------------------
# (c) a damaged ledger, across DRA and the device-plugin shim
# --------------------------------------------------------------------------------------------


def flip_bit(path: Path, rng: random.Random) -> None:
    raw = bytearray(path.read_bytes())
    at = rng.randrange(len(raw) // 4, len(raw))  # inside the data, past the envelope's head
    raw[at] ^= 1 << rng.randrange(7)  # low bits: the file stays ASCII, the checksum must catch it
    path.write_bytes(bytes(raw))


def truncate(path: Path, rng: random.Random) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: rng.randrange(1, len(raw))])


def delete(path: Path, rng: random.Random) -> None:
    path.unlink()


def dangling_symlink(path: Path, rng: random.Random) -> None:
    path.unlink()
    path.symlink_to(path.parent / "moved-away.json")


DAMAGES: list[tuple[str, Callable[[Path, random.Random], None]]] = [
    ("bit-flipped", flip_bit),
    ("truncated", truncate),
    ("missing", delete),
    ("dangling symlink", dangling_symlink),
]


def shim_plugin(work: Path, node: str, kubeconfig: Path) -> PluginUnderTest:
    """DRA and the device-plugin shim (shared mode) over four mock devices."""
    root = work / node
    root.mkdir(parents=True, exist_ok=True)
    config = root / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "driverName": DRIVER,
                "sources": [
                    {
                        "static": {
                            "mockDir": str(root / "mock"),
                            "devices": [{"namePrefix": "dev", "count": 4}],
                        }
                    }
                ],
                "devicePlugin": {
                    "enabled": True,
                    "mode": "shared",
                    "resources": [{"resourceName": SHIM_RESOURCE}],
                },
            }
        )
    )
    return PluginUnderTest(
        label="shim",
        driver=DRIVER,
        node=node,
        argv=[
            sys.executable,
            "-m",
            "kubeletplugin.main",
            f"--config={config}",
            f"--node-name={node}",
            f"--kubeconfig={kubeconfig}",
            f"--kubelet-root={root / 'kubelet'}",
            f"--cdi-dir={root / 'cdi'}",
            f"--state-dir={root / 'state'}",
            f"--http-address=127.0.0.1:{free_port()}",
        ],
        workdir=root,
        kubelet_root=root / "kubelet",
        device_prefix="dev",
    )


def shim_socket(plugin: PluginUnderTest) -> Path:
    plugin_dir = plugin.kubelet_root / "device-plugins"
    return plugin_dir / socket_name(SHIM_RESOURCE, "", plugin_dir)


async def start_with_shim(plugin: PluginUnderTest) -> None:
    await start(plugin)
    sock = shim_socket(plugin)

    def serving() -> bool:
        plugin.check_alive()
        return sock.exists()

    await asyncio.to_thread(wait_until, "the shim's socket", serving, START_TIMEOUT)


async def shim_allocate(plugin: PluginUnderTest, device: str) -> bool:
    """Allocate as the kubelet's device manager does; True if the shim handed it out."""
    async with grpc.aio.insecure_channel(f"unix://{shim_socket(plugin)}") as channel:
        stub = dp_grpc.DevicePluginStub(channel)
        request = dp.AllocateRequest(
            container_requests=[dp.ContainerAllocateRequest(devices_ids=[device])]
        )
        try:
            await stub.Allocate(request, timeout=30)
        except grpc.aio.AioRpcError:
            return False
        return True


async def dra_prepare(plugin: PluginUnderTest, claim: BenchClaim) -> bool:
    client = DRAClient(plugin.dra_socket)
    try:
        await client.prepare([claim])
    except (grpc.aio.AioRpcError, BenchError):
        return False
    finally:
        await client.close()
    return True


async def damaged_ledger(
    api: AdminAPI, namespace: str, work: Path, kubeconfig: Path, s: Settings
) -> list[Row]:
    """The four damages, each on a node of its own, at the same time."""
    return list(
        await asyncio.gather(
            *(
                one_damage(api, namespace, work, kubeconfig, n, random.Random(f"{s.seed}-{n}"))
                for n in range(len(DAMAGES))
            )
        )
    )


async def one_damage(
    api: AdminAPI, namespace: str, work: Path, kubeconfig: Path, n: int, rng: random.Random
) -> Row:
    damage, apply_damage = DAMAGES[n]
    node = f"fault-ledger-{n}"
    plugin = shim_plugin(work, node, kubeconfig)
    try:
        await start_with_shim(plugin)
        by_dra, by_shim = claims_for(api, namespace, plugin, node, [0, 1])
        if not await dra_prepare(plugin, by_dra):
            raise BenchError(f"{damage}: preparing dev-0 before the damage failed")
        if not await shim_allocate(plugin, plugin.device(1)):
            raise BenchError(f"{damage}: allocating dev-1 before the damage failed")
        kill(plugin)
        apply_damage(ledger_path(plugin), rng)
        await start_with_shim(plugin)
        twice = 0
        # The DRA claim's device through the shim, the shim's device through DRA.
        twice += await shim_allocate(plugin, plugin.device(0))
        twice += await dra_prepare(plugin, by_shim)
        kept = by_dra.uid in prepared_claims(ledger_data(plugin)) and by_dra.uid in spec_uids(
            plugin
        )
    finally:
        plugin.stop()
        delete_slices(api, plugin.node, plugin.driver)
    return Row(
        f"(c) ledger {damage}, restart",
        2,
        "devices handed out twice (DRA <-> shim)" + ("" if kept else "; the DRA hold was lost"),
        str(twice),
        "0",
    )


# --------------------------------------------------------------------------------------------
# The controller: slices, claims, the webhook
# --------------------------------------------------------------------------------------------


def pool_slice(outage_devices: int) -> Obj:
    """One allNodes pool: group ``d`` devices for the outage, group ``e`` (16 distinct slots,
    a label that makes a backtracking regex explode) for the hostile claims."""
    devices = [
        {"name": f"d-{i:03d}", "attributes": {"group": {"string": "d"}}}
        for i in range(outage_devices)
    ]
    devices += [
        {
            "name": f"e-{i:02d}",
            "attributes": {
                "group": {"string": "e"},
                "slot": {"int": i % DISTINCT_VALUES},
                "label": {"string": BACKTRACKING},
            },
        }
        for i in range(2 * DISTINCT_VALUES)
    ]
    return {
        "metadata": {"name": "faults-pool"},
        "spec": {
            "driver": DRIVER,
            "allNodes": True,
            "pool": {"name": POOL, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def attr(name: str) -> str:
    return f'device.attributes["{DRIVER}"].{name}'


def immediate_claim(name: str, selector: str, count: int = 1, distinct: str = "") -> Obj:
    exactly: Obj = {
        "deviceClassName": DRIVER,
        "selectors": [{"cel": {"expression": selector}}],
    }
    if count != 1:
        exactly |= {"allocationMode": "ExactCount", "count": count}
    devices: Obj = {"requests": [{"name": "r", "exactly": exactly}]}
    if distinct:
        devices["constraints"] = [{"requests": ["r"], "distinctAttribute": distinct}]
    return {
        "metadata": {"name": name, "annotations": {ALLOCATION_ANNOTATION: "Immediate"}},
        "spec": {"devices": devices},
    }


def parameters(name: str, selector: str) -> Obj:
    return {
        "apiVersion": f"{DRIVER}/{params.VERSION}",
        "kind": params.KIND,
        "metadata": {"name": name},
        "spec": {"selectors": [selector]},
    }


def review(obj: Obj, namespace: str, uid: str) -> Obj:
    """The AdmissionReview the apiserver would send for creating ``obj`` (a claim unless it
    names its own apiVersion and kind)."""
    full = {"apiVersion": R, "kind": "ResourceClaim", **obj}
    group, _, version = str(full["apiVersion"]).rpartition("/")
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": version, "kind": full["kind"]},
            "namespace": namespace,
            "name": obj["metadata"]["name"],
            "operation": "CREATE",
            "userInfo": {"username": "fault-suite"},
            "object": full,
        },
    }


@dataclass
class Background:
    """Benign reviews to the webhook and claims of another driver, all along, recorded with
    the time they were sent so each hostile window can take its own."""

    webhook: str
    tls: ssl.SSLContext
    cluster: LocalCluster  # the thread gets a client of its own
    namespace: str
    reviews: list[tuple[float, float]] = field(default_factory=list)  # (sent, latency)
    others: list[tuple[float, bool]] = field(default_factory=list)  # (sent, admitted)
    stop: threading.Event = field(default_factory=threading.Event)

    def _review_loop(self) -> None:
        body = review(parameters("benign", f'{attr("group")} == "e"'), self.namespace, "benign")
        with httpx.Client(verify=self.tls, timeout=30) as http:
            while not self.stop.is_set():
                sent = time.monotonic()
                with contextlib.suppress(httpx.HTTPError):
                    http.post(f"{self.webhook}/validate", json=body)
                self.reviews.append((sent, time.monotonic() - sent))
                self.stop.wait(PROBE_PACE)

    def _other_driver_loop(self) -> None:
        with self.cluster.api() as api:
            self._create_others(api)

    def _create_others(self, api: AdminAPI) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            obj = {
                "metadata": {"name": f"other-{n}"},
                "spec": {
                    "devices": {
                        "requests": [{"name": "g", "exactly": {"deviceClassName": OTHER_CLASS}}]
                    }
                },
            }
            sent = time.monotonic()
            try:
                api.create(path_for(R, "resourceclaims", self.namespace), obj)
                self.others.append((sent, True))
            except (KubeAPIError, TransportError):
                self.others.append((sent, False))
            self.stop.wait(OTHER_PACE)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        threads = [
            threading.Thread(target=self._review_loop, daemon=True),
            threading.Thread(target=self._other_driver_loop, daemon=True),
        ]
        for t in threads:
            t.start()
        try:
            yield
        finally:
            self.stop.set()
            for t in threads:
                t.join(timeout=60)


def post_review(webhook: str, tls: ssl.SSLContext, body: Obj) -> tuple[float, bool]:
    """(latency, allowed) of one review."""
    sent = time.monotonic()
    with httpx.Client(verify=tls, timeout=60) as http:
        reply = http.post(f"{webhook}/validate", json=body).json()
    return time.monotonic() - sent, bool(reply["response"]["allowed"])


def claim_settled(api: AdminAPI, namespace: str, name: str) -> bool:
    obj = api.get(path_for(R, "resourceclaims", namespace, name))
    annotations = obj["metadata"].get("annotations") or {}
    return bool((obj.get("status") or {}).get("allocation")) or STATUS_ANNOTATION in annotations


def hostile_claims(
    api: AdminAPI, namespace: str, cluster: LocalCluster, controller: ControllerProcess
) -> list[Row]:
    assert controller.webhook is not None
    tls = ssl.create_default_context(cafile=str(controller.webhook.ca))
    webhook = controller.webhook_url
    replace_chain = attr("label") + '.replace("a", "aaaaaaaaaa")' * 10 + ' == ""'
    cases: list[tuple[str, Obj, bool]] = [  # (kind, object, goes to the controller)
        (
            "RE2-backtracking regex in a claim selector",
            immediate_claim("hostile-regex", f'{attr("label")}.matches("^(a+)+$")'),
            True,
        ),
        ("CEL cost bomb in a claim selector", immediate_claim("hostile-cost", replace_chain), True),
        (
            "CEL cost bomb in DeviceClaimParameters",
            parameters("hostile-params", "lists.range(2000000000).size() > 0"),
            False,
        ),
        (
            f"distinctAttribute: count {DISTINCT_VALUES + 1} over {DISTINCT_VALUES} values",
            immediate_claim(
                "hostile-distinct",
                f'{attr("group")} == "e"',
                count=DISTINCT_VALUES + 1,
                distinct=f"{DRIVER}/slot",
            ),
            True,
        ),
    ]
    background = Background(webhook, tls, cluster, namespace)
    rows = []
    with background.running():
        for kind, obj, reconciled in cases:
            began = time.monotonic()
            own, _allowed = post_review(webhook, tls, review(obj, namespace, f"hostile-{began}"))
            path = (
                path_for(R, "resourceclaims", namespace)
                if "apiVersion" not in obj
                else path_for(f"{DRIVER}/{params.VERSION}", params.PLURAL, namespace)
            )
            try:
                api.create(path, obj)
                created = True
            except KubeAPIError:
                created = False  # denied (by the apiserver or the webhook): processed
            if created and reconciled:
                name: str = obj["metadata"]["name"]

                def settled(n: str = name) -> bool:
                    return claim_settled(api, namespace, n)

                wait_until(
                    f"the controller's verdict on {name}",
                    settled,
                    SETTLE_TIMEOUT,
                    watch=[controller.process] if controller.process is not None else [],
                )

            def covered(since: float = began) -> bool:
                return any(sent >= since for sent, _ in background.reviews) and any(
                    sent >= since for sent, _ in background.others
                )

            wait_until("a benign review and another driver's claim in the window", covered, 60)
            ended = time.monotonic()

            def window_closed(end: float = ended) -> bool:
                # Both loops are sequential: once each has recorded a call sent after the
                # window, every call sent inside it has been answered and recorded.
                return any(sent > end for sent, _ in background.reviews) and any(
                    sent > end for sent, _ in background.others
                )

            wait_until("the background calls of the window answered", window_closed, 120)
            during = [lat for sent, lat in background.reviews if began <= sent <= ended]
            others = [ok for sent, ok in background.others if began <= sent <= ended]
            worst = max([own, *during])
            fault = f"(e) {kind}"
            verdict = "admitted" if created else "denied"
            rows.append(
                Row(
                    fault,
                    1 + len(during),
                    f"worst webhook review ms ({verdict}, {ended - began:.1f}s)",
                    f"{worst * 1000:.0f}",
                    f"< {LATENCY_PROMISE * 1000:.0f}",
                )
            )
            rows.append(
                Row(
                    fault,
                    len(others),
                    "other driver's claims admitted meanwhile",
                    f"{sum(others)}/{len(others)}",
                    "all",
                )
            )
    return rows


# --------------------------------------------------------------------------------------------
# (d) the apiserver stopped while the controller allocates
# --------------------------------------------------------------------------------------------


def apiserver_answers(api: AdminAPI) -> bool:
    try:
        api.get(path_for("v1", "namespaces", name="default"))
    except (KubeAPIError, TransportError):
        return False
    return True


def allocations(api: AdminAPI, namespace: str, prefix: str) -> dict[str, list[str]]:
    out = {}
    for c in api.items(path_for(R, "resourceclaims", namespace)):
        name = c["metadata"]["name"]
        if not name.startswith(prefix):
            continue
        results = (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
            "results"
        ) or []
        out[name] = [f"{r['pool']}/{r['device']}" for r in results]
    return out


def apiserver_outage(
    api: AdminAPI,
    namespace: str,
    cluster: LocalCluster,
    controller: ControllerProcess,
    s: Settings,
) -> list[Row]:
    prefix = "outage-"
    for i in range(s.outage_claims):
        api.create(
            path_for(R, "resourceclaims", namespace),
            immediate_claim(f"{prefix}{i:03d}", f'{attr("group")} == "d"'),
        )
    wait_until(
        "the controller allocating",
        lambda: any(allocations(api, namespace, prefix).values()),
        SETTLE_TIMEOUT,
    )
    before = sum(1 for d in allocations(api, namespace, prefix).values() if d)
    restarts = 0

    def outage() -> None:
        # The outage itself: its length is the fault's parameter, nothing waits on it.
        time.sleep(s.outage)

    cluster.restart_component("kube-apiserver", while_stopped=outage)
    wait_until("the apiserver answering again", lambda: apiserver_answers(api), 120)

    def all_allocated() -> bool:
        nonlocal restarts
        if controller.process is not None and not controller.process.alive():
            restarts += 1  # a Deployment would start it again
            controller.start()
        got = allocations(api, namespace, prefix)
        return len(got) == s.outage_claims and all(got.values())

    with contextlib.suppress(TimeoutError):
        wait_until("every claim allocated after the outage", all_allocated, SETTLE_TIMEOUT)
    got = allocations(api, namespace, prefix)
    lost = sum(1 for devices in got.values() if not devices) + s.outage_claims - len(got)
    per_device = Counter(d for devices in got.values() for d in devices)
    duplicated = sum(1 for n in per_device.values() if n > 1)
    fault = f"(d) apiserver stopped {s.outage:.0f}s while allocating"
    runs = s.outage_claims
    return [
        Row(fault, runs, f"allocations lost ({before} done before the stop)", str(lost), "0"),
        Row(fault, runs, "devices allocated twice", str(duplicated), "0"),
        Row(fault, runs, "controller restarts needed", str(restarts), "0"),
    ]


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


async def node_faults(
    api: AdminAPI, namespace: str, work: Path, kubeconfig: Path, cluster: LocalCluster, s: Settings
) -> list[Row]:
    """Rows (a), (b) and (c) at the same time: each has its own plugin processes, node
    name and dirs, and counts what happened, so sharing the CPU changes no figure (only
    where the random kills land, which is random anyway)."""
    a, b, c = await asyncio.gather(
        kill_during_prepares(api, namespace, work, kubeconfig, s),
        api_errors_at_start(api, namespace, work, kubeconfig, cluster, s),
        damaged_ledger(api, namespace, work, kubeconfig, s),
    )
    return a + b + c


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Progress on stderr: what runs, and how long it took (not a measured figure)."""
    began = time.monotonic()
    print(f"{name} ...", file=sys.stderr, flush=True)
    yield
    print(f"{name}: {time.monotonic() - began:.1f}s", file=sys.stderr, flush=True)


def run(s: Settings, work: Path) -> list[Row]:
    layout = isolated_layout(work)
    print(f"starting an isolated cluster (state {layout.state_dir}, {layout.apiserver_url})")
    rows: list[Row] = []
    with (
        phase("the whole run, cluster up to down"),
        running_cluster(layout) as (cluster, state, _started),
        cluster.api() as api,
    ):
        kubeconfig = Path(state.kubeconfig)
        namespace = f"faults-{uuid.uuid4().hex[:6]}"
        api.create_namespace(namespace)
        api.create(
            path_for(R, "deviceclasses"),
            {
                "metadata": {"name": DRIVER},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
            },
        )
        plugin_work = work / "p"  # unix socket paths must stay short
        with phase("(a), (b), (c): the node plugin's faults, side by side"):
            rows += asyncio.run(node_faults(api, namespace, plugin_work, kubeconfig, cluster, s))
        api.create(path_for(R, "resourceslices"), pool_slice(s.outage_claims))
        controller = ControllerProcess(
            "faults",
            controller_kubeconfig(api, cluster, work),
            work,
            extra_args=[f"--allocation-namespace={namespace}", "--log-level=warning"]
            + fault_fairness.controller_args(namespace)
            + (
                [f"--allocation-timeout={s.allocation_timeout}"]
                if s.allocation_timeout is not None
                else []
            ),
            webhook=webhook_tls(cluster, work / "webhook"),
        )
        controller.start()
        try:
            with phase("controller and webhook"):
                controller.wait_ready(START_TIMEOUT)
                register_webhook(api, controller, driver=DRIVER)
            try:
                with phase("(e) hostile objects"):
                    rows += hostile_claims(api, namespace, cluster, controller)
                with phase("(f4), (f5), (f6) the webhook's hostile clients"):
                    cells = webhook_rows(controller, cluster.layout.pki, work / "w", s.quick)
                    rows += [Row(*c) for c in cells]
            finally:
                unregister_webhook(api)
            with phase("(f1) claims of another driver's class"):
                rows += [Row(*r) for r in other_driver_claims(api, namespace, controller)]
            with phase("(f2) unsatisfiable claims against another namespace's"):
                rows += fault_fairness.rows(api, namespace, controller, s)
            with phase("(d) apiserver outage"):
                rows += apiserver_outage(api, namespace, cluster, controller, s)
            with phase("(f3) a claim too deep to decode, controller restarted"):
                rows += too_deep_claim(api, namespace, controller)
        finally:
            controller.stop()
        with phase("(f0) apiserver outage, pods and immediate claims competing"):
            race = outage_race(cluster, api, kubeconfig, work, s.outage)
            rows += [Row(FAULT.format(s.outage), 1, *r) for r in race]
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    parser.add_argument("--prepares", type=int, help="(a) prepares (default 100)")
    parser.add_argument("--kills", type=int, help="(a) kill -9 points (default 20)")
    parser.add_argument("--start-claims", type=int, help="(b) claims held at start (10)")
    parser.add_argument("--outage", type=float, help="(d) seconds the apiserver is down (60)")
    parser.add_argument("--outage-claims", type=int, help="(d) claims allocated (40)")
    parser.add_argument("--seed", type=int, default=1, help="kill points, bit flips")
    args = parser.parse_args(argv)
    s = (
        Settings(
            prepares=6, kills=2, start_claims=3, outage=5, outage_claims=6, allocation_timeout=3
        )
        if args.quick
        else Settings()
    )
    s.quick = args.quick
    for name in ("prepares", "kills", "start_claims", "outage", "outage_claims", "seed"):
        value = getattr(args, name)
        if value is not None:
            setattr(s, name, value)
    if min(s.prepares, s.start_claims, s.outage_claims) < 1 or s.kills < 0 or s.outage < 0:
        parser.error("sizes must be positive, --kills and --outage not negative")
    work = Path(tempfile.mkdtemp(prefix="drf-", dir="/tmp"))
    ok = False
    try:
        rows = run(s, work)
        ok = True
    finally:
        if ok or os.environ.get("DRADRIVER_BENCH_KEEP") is None:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")
    print(
        f"\nFault suite (seed {s.seed}): {s.prepares} prepares with {s.kills} kills, "
        f"{s.start_claims} claims at start, apiserver down {s.outage:.0f}s with "
        f"{s.outage_claims} claims, controller allocation budget "
        f"{'10' if s.allocation_timeout is None else f'{s.allocation_timeout:g}'}s\n"
    )
    print(table(["fault", "runs", "metric", "value", "promised"], [r.cells() for r in rows]))


if __name__ == "__main__":
    main()
