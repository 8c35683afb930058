"""Prometheus metrics of the kubelet plugin (served on /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class PluginMetrics:
    """One registry per plugin instance, so tests can run several side by side."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
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
        self.registrations = Counter(
            "dradriver_kubelet_registrations_total", "Successful kubelet registrations", registry=r
        )
        self.unhealthy_devices = Gauge(
            "dradriver_unhealthy_devices", "Devices currently unhealthy", registry=r
        )
