"""Where an immediate claim's time goes, stage by stage, as a Prometheus histogram.

``dradriver_controller_claim_stage_seconds{stage}``, one observation per claim and stage
(the names are in :mod:`dradriver.api.wellknown`):

* ``queued``: first seen by the claims informer (unallocated) -> its reconcile starts
  (the watch event's handler, the work queue, the workers busy with other claims);
* ``finalizer_write``: the finalizer patch, request to answer;
* ``turn``: waiting for the allocation turn (one search at a time, see the reconciler);
* ``search``: the allocator's search in the worker process, request to answer;
* ``status_write``: the ``status.allocation`` patch, request to answer;
* ``event``: the ``Allocated`` event;
* ``total``: first seen -> the status write answered.

The benchmark (``bench.controller_allocation``) prints them from ``/metrics``.
"""

from __future__ import annotations

import time

from dradriver.api.wellknown import CLAIM_STAGE_METRIC as METRIC
from dradriver.api.wellknown import CLAIM_STAGES as STAGES
from dradriver.metrics import Histogram, Registry

__all__ = ["METRIC", "STAGES", "StageTimes"]

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class StageTimes:
    """Observes the stages; ``first_seen`` is kept per claim key until its total is taken."""

    def __init__(self, registry: Registry | None = None) -> None:
        self.histogram = Histogram(
            METRIC,
            "Time of one stage of an immediate claim's allocation (controller/claims/stages.py)",
            ["stage"],
            buckets=_BUCKETS,
            registry=registry if registry is not None else Registry(),
        )
        self.first_seen: dict[str, float] = {}
        self._started: set[str] = set()

    def seen(self, key: str) -> None:
        """The informer shows claim ``key`` unallocated (only the first time counts)."""
        self.first_seen.setdefault(key, time.monotonic())

    def started(self, key: str) -> None:
        """A reconcile of ``key`` starts: the ``queued`` stage ends (once per claim)."""
        seen = self.first_seen.get(key)
        if seen is not None and key not in self._started:
            self._started.add(key)
            self.observe("queued", time.monotonic() - seen)

    def observe(self, stage: str, seconds: float) -> None:
        self.histogram.labels(stage).observe(seconds)

    def done(self, key: str) -> None:
        """Claim ``key``'s allocation is written: the ``total`` stage ends."""
        seen = self.first_seen.pop(key, None)
        self._started.discard(key)
        if seen is not None:
            self.observe("total", time.monotonic() - seen)

    def forget(self, key: str) -> None:
        self.first_seen.pop(key, None)
        self._started.discard(key)
