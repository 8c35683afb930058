"""dradriver.metrics: the exposition is read back by an independent parser.

``prometheus_client`` (a dev dependency) serves twice: its text-format parser reads
what :mod:`dradriver.metrics` writes, and its own ``generate_latest`` for the same
metrics and updates is the reference the output must equal byte for byte (but the
creation timestamps), so the series dashboards and ServiceMonitors read keep their
names, HELP and TYPE lines, label order and escaping.
"""

from __future__ import annotations

import math
import re
import sys
import threading
from collections.abc import Callable, Iterator

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from dradriver import metrics
from dradriver.metrics import CONTENT_TYPE, Counter, Gauge, Histogram, Registry

HOSTILE = 'a\\b\nc"d'  # a backslash, a newline and a double quote
go_string: Callable[[float], str] = floatToGoString  # prometheus_client's is untyped


def parsed(registry: Registry) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """sample name -> (sorted labels -> value), through prometheus_client's parser."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(registry.exposition().decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def exercise(lib: object, registry: object) -> None:
    """The same definitions and updates through either library (same constructor names)."""
    c = lib.Counter  # type: ignore[attr-defined]
    g = lib.Gauge  # type: ignore[attr-defined]
    h = lib.Histogram  # type: ignore[attr-defined]
    plain = c("t_plain_total", f"with {HOSTILE} in help", registry=registry)
    plain.inc()
    plain.inc(2.5)
    c("t_nosuffix", "a counter named without _total", registry=registry).inc(7)
    by = c("t_calls_total", "by service and method", ["service", "method"], registry=registry)
    by.labels("v1.DRAPlugin", "NodePrepareResources").inc()
    by.labels(method="Get", service=HOSTILE).inc(3)
    c("t_unused_total", "labelled, never used", ["x"], registry=registry)
    gauge = g("t_gauge", "plain gauge", registry=registry)
    gauge.set(10_000_000)
    gauge.dec(0.5)
    held = g("t_held", "by resource", ["resource", "health"], registry=registry)
    held.labels("r1", "Healthy").set(123_456_789.5)
    held.labels("r1", "Unhealthy").set(-2.25)
    held.labels("r2", "Healthy").inc()
    g("t_big", "exponents", registry=registry).set(1e22)
    g("t_small", "small values", registry=registry).set(1e-7)
    g("t_nan", "not a number", registry=registry).set(math.nan)
    g("t_inf", "infinite", registry=registry).set(-math.inf)
    buckets = (0.001, 0.0025, 0.01, 1, 2.5, 30)
    hist = h("t_seconds", "plain histogram", buckets=buckets, registry=registry)
    for v in (0.0005, 0.001, 0.002, 0.5, 3, 100):
        hist.observe(v)
    by_rpc = ["resource", "method"]
    rpc = h("t_rpc_seconds", "by resource", by_rpc, buckets=buckets, registry=registry)
    rpc.labels("r", "Allocate").observe(0.004)
    rpc.labels(resource="r", method="List").observe(40)
    with_inf = h("t_inf_seconds", "explicit +Inf", buckets=(1, math.inf), registry=registry)
    with_inf.observe(1)


CREATED = re.compile(r"^(\S+_created(?:\{.*\})?) \S+$", re.MULTILINE)


def without_creation_times(text: str) -> str:
    return CREATED.sub(r"\1 <time>", text)


def test_the_exposition_equals_prometheus_client_byte_for_byte_but_the_creation_times() -> None:
    ours = Registry()
    exercise(metrics, ours)
    theirs = prometheus_client.CollectorRegistry()
    exercise(prometheus_client, theirs)
    reference = without_creation_times(prometheus_client.generate_latest(theirs).decode())
    assert without_creation_times(ours.exposition().decode()) == reference
    # The reference is not trivially short: every kind, labels and _created families.
    assert "# TYPE t_nosuffix_total counter\n" in reference
    assert "# TYPE t_rpc_seconds_created gauge\n" in reference


def test_each_kind_reads_back_with_names_labels_and_values() -> None:
    registry = Registry()
    exercise(metrics, registry)
    samples = parsed(registry)
    assert samples["t_plain_total"] == {(): 3.5}
    assert samples["t_nosuffix_total"] == {(): 7.0}
    assert samples["t_calls_total"] == {
        (("method", "NodePrepareResources"), ("service", "v1.DRAPlugin")): 1.0,
        (("method", "Get"), ("service", HOSTILE)): 3.0,
    }
    assert "t_unused_total" not in samples  # a labelled family without children: no sample
    assert samples["t_gauge"] == {(): 9_999_999.5}
    assert samples["t_held"][(("health", "Unhealthy"), ("resource", "r1"))] == -2.25
    assert samples["t_held"][(("health", "Healthy"), ("resource", "r2"))] == 1.0
    assert samples["t_big"] == {(): 1e22} and samples["t_small"] == {(): 1e-7}
    assert math.isnan(samples["t_nan"][()]) and samples["t_inf"] == {(): -math.inf}
    assert set(samples["t_seconds_created"]) == {()}
    assert len(samples["t_calls_created"]) == 2  # one per child


def test_histogram_buckets_are_cumulative_and_inf_equals_count() -> None:
    registry = Registry()
    exercise(metrics, registry)
    samples = parsed(registry)
    buckets = {dict(k)["le"]: v for k, v in samples["t_seconds_bucket"].items()}
    assert buckets == {
        "0.001": 2.0,  # 0.0005 and 0.001 (the bound is inclusive)
        "0.0025": 3.0,
        "0.01": 3.0,
        "1.0": 4.0,
        "2.5": 4.0,
        "30.0": 5.0,
        "+Inf": 6.0,
    }
    assert samples["t_seconds_count"] == {(): 6.0}
    assert samples["t_seconds_sum"] == {(): pytest.approx(103.5035)}
    labelled = samples["t_rpc_seconds_bucket"]
    inf_list = labelled[(("le", "+Inf"), ("method", "List"), ("resource", "r"))]
    assert inf_list == samples["t_rpc_seconds_count"][(("method", "List"), ("resource", "r"))]
    assert labelled[(("le", "30.0"), ("method", "List"), ("resource", "r"))] == 0.0
    # An explicit +Inf bound is not doubled.
    inf_bounds = [dict(k)["le"] for k in samples["t_inf_seconds_bucket"]]
    assert inf_bounds == ["1.0", "+Inf"]


def test_help_text_and_label_values_are_escaped_and_read_back_unchanged() -> None:
    registry = Registry()
    Counter("t_total", f"help {HOSTILE}", ["v"], registry=registry).labels(HOSTILE).inc()
    text = registry.exposition().decode()
    assert '# HELP t_total help a\\\\b\\nc"d\n' in text  # a quote stays as is in HELP
    assert 't_total{v="a\\\\b\\nc\\"d"} 1.0\n' in text
    assert len(text.splitlines()) == 6  # a newline in a value never starts a line
    (family, _created) = list(text_string_to_metric_families(text))
    assert family.documentation == f"help {HOSTILE}"
    assert family.samples[0].labels == {"v": HOSTILE}


def test_a_label_value_that_is_not_unicode_text_does_not_break_the_scrape() -> None:
    registry = Registry()
    Gauge("t", "", ["v"], registry=registry).labels("bad\udcff").set(1)
    assert 't{v="bad?"} 1.0\n' in registry.exposition().decode()


@pytest.mark.parametrize(
    "value",
    [0.0, 1.0, -1.0, 0.1, 1e-7, 123456.0, 1234567.0, 12345678.9, 1e7, 1e15, 1e16, 1e22, -1e7],
)
def test_numbers_are_written_as_go_writes_them(value: float) -> None:
    registry = Registry()
    Gauge("t", "", registry=registry).set(value)
    assert registry.exposition().decode().splitlines()[-1] == f"t {go_string(value)}"


def test_the_content_type_is_the_text_format_0_0_4() -> None:
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"


def test_labels_by_position_or_name_and_every_wrong_call_refused() -> None:
    registry = Registry()
    family = Counter("t_total", "", ["a", "b"], registry=registry)
    assert family.labels("1", "2") is family.labels(b="2", a="1")
    assert family.labels(1, 2) is family.labels("1", "2")  # values are str()-ed
    unlabelled = Gauge("t_g", "", registry=registry)
    calls: dict[str, Callable[[], object]] = {
        "'t_total': 1 label values given, 2 expected": lambda: family.labels("1"),
        "'t_total': 3 label values given": lambda: family.labels("1", "2", "3"),
        "'t_total': labels ['a', 'c'] given": lambda: family.labels(a="1", c="2"),
        "'t_total': labels ['a'] given": lambda: family.labels(a="1"),
        "'t_total': label values by position or by name": lambda: family.labels("1", b="2"),
        "'t_total' has labels ['a', 'b']": lambda: family.inc(),
        "'t_g' has no labels": lambda: unlabelled.labels("x"),
        "a counter only goes up": lambda: family.labels("1", "2").inc(-1),
    }
    for message, call in calls.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            call()


@pytest.mark.parametrize(
    ("define", "named"),
    [
        (lambda r: Counter("1st_total", "", registry=r), "1st"),
        (lambda r: Gauge("a-b", "", registry=r), "a-b"),
        (lambda r: Gauge("a b", "", registry=r), "a b"),
        (lambda r: Gauge("", "", registry=r), "''"),
        (lambda r: Gauge("g", "", ["bad-label"], registry=r), "bad-label"),
        (lambda r: Gauge("g", "", ["__reserved"], registry=r), "__reserved"),
        (lambda r: Gauge("g", "", ["a", "a"], registry=r), "'a'"),
        (lambda r: Gauge("g", "", "ab", registry=r), "'g'"),
        (lambda r: Histogram("h", "", ["le"], buckets=(1,), registry=r), "'le'"),
        (lambda r: Histogram("h", "", buckets=(2, 1), registry=r), "'h'"),
        (lambda r: Histogram("h", "", buckets=(), registry=r), "'h'"),
        (lambda r: Histogram("h", "", buckets=(math.nan, 1), registry=r), "'h'"),
    ],
)
def test_invalid_names_and_buckets_are_refused_naming_them(define: object, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        define(Registry())  # type: ignore[operator]


def test_a_series_name_is_registered_once() -> None:
    registry = Registry()
    Counter("x_total", "", registry=registry)
    Histogram("h", "", buckets=(1,), registry=registry)
    for clash in (
        lambda: Counter("x", "", registry=registry),  # the same x_total
        lambda: Gauge("x_created", "", registry=registry),
        lambda: Gauge("h_bucket", "", registry=registry),
    ):
        with pytest.raises(ValueError, match="already registered"):
            clash()
    Counter("x_total", "", registry=Registry())  # another registry is another namespace


@pytest.fixture
def frequent_thread_switches() -> Iterator[None]:
    """Switch threads as often as possible, so that an unguarded read-add-write loses
    updates within a few thousand increments."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@pytest.mark.usefixtures("frequent_thread_switches")
def test_concurrent_updates_from_threads_sum_exactly() -> None:
    registry = Registry()
    counter = Counter("t_total", "", ["w"], registry=registry)
    gauge = Gauge("t_g", "", registry=registry)
    hist = Histogram("t_h", "", buckets=(0.5,), registry=registry)
    threads, rounds = 8, 20_000
    start = threading.Barrier(threads)

    def work() -> None:
        start.wait()
        child = counter.labels("shared")
        for _ in range(rounds):
            child.inc()
            gauge.inc(2)
            gauge.dec()
            hist.observe(1.0)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    samples = parsed(registry)
    assert samples["t_total"] == {(("w", "shared"),): threads * rounds}
    assert samples["t_g"] == {(): threads * rounds}
    assert samples["t_h_count"] == {(): threads * rounds}
    assert samples["t_h_sum"] == {(): threads * rounds}


def test_timers_and_in_progress_gauges() -> None:
    registry = Registry()
    hist = Histogram("t_seconds", "", buckets=(60,), registry=registry)
    in_flight = Gauge("t_in_flight", "", registry=registry)
    with in_flight.track_inprogress(), hist.time():
        assert parsed(registry)["t_in_flight"] == {(): 1.0}
    with pytest.raises(RuntimeError), in_flight.track_inprogress(), hist.time():
        raise RuntimeError("the block failed")  # still observed and decremented
    samples = parsed(registry)
    assert samples["t_in_flight"] == {(): 0.0}
    assert samples["t_seconds_count"] == {(): 2.0}
    assert samples["t_seconds_bucket"][(("le", "60.0"),)] == 2.0
