"""Plots of the benchmarks' results for docs/benchmarks.md (``make bench`` runs this last).

``python -m bench.plots docs/benchmarks.md [--out DIR] [--results FILE.json ...]``

The benchmarks print tables; ``make bench`` writes their output into the performance
section of docs/benchmarks.md. This module reads the figures back from that section into
a results file of a fixed shape (:class:`Results`, written as ``results.json`` next to the
plots), merges any results files given with ``--results`` (a benchmark that writes the
shape itself needs no parsing), and draws:

* ``prepare-latency.svg``: NodePrepare/NodeUnprepareResources p50 and p99, ours vs the Go
  reference (``bench.prepare``);
* ``allocation-rates.svg``: claims/s of the controller vs pods/s of kube-scheduler, per run
  (``bench.controller_allocation``, and each N of ``bench.scale``);
* ``scale.svg``: those rates and the processes' RSS against the node count
  (``bench.scale``; drawn only when its results are there).

The results shape (``version`` 1), every list optional::

    {"version": 1, "measured": "Measured ... UTC by `make bench` ...",
     "latency": [{"scenario": str, "ours_p50": ms, "ours_p99": ms, "go_p50": ms, "go_p99": ms}],
     "rates": [{"source": str, "label": str, "controller_per_s": float,
                "scheduler_per_s": float}],
     "scale": [{"nodes": int, "claims": int, "controller_per_s": float,
                "scheduler_per_s": float, "controller_rss_mib": float,
                "scheduler_rss_mib": float}]}

The entry point is :func:`cli`, not ``main``: bench.suite treats a module with ``main`` as a
benchmark.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

from bench.suite import BEGIN, END
from devtools.docs.pages import between_markers

VERSION = 1


class Latency(TypedDict):
    scenario: str
    ours_p50: float
    ours_p99: float
    go_p50: float
    go_p99: float


class Rate(TypedDict):
    source: str
    label: str
    controller_per_s: float
    scheduler_per_s: float


class ScalePoint(TypedDict):
    nodes: int
    claims: int
    controller_per_s: float
    scheduler_per_s: float
    controller_rss_mib: float
    scheduler_rss_mib: float


class Results(TypedDict):
    version: int
    measured: str
    latency: list[Latency]
    rates: list[Rate]
    scale: list[ScalePoint]


def empty() -> Results:
    return {"version": VERSION, "measured": "", "latency": [], "rates": [], "scale": []}


def section_text(page: str) -> str:
    start, stop = between_markers(page, BEGIN, END, "performance section")
    return page[start:stop]


def outputs(section: str) -> dict[str, str]:
    """Each benchmark's printed output in the section, by module name."""
    found: dict[str, str] = {}
    pattern = re.compile(r"^#{2,6} `(bench\.\w+)`.*?\n\n```text\n(.*?)^```", re.M | re.S)
    for match in pattern.finditer(section):
        found[match[1]] = match[2]
    return found


def _table(text: str, first_header: str) -> list[dict[str, str]]:
    """The rows of the ``|``-separated table whose header starts with ``first_header``."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.split("|")]
        if cells and cells[0] == first_header and len(cells) > 1:
            rows = []
            for row in lines[i + 2 :]:
                if "|" not in row:
                    break
                values = [c.strip() for c in row.split("|")]
                rows.append(dict(zip(cells, values, strict=False)))
            return rows
    return []


def _number(text: str) -> float:
    match = re.search(r"-?[0-9][0-9,]*(?:\.[0-9]+)?", text)
    if match is None:
        raise ValueError(f"no number in {text!r}")
    return float(match[0].replace(",", ""))


def parse_prepare(output: str) -> list[Latency]:
    return [
        {
            "scenario": row["scenario"],
            "ours_p50": _number(row["ours p50"]),
            "ours_p99": _number(row["ours p99"]),
            "go_p50": _number(row["go p50"]),
            "go_p99": _number(row["go p99"]),
        }
        for row in _table(output, "scenario")
        if "ours p50" in row
    ]


def parse_controller_allocation(output: str) -> list[Rate]:
    rows = {row["path"].split()[0]: row for row in _table(output, "path")}
    controller, scheduler = rows.get("dradriver-controller"), rows.get("kube-scheduler")
    if controller is None or scheduler is None:
        return []
    label = f"{controller['allocated']} (bench.controller_allocation)"
    return [
        {
            "source": "bench.controller_allocation",
            "label": label,
            "controller_per_s": _number(controller["rate"]),
            "scheduler_per_s": _number(scheduler["rate"]),
        }
    ]


def parse(page: str) -> Results:
    """The figures of docs/benchmarks.md's performance section."""
    section = section_text(page)
    results = empty()
    measured = re.search(r"^Measured .*$", section, re.M)
    results["measured"] = measured[0] if measured else ""
    found = outputs(section)
    if "bench.prepare" in found:
        results["latency"] = parse_prepare(found["bench.prepare"])
    if "bench.controller_allocation" in found:
        results["rates"] = parse_controller_allocation(found["bench.controller_allocation"])
    return results


def merge(base: Results, extra: dict[str, Any]) -> Results:
    """``base`` with the lists of a results file appended (its ``measured`` if base has none)."""
    if extra.get("version") != VERSION:
        raise ValueError(f"results version {extra.get('version')!r}, want {VERSION}")
    merged = empty()
    merged["measured"] = base["measured"] or str(extra.get("measured", ""))
    merged["latency"] = [*base["latency"], *extra.get("latency", [])]
    merged["rates"] = [*base["rates"], *extra.get("rates", [])]
    merged["scale"] = [*base["scale"], *extra.get("scale", [])]
    return merged


def all_rates(results: Results) -> list[Rate]:
    """The rates, with one per ``bench.scale`` point after them."""
    scaled: list[Rate] = [
        {
            "source": "bench.scale",
            "label": f"N = {p['nodes']}, {p['claims']} claims (bench.scale)",
            "controller_per_s": p["controller_per_s"],
            "scheduler_per_s": p["scheduler_per_s"],
        }
        for p in results["scale"]
    ]
    return [*results["rates"], *scaled]


def _figure(width: float, height: float) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "dradriver-bench"  # stable ids in the SVG
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: searchable, smaller
    from matplotlib import pyplot

    return pyplot.subplots(figsize=(width, height))


def _save(figure: Any, path: Path) -> None:
    from matplotlib import pyplot

    figure.tight_layout()
    figure.savefig(path, format="svg", metadata={"Date": None})
    pyplot.close(figure)


def plot_latency(results: Results, path: Path) -> None:
    rows = results["latency"]
    figure, axes = _figure(9, 0.55 * len(rows) + 2.0)
    names = [r["scenario"] for r in rows]
    ys = range(len(rows))
    height = 0.2
    series = (
        ("ours_p50", "dradriver p50", "#4a6fa5"),
        ("ours_p99", "dradriver p99", "#9db4d6"),
        ("go_p50", "Go reference p50", "#c0504d"),
        ("go_p99", "Go reference p99", "#e6a5a3"),
    )
    for k, (key, label, color) in enumerate(series):
        values = [float(r[key]) for r in rows]  # type: ignore[literal-required]
        axes.barh([y + (k - 1.5) * height for y in ys], values, height, label=label, color=color)
    axes.set_yticks(list(ys), names)
    axes.invert_yaxis()
    axes.set_xscale("log")
    axes.set_xlabel("ms (log scale; lower is better)")
    axes.set_title("Prepare and unprepare latency: dradriver vs the Go reference")
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=4, fontsize="small")
    _save(figure, path)


def plot_rates(results: Results, path: Path) -> None:
    rows = all_rates(results)
    figure, axes = _figure(9, 0.6 * len(rows) + 2.0)
    ys = range(len(rows))
    axes.barh([y - 0.2 for y in ys], [r["controller_per_s"] for r in rows], 0.4,
              label="dradriver-controller (claims/s)", color="#4a6fa5")  # fmt: skip
    axes.barh([y + 0.2 for y in ys], [r["scheduler_per_s"] for r in rows], 0.4,
              label="kube-scheduler (pods/s)", color="#c0504d")  # fmt: skip
    axes.set_yticks(list(ys), [r["label"] for r in rows])
    axes.invert_yaxis()
    axes.set_xlabel("allocations per second (higher is better)")
    axes.set_title("Allocation rate: the controller vs a fair kube-scheduler")
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2, fontsize="small")
    _save(figure, path)


def plot_scale(results: Results, path: Path) -> None:
    points = sorted(results["scale"], key=lambda p: (p["claims"], p["nodes"]))
    _figure(1, 1)  # the backend and the stable ids
    from matplotlib import pyplot

    pyplot.close("all")
    figure, (rates, rss) = pyplot.subplots(1, 2, figsize=(10, 3.8))
    for claims in sorted({p["claims"] for p in points}):
        run = [p for p in points if p["claims"] == claims]
        nodes = [p["nodes"] for p in run]
        rates.plot(
            nodes, [p["controller_per_s"] for p in run], "o-", label=f"controller, C={claims}"
        )
        rates.plot(
            nodes, [p["scheduler_per_s"] for p in run], "s--", label=f"scheduler, C={claims}"
        )
        rss.plot(
            nodes, [p["controller_rss_mib"] for p in run], "o-", label=f"controller, C={claims}"
        )
        rss.plot(
            nodes, [p["scheduler_rss_mib"] for p in run], "s--", label=f"scheduler, C={claims}"
        )
    for axes, label in ((rates, "allocations/s"), (rss, "RSS MiB")):
        axes.set_xscale("log")
        axes.set_xlabel("nodes (log scale)")
        axes.set_ylabel(label)
        axes.legend(fontsize="small")
    rates.set_title("Rate against node count")
    rss.set_title("Memory against node count")
    _save(figure, path)


def write(results: Results, out: Path) -> list[Path]:
    """``results.json`` and the plots the results have data for, into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "results.json"]
    written[0].write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    if results["latency"]:
        plot_latency(results, out / "prepare-latency.svg")
        written.append(out / "prepare-latency.svg")
    if all_rates(results):
        plot_rates(results, out / "allocation-rates.svg")
        written.append(out / "allocation-rates.svg")
    if results["scale"]:
        plot_scale(results, out / "scale.svg")
        written.append(out / "scale.svg")
    return written


def cli(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.plots", description=__doc__)
    parser.add_argument("page", type=Path, help="the page with the performance section")
    parser.add_argument("--out", type=Path, help="where to write (default: <page dir>/img/bench)")
    parser.add_argument("--results", type=Path, action="append", default=[],
                        help="a results file of the shape above, merged in")  # fmt: skip
    args = parser.parse_args(argv)
    results = parse(args.page.read_text())
    for extra in args.results:
        results = merge(results, json.loads(extra.read_text()))
    out = args.out or args.page.parent / "img" / "bench"
    for path in write(results, out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(cli())
