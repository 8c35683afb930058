"""``dradriver-kubeletplugin``: the node component serving DRA to the kubelet."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.devices.config import DevicePluginConfig, DriverConfig, load_config
from dradriver.devices.configyaml import DriverConfigError
from dradriver.devices.sources import build_sources, discover_all
from dradriver.devices.static import MockDeviceError
from dradriver.host.cdi import CDIRegistry
from dradriver.host.hooks import Hook
from dradriver.host.state.ledger import Ledger
from dradriver.host.state.schema import LedgerError
from dradriver.httpserver import HTTPEndpoint, build_app
from dradriver.k8s.client import KubeClient, load_connection
from dradriver.log import configure, get_logger
from dradriver.plugin.devicemetadata import DeviceMetadataWriter
from dradriver.plugin.helper import KubeletPluginHelper, PluginPaths
from dradriver.resourceslice import capabilities
from dradriver.resourceslice.capabilities import Missing, say_what_this_cluster_lacks
from dradriver.resourceslice.pool import SliceError
from dradriver.resourceslice.publisher import SlicePublisher, slice_informer
from kubeletplugin.claimstatus import ClaimStatusWriter
from kubeletplugin.doctor.cli import log_failures
from kubeletplugin.doctor.cli import main as doctor_main
from kubeletplugin.extendedresources import ExtendedResources
from kubeletplugin.hostdevices import HostDevices, sharing_form
from kubeletplugin.inventory import NodeInventory
from kubeletplugin.legacy.errors import DevicePluginSetupError
from kubeletplugin.metrics import PluginMetrics
from kubeletplugin.nodedriver import NodeDriver
from kubeletplugin.privileges import MissingCapabilities, require

if TYPE_CHECKING:
    from kubeletplugin.legacy.podresources import HoldReconciler, PodResourcesClient
    from kubeletplugin.legacy.shim import DevicePluginShim

log = get_logger("kubeletplugin")
# Connections to the apiserver, all kept open when idle: a burst of 100 prepare calls reads
# 100 claims over these, waiting for a free one, instead of opening up to 100 TLS
# connections (handshakes, and buffers that stay in every node's plugin: bench.plugin_rss
# after 100 claims went from 83.7 to 79.5 MiB). Watches take one each.
API_CONNECTIONS = 16
# How long the start-up probe is asked again while it gets no answer (shared host devices).
PROBE_BUDGET_SECONDS = 10.0


class UsageError(ValueError):
    """A missing or contradictory command-line setting."""


def _add_path_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the kubelet, CDI and the ledger live on the host."""
    parser.add_argument(
        "--kubelet-root",
        type=Path,
        default=Path("/var/lib/kubelet"),
        help="kubelet root dir; the plugin and registration sockets live under "
        "it (default: %(default)s)",
    )
    parser.add_argument(
        "--device-plugin-dir",
        type=Path,
        help="the kubelet's device-plugin directory, where kubelet.sock and the shim's "
        "sockets live (default: <kubelet-root>/device-plugins; the kubelet itself always "
        "uses /var/lib/kubelet/device-plugins)",
    )
    parser.add_argument(
        "--pod-resources-socket",
        type=Path,
        help="the kubelet's pod-resources API, used to release device-plugin allocations "
        "(default: <kubelet-root>/pod-resources/kubelet.sock)",
    )
    parser.add_argument(
        "--cdi-dir",
        type=Path,
        default=Path("/var/run/cdi"),
        help="where CDI specs are written (default: %(default)s)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        help="where the ledger lives (default: the plugin dir under the kubelet "
        "root, which survives reboots)",
    )


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="dradriver-kubeletplugin",
        description="Registers with the kubelet, publishes this node's ResourceSlices and "
        "prepares devices for pods (DRA): setup/teardown hooks, CDI specs, and a crash-safe "
        "ledger of which device is held by whom. With devicePlugin.enabled in the config it "
        "also serves the same devices through the device-plugin API (v1beta1).",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=env("DRADRIVER_CONFIG"),
        help="driver configuration YAML (devices, hooks); env DRADRIVER_CONFIG",
    )
    parser.add_argument(
        "--driver-name",
        default=env("DRADRIVER_DRIVER_NAME"),
        help=f"DRA driver name (default: from the config, else {DEFAULT_DRIVER_NAME})",
    )
    parser.add_argument(
        "--node-name", default=env("NODE_NAME"), help="this node's name (env NODE_NAME)"
    )
    _add_path_arguments(parser)
    parser.add_argument(
        "--instance",
        default=env("POD_UID", ""),
        help="suffix for socket names so two plugin pods can overlap during a "
        "rolling update (env POD_UID)",
    )
    parser.add_argument(
        "--kubeconfig",
        default=env("KUBECONFIG"),
        help="kubeconfig path (default: in-cluster service account)",
    )
    parser.add_argument(
        "--http-address",
        default="127.0.0.1:8080",
        help="/healthz, /readyz and /metrics on HOST:PORT, or on unix:/PATH for a pod in "
        "the host network (its probes: python -m dradriver.httpprobe) (default: %(default)s)",
    )
    parser.add_argument(
        "--health-interval",
        type=float,
        default=5.0,
        help="seconds between device health checks (default: %(default)s)",
    )
    parser.add_argument(
        "--device-metadata",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="mount the KEP-5304 device metadata file (devices and attributes of the claim) "
        "into containers through CDI (default: on)",
    )
    parser.add_argument(
        "--claim-status",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="publish status.devices (Ready condition, CDI IDs) of prepared claims, in the "
        "background (default: on)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    return parser


def _hook(spec: object | None, name: str) -> Hook | None:
    if spec is None:
        return None
    command = tuple(getattr(spec, "command", None) or ())
    python = getattr(spec, "python", None) or ""
    timeout = float(getattr(spec, "timeout_seconds", 30))
    return Hook(name, command=command, python=python, timeout=timeout)


class Plugin:
    def __init__(self, args: argparse.Namespace, config: DriverConfig) -> None:
        self.args = args
        self.driver_name: str = args.driver_name or config.driver_name
        if not args.node_name:
            raise UsageError("--node-name (or env NODE_NAME) is required")
        self.node: str = args.node_name
        self.config = config
        self.paths = PluginPaths(args.kubelet_root, self.driver_name, args.instance)
        state_dir = args.state_dir or self.paths.plugin_dir
        self.metrics = PluginMetrics()
        self.client = KubeClient(
            load_connection(args.kubeconfig),
            "dradriver-kubeletplugin",
            max_connections=API_CONNECTIONS,
        )
        self.ledger = Ledger.load(Path(state_dir) / "ledger.json")
        self.extended = ExtendedResources(config)
        sources = build_sources(self.extended.config)
        self.host_devices = HostDevices(sources, self._devices_changed)
        self.inventory = NodeInventory(self.node, lambda: discover_all(sources))
        self._health_task: asyncio.Task[None] | None = None
        self.shim: DevicePluginShim | None = None
        self.hold_reconciler: HoldReconciler | None = None
        self.claim_status = (
            ClaimStatusWriter(self.client, self.driver_name, self.node)
            if args.claim_status
            else None
        )
        self.driver = NodeDriver(
            client=self.client,
            driver_name=self.driver_name,
            inventory=self.inventory,
            ledger=self.ledger,
            # Not fsynced: docs/design-decisions.md.
            cdi=CDIRegistry(args.cdi_dir, self.driver_name, durable=False),
            setup=_hook(config.hooks.setup, "setup"),
            teardown=_hook(config.hooks.teardown, "teardown"),
            metrics=self.metrics,
            status=self.claim_status,
            metadata=DeviceMetadataWriter(
                self.driver_name, self.paths.plugin_dir, args.cdi_dir, self._published_attributes
            )
            if args.device_metadata
            else None,
        )
        slices = slice_informer(self.client, self.driver_name, self.node)
        self.helper = KubeletPluginHelper(
            self.driver,
            self.paths,
            publisher=SlicePublisher(
                self.client,
                self.driver_name,
                slices,
                node=self.node,
                on_write=self.metrics.slice_writes.inc,
            ),
            slice_cache=slices,
        )
        self.helper.registration.on_registered = self.metrics.registrations.inc
        self.helper.on_kubelet_call = self._count_kubelet_call
        self._publish_inventory()

    def _start_device_plugin_shim(self, config: DevicePluginConfig) -> None:
        """The device-plugin shim and its pod-resources reconciler (devicePlugin.enabled, or
        host profiles' extended resources on the device-plugin path)."""
        # Imported here: a node without the shim never loads it (or the device-plugin
        # framework and its gRPC stubs), bench.plugin_rss.
        from kubeletplugin.legacy.podresources import HoldReconciler, PodResourcesClient
        from kubeletplugin.legacy.shim import DevicePluginShim

        args = self.args
        kubelet_root = Path(args.kubelet_root)
        self.shim = DevicePluginShim(
            config=config,
            driver_name=self.driver_name,
            inventory=self.inventory,
            ledger=self.ledger,
            cdi_dir=args.cdi_dir,
            plugin_dir=args.device_plugin_dir or kubelet_root / "device-plugins",
            instance=args.instance,
            metrics=self.metrics,
            partitioned=self.extended.partitioned,
        )
        self.hold_reconciler = HoldReconciler(
            self.shim,
            PodResourcesClient(
                args.pod_resources_socket or kubelet_root / "pod-resources" / "kubelet.sock"
            ),
            interval=config.pod_resources_interval_seconds,
            grace=config.release_grace_seconds,
            on_error=self.metrics.dp_pod_resources_errors.inc,
            on_pass=self.metrics.dp_pod_resources_polls.inc,
        )
        self.driver.gate = self.shim
        self.shim.on_dra_view_change = self._publish_inventory

    async def _hold_in_use(self, pod_resources: PodResourcesClient) -> None:
        """DRA claims the kubelet reports in use that the ledger lost, held before serving
        (with the shim, which could otherwise hand their devices out; issue 21, finding 7)."""
        from kubeletplugin.inuse import hold_claims_in_use

        kind = self.driver.store.cdi.kind
        counts = await hold_claims_in_use(
            self.driver.recovery, pod_resources, self.driver_name, kind
        )
        if counts:
            log.info("pod resources' claims checked before serving", **counts)

    async def _choose_forms(self, missing: list[capabilities.Missing] | None) -> dict[str, str]:
        """Before anything serves: the extended resources' path (and the shim it needs) and
        the form of shared host devices; the start-up line's fields saying them."""
        await self.extended.decide(self.client, self.driver_name)
        shim_config = self.extended.shim_config()
        if shim_config is not None:
            self._start_device_plugin_shim(shim_config)
        said = self.extended.said()
        self.host_devices.slots_for(self.extended.partitioned)
        if self.host_devices.shared:
            self.host_devices.use(sharing_form(missing))
            self.inventory.refresh()
            said["shared_host_devices_as"] = self.host_devices.form
        self._publish_inventory()
        return said

    def _published_attributes(self, device: str) -> dict[str, Any]:
        """A device's attributes as its ResourceSlice shows them (for the metadata file)."""
        found = self.inventory.devices.get(device)
        if found is None:
            return {}
        attributes: dict[str, Any] = found.to_api(self.driver_name).get("attributes") or {}
        return attributes

    def _publish_inventory(self) -> None:
        """Hand the node's current pool to the publisher (which syncs it if it changed)."""
        shown = self.shim.dra_devices if self.shim is not None else None
        try:
            pool = self.inventory.resource_pool(
                self.driver_name, list(self.config.counter_sets), shown
            )
        except SliceError as e:  # keep publishing the last good pool
            self.driver.handle_error(e, "building the node's ResourceSlices")
            return
        self.helper.publish_resources(pool)

    async def _probe_slice_features(self) -> list[Missing] | None:
        """The start-up probe of the slice features. With shared host devices, whose form it
        decides, a probe that got no answer (the apiserver, or an admission policy that is
        not in force yet, refused it) is asked again for up to PROBE_BUDGET_SECONDS before
        the plugin falls back to the form every release serves."""
        deadline = time.monotonic() + PROBE_BUDGET_SECONDS
        delay = 0.2
        while True:
            missing = await say_what_this_cluster_lacks(
                self.client, self.driver_name, self.node, self.node, capabilities.NODE_FEATURES
            )
            if missing is not None or not self.host_devices.shared:
                return missing
            if time.monotonic() + delay > deadline:
                return None
            await asyncio.sleep(delay)  # a retry's backoff
            delay = min(delay * 2, 2.0)

    def _devices_changed(self) -> None:
        """A hot-plug event: rediscover, republish, and report health now."""
        if not self.inventory.refresh():
            return
        self._publish_inventory()
        self.metrics.unhealthy_devices.set(self.inventory.unhealthy())
        if self._health_task is None or self._health_task.done():
            self._health_task = asyncio.get_running_loop().create_task(
                self.helper.publish_health(self.inventory.health())
            )

    def _count_kubelet_call(self, service: str, method: str) -> None:
        self.metrics.kubelet_calls.labels(service, method).inc()

    def ready(self) -> tuple[bool, str]:
        if not self.helper.registered:
            error = self.helper.registration.last_error
            return False, f"not registered with the kubelet{': ' + error if error else ''}"
        if self.shim is not None:
            missing = self.shim.not_registered()
            if missing:
                return False, "device plugin not registered: " + "; ".join(missing)
            resources = ",".join(self.shim.resource_names)
            return True, (
                f"registered as {self.driver_name} on {self.node}, device plugin {resources}"
            )
        return True, f"registered as {self.driver_name} on {self.node}"

    async def _health_loop(self) -> None:
        while True:
            if self.inventory.refresh():
                self._publish_inventory()
            if self.shim is not None:
                # Health and availability (claims prepared by another plugin instance too).
                self.shim.refresh()
            self.metrics.unhealthy_devices.set(self.inventory.unhealthy())
            self.metrics.prepared_devices.set(
                sum(len(c.devices) for c in self.ledger.claims() if c.state == "prepared")
            )
            await self.helper.publish_health(self.inventory.health())
            await asyncio.sleep(self.args.health_interval)

    async def run(self, stop: asyncio.Event) -> None:
        # Everything that rebuilds holds (DRA claims from their specs and the API server,
        # device-plugin holds from their specs and pod-resources) happens before either
        # API serves: a lost ledger must not hand out a device in use.
        counts = await self.driver.reconcile()
        if self.driver.metadata is not None:
            prepared = {c.uid for c in self.ledger.claims() if c.state == "prepared"}
            counts["metadata_specs"] = self.driver.metadata.restore(prepared)
        missing = await self._probe_slice_features()
        if self.host_devices.sources:
            await asyncio.to_thread(log_failures, self.config)
        forms = await self._choose_forms(missing)
        log.info(
            "starting",
            driver=self.driver_name,
            node=self.node,
            devices=len(self.inventory.devices),
            **counts,
            **forms,
        )
        http = HTTPEndpoint(
            build_app(self.ready, self.metrics.registry, "dradriver-kubeletplugin"),
            self.args.http_address,
        )
        if self.shim is not None:
            self.shim.reconcile_cdi()
        if self.hold_reconciler is not None:
            await self._hold_in_use(self.hold_reconciler.client)
            await self.hold_reconciler.prime()
        await http.start()
        if self.claim_status is not None:
            self.claim_status.start()
        await self.helper.start()
        if self.shim is not None:
            await self.shim.start()
        self.host_devices.start()
        tasks = [asyncio.create_task(self._health_loop())]
        if self.hold_reconciler is not None:
            tasks.append(asyncio.create_task(self.hold_reconciler.run()))
        # Claims the API server could not answer for at start, asked again with backoff.
        tasks.append(asyncio.create_task(self.driver.confirm_claims_later()))
        try:
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            self.host_devices.stop()
            if self.shim is not None:
                await self.shim.stop()
            await self.helper.stop()
            if self.claim_status is not None:
                await self.claim_status.stop()
            await http.stop()
            await self.client.aclose()


async def _main(args: argparse.Namespace) -> int:
    config = load_config(args.config) if args.config else DriverConfig()
    require(config)
    plugin = Plugin(args, config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await plugin.run(stop)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["doctor"]:
        return doctor_main(argv[1:])
    args = build_parser().parse_args(argv)
    configure(args.log_level)
    try:
        return asyncio.run(_main(args))
    except (
        DriverConfigError,
        DevicePluginSetupError,
        LedgerError,
        MissingCapabilities,
        MockDeviceError,
        UsageError,
    ) as e:
        print(f"dradriver-kubeletplugin: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
