"""Prometheus metrics of the controller runtime, one registry per process (or test)."""

from __future__ import annotations

from dradriver.metrics import Counter, Gauge, Histogram, Registry

_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class RuntimeMetrics:
    """Queue, reconcile, informer and leader-election metrics, labelled by name."""

    def __init__(self, registry: Registry | None = None) -> None:
        self.registry = registry or Registry()
        r = self.registry
        self.queue_depth = Gauge(
            "dradriver_workqueue_depth", "Keys waiting in the queue", ["name"], registry=r
        )
        self.queue_adds = Counter(
            "dradriver_workqueue_adds_total", "Keys added to the queue", ["name"], registry=r
        )
        self.queue_retries = Counter(
            "dradriver_workqueue_retries_total",
            "Keys re-added with backoff after a failure",
            ["name"],
            registry=r,
        )
        self.reconciles = Counter(
            "dradriver_reconcile_total",
            "Reconcile calls by result (success, error, requeue)",
            ["controller", "result"],
            registry=r,
        )
        self.reconcile_seconds = Histogram(
            "dradriver_reconcile_seconds",
            "Time spent in one reconcile call",
            ["controller"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.informer_relists = Counter(
            "dradriver_informer_relists_total",
            "Full lists (initial, after 410 Gone, after list errors)",
            ["resource"],
            registry=r,
        )
        self.informer_watches = Counter(
            "dradriver_informer_watches_total", "Watch requests started", ["resource"], registry=r
        )
        self.informer_events = Counter(
            "dradriver_informer_events_total",
            "Watch events received, by type",
            ["resource", "type"],
            registry=r,
        )
        self.informer_skipped = Counter(
            "dradriver_informer_skipped_total",
            "Objects left out of the cache: reason too_deep (nested deeper than the decoder's"
            " limit) or malformed (not an object, no metadata or name)",
            ["resource", "reason"],
            registry=r,
        )
        self.informer_synced = Gauge(
            "dradriver_informer_synced",
            "1 once the first list was delivered",
            ["resource"],
            registry=r,
        )
        self.leader = Gauge(
            "dradriver_leader", "1 while this process holds the lease", ["lease"], registry=r
        )
        self.leader_acquisitions = Counter(
            "dradriver_leader_acquisitions_total",
            "Times this process acquired the lease",
            ["lease"],
            registry=r,
        )
