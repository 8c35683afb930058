"""The benchmark suite (bench/suite.py): every module in bench/ follows the convention, the
benchmarks that need no cluster run at their smoke sizes and print a table, and the README
section is written between its markers. No timing is checked."""

from __future__ import annotations

import pkgutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

import bench
from bench.suite import BEGIN, END, Bench, Run, discover, has_table, run, section, write_section


def test_every_benchmark_module_is_found_with_its_smoke_arguments() -> None:
    found = {b.name: b for b in discover()}
    modules = {m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_")}
    # fault_*: rows of bench.faults in modules of their own (fault_webhook also runs alone)
    helpers = {"common", "suite", "faultproxy", "torture_checks", "plots"}
    helpers |= {"scale_phases", "scale_profile", "scale_report"}
    helpers |= {m for m in modules if m.startswith("fault_")} - {"fault_webhook"}
    assert set(found) == modules - helpers  # a module with main() but no SMOKE_ARGS raises
    assert found["controller_allocation"].cluster == "own"
    assert found["scale"].cluster == "own"
    assert found["faults"].own_smoke_test == "tests/isolated/test_bench_faults.py"
    assert all(b.smoke_args for b in found.values())


@pytest.mark.parametrize("name", [b.name for b in discover() if b.cluster == "none"])
def test_smoke_run_of_a_benchmark_without_a_cluster(name: str) -> None:
    b = next(b for b in discover() if b.name == name)
    result = run(b, b.smoke_args, timeout=300)
    assert result.ok, result.output[-3000:]
    assert has_table(result.output), result.output[-3000:]


def test_the_performance_section_goes_between_the_markers(tmp_path: Path) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text(f"# x\n\nbefore\n{BEGIN}\nold figures\n{END}\nafter\n")
    fake = Bench("allocator", "none", ())
    runs = [Run(fake, ("--claims", "1"), 0, "a | b\n--+--\n1 | 2\n", 1.5)]
    write_section(page, section(runs, datetime(2026, 12, 1, 14, 0, tzinfo=UTC)))
    text = page.read_text()
    assert "old figures" not in text
    assert text.startswith("# x\n\nbefore\n" + BEGIN) and text.endswith(END + "\nafter\n")
    assert "Measured 2026-12-01 14:00 UTC" in text and "Machine: " in text
    assert "Versions: dradriver " in text and "Kubernetes v" in text
    assert "`python -m bench.allocator --claims 1`" in text and "1 | 2" in text


def test_a_page_without_markers_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text("# x\n")
    with pytest.raises(ValueError, match="markers"):
        write_section(page, section([]))
