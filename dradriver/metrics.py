"""Prometheus metrics: counters, gauges and histograms with labels, and their text exposition.

The driver's processes need three metric kinds and one output format (the text
format 0.0.4 served on /metrics), nothing else. ``prometheus_client`` offers that and
much more, and importing it cost each app about 2 MiB of memory (measured after
importing the kubelet plugin and the controller), most of it standard-library modules
its exposition module loads (http.server, http.client, email, urllib.request, wsgiref)
and the driver never calls: the kubelet plugin runs on every node.

The output keeps what ``prometheus_client``'s ``generate_latest`` wrote for the same
metrics, byte for byte except the creation timestamps, so dashboards, alerts and the
chart's ServiceMonitors read the same series: a counter ``x`` or ``x_total`` is the
family ``x_total`` (HELP and TYPE lines included) with a ``x_created`` gauge family after
it; a histogram ``h`` has ``h_bucket`` lines (cumulative, ``le`` up to ``+Inf``),
``h_count`` and ``h_sum``, then ``h_created``; labels are written sorted by name; numbers
are written the way Go's Prometheus libraries write them (``1.0``, ``1e+07``,
``+Inf``). Families appear in the order they were defined, children in the order
their label values were first used. A family with labels and no child yet has its
HELP and TYPE lines only.

Metrics are updated from worker threads as well as the event loop: every child has
its own lock, and a family's lock guards only the creation of children.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ClassVar, Generic, TypeVar

# The text format's own content type (the body is version 0.0.4 whatever the client
# library's newest format is).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def _number(value: float) -> str:
    """``value`` as Go's Prometheus libraries write it: ``+Inf``, ``NaN``, ``1.0``, and an
    exponent from 1e+06 on where Python would still write the digits."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(value)
    point = text.find(".")
    if value <= 0 or point <= 6:
        return text  # small enough, or repr already chose an exponent (no point)
    digits = (text[1:point] + text[point + 1 :]).rstrip("0")
    mantissa = f"{text[0]}.{digits}" if digits else text[0]
    return f"{mantissa}e+{point - 1:02d}"


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label_value(text: str) -> str:
    # A lone surrogate (a str from an undecodable source) could not be encoded in the
    # UTF-8 body and would fail every scrape: it becomes "?" instead.
    text = text.encode("utf-8", "replace").decode("utf-8")
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _label_text(pairs: Sequence[tuple[str, str]]) -> str:
    """``{a="1",b="2"}`` from (name, escaped value) pairs, sorted by name; empty if none."""
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(pairs)) + "}"


class Registry:
    """The families one /metrics endpoint serves, in the order they were defined.

    One registry per process (or per test): there is no process-wide default.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: list[_Family[Any]] = []
        self._names: set[str] = set()

    def register(self, family: _Family[Any]) -> None:
        """Add ``family``; ValueError if one of the series names it writes is taken."""
        names = family.series_names()
        with self._lock:
            taken = sorted(names & self._names)
            if taken:
                raise ValueError(f"metric {family.name!r}: series {taken} already registered")
            self._names |= names
            self._families.append(family)

    def exposition(self) -> bytes:
        """Every family in the text exposition format 0.0.4 (:data:`CONTENT_TYPE`)."""
        with self._lock:
            families = list(self._families)
        lines: list[str] = []
        for family in families:
            family.write(lines)
        return "".join(lines).encode("utf-8")


Child = TypeVar("Child")


class _Family(Generic[Child]):
    """One metric name with its label names; its children hold the values, one per
    combination of label values (a family without labels has exactly one)."""

    kind: ClassVar[str]

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        registry: Registry,
    ) -> None:
        if not _METRIC_NAME.fullmatch(name):
            raise ValueError(f"invalid metric name {name!r}")
        if isinstance(labelnames, str):
            raise ValueError(f"metric {name!r}: label names must be a sequence, not a string")
        labelnames = tuple(labelnames)
        for label in labelnames:
            if not _LABEL_NAME.fullmatch(label) or label.startswith("__"):
                raise ValueError(f"metric {name!r}: invalid label name {label!r}")
            if label in self._reserved_labels():
                raise ValueError(f"metric {name!r}: label name {label!r} is reserved")
        if len(set(labelnames)) != len(labelnames):
            raise ValueError(f"metric {name!r}: duplicate label names in {labelnames!r}")
        self.name = name
        self.documentation = documentation
        self.labelnames: tuple[str, ...] = labelnames
        self._lock = threading.Lock()
        self._children: dict[tuple[str, ...], Child] = {}
        # Each child's labels as (name, escaped value) pairs, computed once.
        self._label_pairs: dict[tuple[str, ...], tuple[tuple[str, str], ...]] = {}
        if not labelnames:
            self._child(())
        registry.register(self)

    def _reserved_labels(self) -> frozenset[str]:
        return frozenset()

    def series_names(self) -> set[str]:
        """Every name this family writes samples or HELP lines under."""
        return {self.name}

    def _new_child(self) -> Child:
        raise NotImplementedError

    def _child(self, values: tuple[str, ...]) -> Child:
        child = self._children.get(values)
        if child is not None:
            return child
        with self._lock:
            child = self._children.get(values)
            if child is None:
                self._label_pairs[values] = tuple(
                    (k, _escape_label_value(v))
                    for k, v in zip(self.labelnames, values, strict=True)
                )
                child = self._children[values] = self._new_child()
            return child

    def labels(self, *values: object, **by_name: object) -> Child:
        """The child for these label values, given in the order of the label names or by
        name (not both); created on first use. ValueError for a wrong count or name."""
        if not self.labelnames:
            raise ValueError(f"metric {self.name!r} has no labels")
        if values and by_name:
            raise ValueError(f"metric {self.name!r}: label values by position or by name, not both")
        if by_name:
            if set(by_name) != set(self.labelnames):
                raise ValueError(
                    f"metric {self.name!r}: labels {sorted(by_name)} given, "
                    f"{list(self.labelnames)} expected"
                )
            values = tuple(by_name[k] for k in self.labelnames)
        elif len(values) != len(self.labelnames):
            raise ValueError(
                f"metric {self.name!r}: {len(values)} label values given, "
                f"{len(self.labelnames)} expected ({', '.join(self.labelnames)})"
            )
        return self._child(tuple(str(v) for v in values))

    def _only(self) -> Child:
        """The one child of a family without labels."""
        if self.labelnames:
            raise ValueError(
                f"metric {self.name!r} has labels {list(self.labelnames)}: use .labels(...)"
            )
        return self._children[()]

    def _snapshot(self) -> list[tuple[tuple[tuple[str, str], ...], Child]]:
        with self._lock:
            return [(self._label_pairs[k], c) for k, c in self._children.items()]

    def _head(self, lines: list[str], name: str, kind: str) -> None:
        lines.append(f"# HELP {name} {_escape_help(self.documentation)}\n")
        lines.append(f"# TYPE {name} {kind}\n")

    def write(self, lines: list[str]) -> None:
        raise NotImplementedError


def _write_created(
    lines: list[str], family: _Family[Child], base_name: str, created: list[tuple[str, float]]
) -> None:
    """The ``_created`` gauge family that follows a counter or a histogram (one sample per
    child; nothing while a labelled family has no child)."""
    if not created:
        return
    name = f"{base_name}_created"
    family._head(lines, name, "gauge")
    lines.extend(f"{name}{labels} {_number(at)}\n" for labels, at in created)


class CounterValue:
    """A value that only goes up (one child of a :class:`Counter`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"a counter only goes up: inc({amount!r})")
        with self._lock:
            self._value += amount

    def get(self) -> float:
        with self._lock:
            return self._value


class Counter(_Family[CounterValue]):
    """Written as ``<name>_total``: a ``_total`` suffix on ``name`` is optional."""

    kind = "counter"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        registry: Registry,
    ) -> None:
        self.base_name = name.removesuffix("_total")
        super().__init__(name, documentation, labelnames, registry=registry)

    def series_names(self) -> set[str]:
        base = self.base_name
        return {base, f"{base}_total", f"{base}_created"}

    def _new_child(self) -> CounterValue:
        return CounterValue()

    def inc(self, amount: float = 1.0) -> None:
        self._only().inc(amount)

    def write(self, lines: list[str]) -> None:
        name = f"{self.base_name}_total"
        self._head(lines, name, "counter")
        created: list[tuple[str, float]] = []
        for pairs, child in self._snapshot():
            labels = _label_text(pairs)
            lines.append(f"{name}{labels} {_number(child.get())}\n")
            created.append((labels, child.created))
        _write_created(lines, self, self.base_name, created)


class GaugeValue:
    """A value that goes up and down (one child of a :class:`Gauge`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value = 0.0

    def set(self, value: float) -> None:
        with self._lock:
            self._value = float(value)

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self._value += amount

    def dec(self, amount: float = 1.0) -> None:
        with self._lock:
            self._value -= amount

    def get(self) -> float:
        with self._lock:
            return self._value

    @contextmanager
    def track_inprogress(self) -> Iterator[None]:
        """Up by one while the block runs."""
        self.inc()
        try:
            yield
        finally:
            self.dec()


class Gauge(_Family[GaugeValue]):
    kind = "gauge"

    def _new_child(self) -> GaugeValue:
        return GaugeValue()

    def set(self, value: float) -> None:
        self._only().set(value)

    def inc(self, amount: float = 1.0) -> None:
        self._only().inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        self._only().dec(amount)

    def track_inprogress(self) -> AbstractContextManager[None]:
        return self._only().track_inprogress()

    def write(self, lines: list[str]) -> None:
        self._head(lines, self.name, "gauge")
        for pairs, child in self._snapshot():
            lines.append(f"{self.name}{_label_text(pairs)} {_number(child.get())}\n")


class HistogramValue:
    """Observations counted in fixed buckets, with their sum (one child of a
    :class:`Histogram`). Each observation is counted once, in the first bucket whose
    upper bound holds it; the exposition adds them up."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._lock = threading.Lock()
        self._bounds = bounds
        self._counts = [0] * len(bounds)
        self._sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        # The first bound >= value; NaN, which compares false with every bound, goes to +Inf.
        index = min(bisect.bisect_left(self._bounds, value), len(self._bounds) - 1)
        with self._lock:
            self._counts[index] += 1
            self._sum += value

    @contextmanager
    def time(self) -> Iterator[None]:
        """Observes how long the block took, in seconds."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.observe(time.perf_counter() - started)

    def get(self) -> tuple[list[int], float]:
        """(count per bucket, not cumulative; sum)."""
        with self._lock:
            return list(self._counts), self._sum


class Histogram(_Family[HistogramValue]):
    """``buckets`` are the upper bounds, increasing; ``+Inf`` is added if missing."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: Registry,
    ) -> None:
        bounds = tuple(float(b) for b in buckets)
        if bounds and bounds[-1] != math.inf:
            bounds = (*bounds, math.inf)
        increasing = all(a < b for a, b in itertools.pairwise(bounds))  # False with a NaN
        if len(bounds) < 2 or not increasing:
            raise ValueError(f"metric {name!r}: buckets {list(buckets)} must increase")
        self.bounds = bounds
        self._le = tuple(_number(b) for b in bounds)
        super().__init__(name, documentation, labelnames, registry=registry)

    def _reserved_labels(self) -> frozenset[str]:
        return frozenset({"le"})

    def series_names(self) -> set[str]:
        return {self.name} | {f"{self.name}_{s}" for s in ("bucket", "count", "sum", "created")}

    def _new_child(self) -> HistogramValue:
        return HistogramValue(self.bounds)

    def observe(self, value: float) -> None:
        self._only().observe(value)

    def time(self) -> AbstractContextManager[None]:
        return self._only().time()

    def write(self, lines: list[str]) -> None:
        self._head(lines, self.name, "histogram")
        created: list[tuple[str, float]] = []
        for pairs, child in self._snapshot():
            counts, total = child.get()
            cumulative = 0
            for le, count in zip(self._le, counts, strict=True):
                cumulative += count
                labels = _label_text((*pairs, ("le", le)))
                lines.append(f"{self.name}_bucket{labels} {_number(float(cumulative))}\n")
            labels = _label_text(pairs)
            lines.append(f"{self.name}_count{labels} {_number(float(cumulative))}\n")
            lines.append(f"{self.name}_sum{labels} {_number(total)}\n")
            created.append((labels, child.created))
        _write_created(lines, self, self.name, created)
