"""bench/plots.py: the figures read back from the benchmarks page, the results shape, the
plots drawn from it, and the committed results matching the page."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import plots
from bench.suite import BEGIN, END
from devtools import paths

PAGE = paths.REPO / "docs" / "benchmarks.md"
IMG = paths.REPO / "docs" / "img" / "bench"

SECTION = f"""intro
{BEGIN}

Measured 2026-01-02 03:04 UTC by `make bench` (`python -m bench`).

#### `bench.prepare` (`python -m bench.prepare`, 27 s)

```text
scenario                       | ours p50 | ours p99 | go p50 | go p99 | ours/go p50
-------------------------------+----------+----------+--------+--------+------------
prepare, 1 claim, sequential   |     7.01 |     9.65 |   4.46 |   6.77 |        1.57
unprepare, 1 claim, sequential |     2.99 |     3.90 |   1.36 |   2.84 |        2.20

wall time
```

#### `bench.controller_allocation` (`python -m bench.controller_allocation`, 186 s)

```text
path                          | client limits | allocated   |           rate | p50 ms
------------------------------+---------------+-------------+----------------+-------
dradriver-controller (claims) | none          | 1000 claims | 1,209.0 claims/s | 1717.2
kube-scheduler (pods)         | QPS 1000      | 1000 pods   |   102.5 pods/s | 4593.0
```
{END}
"""


def test_the_printed_tables_are_read_back() -> None:
    results = plots.parse(SECTION)
    assert results["measured"].startswith("Measured 2026-01-02 03:04 UTC")
    assert results["latency"] == [
        {"scenario": "prepare, 1 claim, sequential", "ours_p50": 7.01, "ours_p99": 9.65,
         "go_p50": 4.46, "go_p99": 6.77},
        {"scenario": "unprepare, 1 claim, sequential", "ours_p50": 2.99, "ours_p99": 3.9,
         "go_p50": 1.36, "go_p99": 2.84},
    ]  # fmt: skip
    (rate,) = results["rates"]
    assert (rate["controller_per_s"], rate["scheduler_per_s"]) == (1209.0, 102.5)
    assert results["scale"] == []


def test_a_page_without_the_section_is_refused() -> None:
    with pytest.raises(ValueError, match="no performance section"):
        plots.parse("no markers here")


def test_results_files_merge_and_must_have_the_version() -> None:
    point = {"nodes": 100, "claims": 500, "controller_per_s": 34.0, "scheduler_per_s": 11.4,
             "controller_rss_mib": 73.0, "scheduler_rss_mib": 147.0}  # fmt: skip
    merged = plots.merge(plots.parse(SECTION), {"version": 1, "scale": [point]})
    assert merged["scale"] == [point]
    labels = [r["label"] for r in plots.all_rates(merged)]
    assert labels[-1] == "N = 100, 500 claims (bench.scale)"
    with pytest.raises(ValueError, match="results version 2"):
        plots.merge(merged, {"version": 2})


def test_plots_are_drawn_with_their_labels(tmp_path: Path) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text(SECTION)
    assert plots.cli([str(page), "--out", str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == [
        "allocation-rates.svg",
        "prepare-latency.svg",
        "results.json",
    ]  # no bench.scale results: no scale plot
    assert "unprepare, 1 claim, sequential" in (out / "prepare-latency.svg").read_text()
    assert "kube-scheduler (pods/s)" in (out / "allocation-rates.svg").read_text()
    assert json.loads((out / "results.json").read_text()) == plots.parse(SECTION)


def test_committed_results_are_the_pages_figures() -> None:
    """`make bench` redraws the plots; the committed results must match the page."""
    recorded = json.loads((IMG / "scale-recorded.json").read_text())
    wanted = plots.merge(plots.parse(PAGE.read_text()), recorded)
    assert json.loads((IMG / "results.json").read_text()) == wanted
    for name in ("prepare-latency.svg", "allocation-rates.svg", "scale.svg"):
        assert (IMG / name).is_file()
        assert f"img/bench/{name}" in PAGE.read_text()
