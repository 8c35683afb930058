"""Prometheus metrics of the kubelet plugin (served on /metrics)."""

from __future__ import annotations

from dradriver.metrics import Counter, Gauge, Histogram, Registry
from dradriver.plugin.claims import ClaimMetrics

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class PluginMetrics:
    """One registry per plugin instance, so tests can run several side by side."""

    def __init__(self, registry: Registry | None = None) -> None:
        self.registry = registry or Registry()
        r = self.registry
        self.prepares = Counter("dradriver_prepare_total", "Claims prepared", registry=r)
        self.prepare_errors = Counter(
            "dradriver_prepare_errors_total", "Claims that failed to prepare", registry=r
        )
        self.unprepares = Counter("dradriver_unprepare_total", "Claims unprepared", registry=r)
        self.unprepare_errors = Counter(
            "dradriver_unprepare_errors_total", "Claims that failed to unprepare", registry=r
        )
        self.prepare_seconds = Histogram(
            "dradriver_prepare_seconds", "Time to prepare one claim", buckets=_BUCKETS, registry=r
        )
        self.unprepare_seconds = Histogram(
            "dradriver_unprepare_seconds",
            "Time to unprepare one claim",
            buckets=_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "dradriver_prepare_in_flight", "Prepare calls in progress", registry=r
        )
        self.prepared_devices = Gauge(
            "dradriver_prepared_devices", "Devices held by prepared claims", registry=r
        )
        self.slice_writes = Counter(
            "dradriver_resourceslice_writes_total", "ResourceSlice API writes", registry=r
        )
        self.kubelet_calls = Counter(
            "dradriver_kubelet_calls_total",
            "Calls the kubelet made, by service (e.g. v1.DRAPlugin, v1alpha1.DRAResourceHealth) "
            "and method: which API versions this node's kubelet uses",
            ["service", "method"],
            registry=r,
        )
        self.registrations = Counter(
            "dradriver_kubelet_registrations_total", "Successful kubelet registrations", registry=r
        )
        self.unhealthy_devices = Gauge(
            "dradriver_unhealthy_devices", "Devices currently unhealthy", registry=r
        )
        self._device_plugin_families(r)

    @property
    def claims(self) -> ClaimMetrics:
        """The per-claim families, for the framework's claim runner."""
        return ClaimMetrics(
            prepares=self.prepares,
            prepare_errors=self.prepare_errors,
            prepare_seconds=self.prepare_seconds,
            in_flight=self.in_flight,
            unprepares=self.unprepares,
            unprepare_errors=self.unprepare_errors,
            unprepare_seconds=self.unprepare_seconds,
        )

    def _device_plugin_families(self, r: Registry) -> None:
        """The device-plugin shim's (label ``resource`` is the extended resource name)."""
        self.dp_allocations = Counter(
            "dradriver_deviceplugin_allocations_total",
            "Containers given devices through the device-plugin API",
            ["resource"],
            registry=r,
        )
        self.dp_allocation_errors = Counter(
            "dradriver_deviceplugin_allocation_errors_total",
            "Allocate calls refused (reason: busy = held through DRA, invalid, internal)",
            ["resource", "reason"],
            registry=r,
        )
        self.dp_rpc_seconds = Histogram(
            "dradriver_deviceplugin_rpc_seconds",
            "Device-plugin RPCs served to the kubelet",
            ["resource", "method"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.dp_registrations = Counter(
            "dradriver_deviceplugin_registrations_total",
            "Successful registrations with the kubelet's device manager (reason: initial, "
            "kubelet-restart, socket-removed)",
            ["resource", "reason"],
            registry=r,
        )
        self.dp_registered = Gauge(
            "dradriver_deviceplugin_registered",
            "1 while the kubelet has accepted the resource's registration",
            ["resource"],
            registry=r,
        )
        self.dp_devices = Gauge(
            "dradriver_deviceplugin_devices",
            "Devices reported in ListAndWatch by health (Unhealthy includes devices held "
            "through DRA)",
            ["resource", "health"],
            registry=r,
        )
        self.dp_holds = Gauge(
            "dradriver_deviceplugin_holds",
            "Device-plugin allocations recorded in the ledger",
            ["resource"],
            registry=r,
        )
        self.dp_releases = Counter(
            "dradriver_deviceplugin_releases_total",
            "Device-plugin holds released after pod-resources no longer reported them",
            ["resource", "reason"],
            registry=r,
        )
        self.dp_prestart = Counter(
            "dradriver_deviceplugin_prestart_total",
            "PreStartContainer hook runs (result: ok, error)",
            ["resource", "result"],
            registry=r,
        )
        self.dp_conflicts = Counter(
            "dradriver_deviceplugin_conflicts_total",
            "Devices found in use through the device plugin while the ledger gives them to "
            "a DRA claim (a double allocation; must stay 0)",
            registry=r,
        )
        self.dp_pod_resources_polls = Counter(
            "dradriver_deviceplugin_pod_resources_polls_total",
            "Successful pod-resources List calls that device-plugin holds were reconciled with",
            registry=r,
        )
        self.dp_pod_resources_errors = Counter(
            "dradriver_deviceplugin_pod_resources_errors_total",
            "Failed pod-resources List calls",
            registry=r,
        )
