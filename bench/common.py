"""Shared pieces of the kubelet-plugin benchmarks: plugin processes, a fake kubelet, claims.

The benchmarks never touch what the cluster tests use (driver ``dradriver.dev`` on node
``node-1`` with the kubelet root ``/var/lib/kubelet``): every plugin under test gets its own
driver name, node name and kubelet root dir below a short temporary dir, and the benchmark
plays the kubelet itself (registration, then NodePrepareResources/NodeUnprepareResources on
the plugin's DRA socket).

The Go reference is the kubelet plugin of ``sigs.k8s.io/dra-example-driver``, built from the
Go module proxy by the module in ``bench/goref`` (go.mod and go.sum only) and cached in
``~/.cache/dradriver/goref/<version>/`` (``DRADRIVER_CACHE_DIR`` moves it).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import httpx
import yaml

from devtools.cluster.api import AdminAPI
from devtools.cluster.binaries import cache_root
from devtools.cluster.config import Layout, default_state_dir, parse_runtime
from devtools.cluster.process import ManagedProcess, ProcessDied, log_tail
from devtools.cluster.wait import wait_until
from devtools.paths import REPO
from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.http import TransportError
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.kubeletapi.gen import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)

BENCH_NODE = "bench-node"
GO_DRIVER = "gpu.example.com"
GO_MODULE = "sigs.k8s.io/dra-example-driver"
GO_PACKAGE = f"{GO_MODULE}/cmd/dra-example-kubeletplugin"
GOREF_DIR = Path(__file__).resolve().parent / "goref"
GO_BUILD_TIMEOUT = 900.0
# The example driver's client-go defaults (QPS 5, burst 10) throttle its claim GETs far below
# what the apiserver takes; ours has no client-side limit, so the comparison lifts them.
GO_QPS = 1000
GO_BURST = 2000
# What dradriver does per claim that the Go reference (helper v0.36) does not: the KEP-5304
# metadata files and the claim's status.devices. Off for the side-by-side rows, so both
# sides do the same work; the benches print dradriver's defaults next to them.
AS_GO_FLAGS = ("--no-device-metadata", "--no-claim-status")
REQUEST_NAME = "gpu"
RPC_TIMEOUT = 60.0


class BenchError(RuntimeError):
    """A benchmark step failed (not a timing: the benchmarks assert no timings)."""


# --------------------------------------------------------------------------------------------
# Statistics and tables
# --------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in (0, 1]."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], text_columns: int = 1) -> str:
    """A plain-text table; the first ``text_columns`` are left-aligned, the others right."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.ljust(w) if i < text_columns else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return " | ".join(parts).rstrip()

    rule = "-+-".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def ms(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else f"{seconds * 1000:.2f}"


# --------------------------------------------------------------------------------------------
# Work dirs, processes, memory
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def short_workdir() -> Iterator[Path]:
    """A short dir under /tmp (unix socket paths must stay below 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="drb-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KiB, from /proc/<pid>/status."""
    values = {"VmRSS": 0, "VmHWM": 0}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in values:
            values[key] = int(rest.split()[0])
    return values["VmRSS"], values["VmHWM"]


@dataclass
class PluginUnderTest:
    """One kubelet plugin process (ours or the Go reference) with its own kubelet root."""

    label: str
    driver: str
    node: str
    argv: list[str]
    workdir: Path
    kubelet_root: Path
    device_prefix: str
    env: dict[str, str] = field(default_factory=dict)
    readyz: str | None = None
    process: ManagedProcess | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.label}.log"

    @property
    def registration_socket(self) -> Path:
        return self.kubelet_root / "plugins_registry" / f"{self.driver}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        return self.kubelet_root / "plugins" / self.driver / "dra.sock"

    @property
    def pool(self) -> str:
        return self.node

    def device(self, index: int) -> str:
        return f"{self.device_prefix}-{index}"

    @property
    def pid(self) -> int:
        if self.process is None:
            raise BenchError(f"{self.label} plugin is not running")
        return self.process.pid

    def start(self) -> None:
        self.process = ManagedProcess.start(
            f"the {self.label} plugin",
            self.argv,
            log_path=self.log_path,
            cwd=self.workdir / f"{self.label}.cwd",
            env={**os.environ, **self.env},
        )

    def check_alive(self) -> None:
        if self.process is None:
            raise BenchError(f"the {self.label} plugin is not running")
        try:
            self.process.check()
        except ProcessDied as e:
            raise BenchError(str(e)) from e

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=15)
        self.process = None

    async def register(self, within: float = 60) -> Any:
        """Act as the kubelet's plugin watcher: GetInfo, then NotifyRegistrationStatus(ok)."""
        deadline = time.monotonic() + within
        while not self.registration_socket.exists():
            self.check_alive()
            if time.monotonic() > deadline:
                raise BenchError(
                    f"the {self.label} plugin created no registration socket "
                    f"{self.registration_socket} within {within:.0f}s:\n{log_tail(self.log_path)}"
                )
            await asyncio.sleep(0.05)
        async with grpc.aio.insecure_channel(f"unix://{self.registration_socket}") as channel:
            stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
            info = await stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=10)
            if info.name != self.driver:
                raise BenchError(f"{self.label} plugin registered as {info.name!r}")
            await stub.NotifyRegistrationStatus(
                pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True), timeout=10
            )
        if self.readyz is not None:
            url = self.readyz

            def ready() -> bool:
                self.check_alive()
                try:
                    return httpx.get(url, timeout=2).status_code == 200
                except httpx.HTTPError:
                    return False

            await asyncio.to_thread(wait_until, f"{self.label} /readyz", ready, within)
        return info


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ours_plugin(
    work: Path,
    driver: str,
    node: str,
    devices: int,
    kubeconfig: Path,
    kubelet_root: Path | None = None,
    cdi_dir: Path | None = None,
    flags: Sequence[str] = (),
    label: str = "ours",
) -> PluginUnderTest:
    """dradriver's kubelet plugin, run as NodePlugin does, with N static mock devices.

    ``kubelet_root`` (a real kubelet's) and ``cdi_dir`` (its runtime's) default to dirs of
    its own below ``work``, where the benchmark plays the kubelet; ``flags`` are added to
    its command line (:data:`AS_GO_FLAGS` turns off what the Go reference does not do)."""
    root = work / label
    root.mkdir(parents=True, exist_ok=True)
    config = root / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "driverName": driver,
                "sources": [
                    {
                        "static": {
                            "mockDir": str(root / "mock"),
                            "devices": [{"namePrefix": "dev", "count": devices}],
                        }
                    }
                ],
            }
        )
    )
    port = free_port()
    kubelet_root = kubelet_root or root / "kubelet"
    argv = [
        sys.executable,
        "-m",
        "kubeletplugin.main",
        f"--config={config}",
        f"--driver-name={driver}",
        f"--node-name={node}",
        f"--kubeconfig={kubeconfig}",
        f"--kubelet-root={kubelet_root}",
        f"--cdi-dir={cdi_dir or root / 'cdi'}",
        f"--state-dir={root / 'state'}",
        f"--http-address=127.0.0.1:{port}",
        *flags,
    ]
    return PluginUnderTest(
        label=label,
        driver=driver,
        node=node,
        argv=argv,
        workdir=root,
        kubelet_root=kubelet_root,
        device_prefix="dev",
        readyz=f"http://127.0.0.1:{port}/readyz",
    )


def baseline_source(revision: str, into: Path) -> Path:
    """dradriver's sources at git ``revision`` (a commit of this repository), unpacked into
    ``into/src`` with their gRPC stubs generated, for a plugin run from them (PYTHONPATH).

    The 'before' side of a benchmark that compares a change with the code it replaces in
    one run; only the product packages are taken, the environment is this one's."""
    src = into / "src"
    src.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", revision, "dradriver", "kubeletplugin"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    subprocess.run(
        [sys.executable, "-m", "dradriver.kubeletapi.generate"],
        cwd=src,
        env={**os.environ, "PYTHONPATH": str(src)},
        check=True,
        capture_output=True,
    )
    return src


def go_plugin(
    binary: Path,
    work: Path,
    node: str,
    devices: int,
    kubeconfig: Path,
    kubelet_root: Path | None = None,
    cdi_dir: Path | None = None,
) -> PluginUnderTest:
    """The dra-example-driver kubelet plugin (gpu profile: devices gpu-0.., pool = node);
    ``kubelet_root`` and ``cdi_dir`` as for :func:`ours_plugin`."""
    root = work / "go"
    kubelet_root = kubelet_root or root / "kubelet"
    # The kubelet creates its registry dir; the Go helper only listens in it.
    (kubelet_root / "plugins_registry").mkdir(parents=True, exist_ok=True)
    argv = [
        str(binary),
        f"--node-name={node}",
        f"--driver-name={GO_DRIVER}",
        f"--num-devices={devices}",
        f"--cdi-root={cdi_dir or root / 'cdi'}",
        f"--kubelet-registrar-directory-path={kubelet_root / 'plugins_registry'}",
        f"--kubelet-plugins-directory-path={kubelet_root / 'plugins'}",
        f"--kubeconfig={kubeconfig}",
        f"--kube-api-qps={GO_QPS}",
        f"--kube-api-burst={GO_BURST}",
    ]
    return PluginUnderTest(
        label="go",
        driver=GO_DRIVER,
        node=node,
        argv=argv,
        workdir=root,
        kubelet_root=kubelet_root,
        device_prefix="gpu",
    )


# --------------------------------------------------------------------------------------------
# The Go reference binary
# --------------------------------------------------------------------------------------------


def go_version() -> str:
    """The dra-example-driver version bench/goref/go.mod requires."""
    text = (GOREF_DIR / "go.mod").read_text()
    match = re.search(rf"^\s*{re.escape(GO_MODULE)}\s+(v\S+)", text, re.MULTILINE)
    if match is None:
        raise BenchError(f"{GOREF_DIR / 'go.mod'} does not require {GO_MODULE}")
    return match.group(1)


def go_binary() -> tuple[Path | None, str]:
    """(path, how) of the Go reference plugin, building it once; (None, why) if impossible."""
    if os.environ.get("DRADRIVER_BENCH_NO_GO"):
        return None, "skipped: DRADRIVER_BENCH_NO_GO is set"
    version = go_version()
    target = cache_root() / "goref" / version / "dra-example-kubeletplugin"
    if target.exists():
        return target, f"{GO_MODULE} {version} (cached {target})"
    go = shutil.which("go")
    if go is None:
        return None, "no `go` command on PATH, so the Go reference cannot be built"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    print(f"building the Go reference {GO_PACKAGE}@{version} (once, ~1-3 min) ...", flush=True)
    started = time.monotonic()
    try:
        done = subprocess.run(
            [go, "build", "-trimpath", "-o", str(partial), GO_PACKAGE],
            cwd=GOREF_DIR,
            capture_output=True,
            text=True,
            timeout=GO_BUILD_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        partial.unlink(missing_ok=True)
        return None, f"`go build {GO_PACKAGE}` did not finish within {GO_BUILD_TIMEOUT:.0f}s"
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        tail = "\n".join(done.stderr.strip().splitlines()[-8:])
        return None, f"`go build {GO_PACKAGE}@{version}` failed:\n{tail}"
    os.replace(partial, target)
    took = time.monotonic() - started
    return target, f"{GO_MODULE} {version} (built in {took:.0f}s, cached {target})"


# --------------------------------------------------------------------------------------------
# Cluster objects
# --------------------------------------------------------------------------------------------


def bench_namespace(api: AdminAPI) -> str:
    name = f"dradriver-bench-{secrets.token_hex(3)}"
    api.create("/api/v1/namespaces", {"metadata": {"name": name}})
    return name


def delete_namespace(api: AdminAPI, name: str) -> None:
    with contextlib.suppress(KubeAPIError, TransportError):
        api.delete(path_for("v1", "namespaces", name=name))


def go_publish_outcome(
    api: AdminAPI, plugin: PluginUnderTest, devices: int, started: float, timeout: float
) -> str:
    """Wait until the Go plugin published ``devices`` devices or logged a rejected slice."""

    def outcome() -> str | None:
        plugin.check_alive()
        if published_devices(api, plugin.node, plugin.driver) == devices:
            return f"published in {time.monotonic() - started:.2f}s after process start"
        log = plugin.log_path.read_text(errors="replace")
        match = re.search(r'is invalid: ([^"]+)"', log)
        if match:
            return f"rejected by the apiserver: {match.group(1).strip()}"
        return None

    try:
        return wait_until(f"the Go plugin to publish {devices} devices", outcome, timeout, 0.2)
    except TimeoutError:
        return f"nothing published within {timeout:.0f}s and no rejection logged"


def wait_published(api: AdminAPI, plugin: PluginUnderTest, devices: int, timeout: float) -> bool:
    """Wait until the plugin's ResourceSlices hold ``devices`` devices; False on timeout."""

    def done() -> bool:
        plugin.check_alive()
        return published_devices(api, plugin.node, plugin.driver) == devices

    try:
        wait_until(f"{devices} {plugin.label} devices published", done, timeout, 0.2)
    except TimeoutError:
        return False
    return True


def node_slices(api: AdminAPI, node: str, driver: str) -> list[Obj]:
    return api.items(
        path_for(RESOURCE_V1, "resourceslices"),
        fieldSelector=f"spec.nodeName={node},spec.driver={driver}",
    )


def published_devices(api: AdminAPI, node: str, driver: str) -> int:
    return sum(len(s["spec"].get("devices") or []) for s in node_slices(api, node, driver))


def delete_slices(api: AdminAPI, node: str, driver: str) -> int:
    """Delete every ResourceSlice of (node, driver); returns how many there were."""
    slices = node_slices(api, node, driver)
    for s in slices:
        api.delete(path_for(RESOURCE_V1, "resourceslices", name=s["metadata"]["name"]))
    return len(slices)


def create_fake_node(api: AdminAPI, name: str) -> None:
    """A Node object without a kubelet, cordoned and tainted so nothing is scheduled there.

    The Go helper's ResourceSlice controller reads the Node (for the slices' owner reference)
    and publishes nothing while it does not exist.
    """
    api.delete(path_for("v1", "nodes", name=name))
    wait_until(
        f"old node {name} gone",
        lambda: api.get_or_none(path_for("v1", "nodes", name=name)) is None,
        30,
    )
    api.create(
        "/api/v1/nodes",
        {
            "metadata": {"name": name, "labels": {"dradriver.dev/bench": "true"}},
            "spec": {
                "unschedulable": True,
                "taints": [{"key": "dradriver.dev/bench", "effect": "NoSchedule"}],
            },
        },
    )


def delete_node(api: AdminAPI, name: str) -> None:
    with contextlib.suppress(KubeAPIError, TransportError):
        api.delete(path_for("v1", "nodes", name=name))


@dataclass(frozen=True)
class BenchClaim:
    """A ResourceClaim the benchmark created and allocated, as NodePrepareResources names it."""

    namespace: str
    name: str
    uid: str

    def pb(self) -> Any:
        return dra_v1_pb2.Claim(namespace=self.namespace, uid=self.uid, name=self.name)


def allocated_claim(
    api: AdminAPI, namespace: str, name: str, driver: str, pool: str, device: str, node: str
) -> BenchClaim:
    """Create a ResourceClaim and write its ``status.allocation`` as the scheduler would."""
    obj = api.create(
        path_for(RESOURCE_V1, "resourceclaims", namespace),
        {
            "metadata": {"name": name},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": REQUEST_NAME, "exactly": {"deviceClassName": f"{driver}-bench"}}
                    ]
                }
            },
        },
    )
    obj["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": REQUEST_NAME, "driver": driver, "pool": pool, "device": device}
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
            "allocationTimestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    }
    stored = api.replace(path_for(RESOURCE_V1, "resourceclaims", namespace, name) + "/status", obj)
    return BenchClaim(namespace, name, str(stored["metadata"]["uid"]))


def allocated_claims(
    api: AdminAPI, namespace: str, plugin: PluginUnderTest, count: int
) -> list[BenchClaim]:
    """``count`` claims, claim i allocated to the plugin's device i."""
    return [
        allocated_claim(
            api,
            namespace,
            f"{plugin.label}-{i}",
            plugin.driver,
            plugin.pool,
            plugin.device(i),
            plugin.node,
        )
        for i in range(count)
    ]


# --------------------------------------------------------------------------------------------
# The kubelet side of the DRA socket
# --------------------------------------------------------------------------------------------


class DRAClient:
    """NodePrepareResources/NodeUnprepareResources over one channel, as the kubelet does."""

    def __init__(self, dra_socket: Path) -> None:
        self._channel = grpc.aio.insecure_channel(f"unix://{dra_socket}")
        self._stub = dra_v1_pb2_grpc.DRAPluginStub(self._channel)

    async def close(self) -> None:
        await self._channel.close(grace=None)

    async def prepare(self, claims: Sequence[BenchClaim]) -> float:
        """Prepare ``claims`` in one call; returns its latency in seconds."""
        request = dra_v1_pb2.NodePrepareResourcesRequest(claims=[c.pb() for c in claims])
        started = time.perf_counter()
        response = await self._stub.NodePrepareResources(request, timeout=RPC_TIMEOUT)
        took = time.perf_counter() - started
        for claim in claims:
            result = response.claims.get(claim.uid)
            if result is None or result.error or not result.devices:
                why = "no result" if result is None else result.error or "no devices"
                raise BenchError(f"NodePrepareResources {claim.namespace}/{claim.name}: {why}")
        return took

    async def unprepare(self, claims: Sequence[BenchClaim]) -> float:
        request = dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[c.pb() for c in claims])
        started = time.perf_counter()
        response = await self._stub.NodeUnprepareResources(request, timeout=RPC_TIMEOUT)
        took = time.perf_counter() - started
        for claim in claims:
            result = response.claims.get(claim.uid)
            if result is None or result.error:
                why = "no result" if result is None else result.error
                raise BenchError(f"NodeUnprepareResources {claim.namespace}/{claim.name}: {why}")
        return took


def shared_layout() -> Layout:
    """The usual local cluster's layout, for benchmarks that reuse a running one.

    The runtime is ``$DRADRIVER_RUNTIME`` (default fake) so that the smoke run in the
    cluster tier reuses the session cluster whatever runtime it runs; these benchmarks
    never start containers, so the runtime does not change what they measure.
    """
    return Layout(
        state_dir=default_state_dir(),
        runtime=parse_runtime(os.environ.get("DRADRIVER_RUNTIME", "fake")),
    )
