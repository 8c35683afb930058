"""A smoke run of the fault suite (``python -m bench.faults --quick``).

The suite starts an isolated cluster of its own (free ports, a temporary state dir, no
kubelet), so it neither needs nor touches the shared one. What is checked is correctness,
never timing: the table is printed with a row for every fault, every figure promised to
be 0 is 0 (no leaked, doubled or lost device, no orphan spec, no claim torn down, no
allocation lost or duplicated), and every claim of another driver was admitted while the
hostile objects were processed. The latency column is printed, not asserted.
"""

from __future__ import annotations

import re

import pytest

from bench import faults

HEADER = ["fault", "runs", "metric", "value", "promised"]
FAULTS = ("(a) ", "(b) ", "(c) ", "(d) ", "(e) ", "(f) ")


def table_rows(out: str) -> list[list[str]]:
    lines = out.splitlines()
    start = next(
        i for i, line in enumerate(lines) if [c.strip() for c in line.split("|")] == HEADER
    )
    rows = []
    for line in lines[start + 2 :]:
        if "|" not in line:
            break
        rows.append([c.strip() for c in line.split("|")])
    return rows


def test_quick_fault_suite_prints_the_table_with_zeros_where_promised(
    capsys: pytest.CaptureFixture[str],
) -> None:
    faults.main(["--quick"])
    rows = table_rows(capsys.readouterr().out)
    for prefix in FAULTS:
        assert any(r[0].startswith(prefix) for r in rows), f"no row for fault {prefix}"
    zero_rows = [r for r in rows if r[4] == "0"]
    assert len(zero_rows) >= 16  # (a) 5, (b) 2, (c) 4, (d) 3, (f) 2
    assert [r for r in zero_rows if r[3] != "0"] == []
    admitted = [r for r in rows if r[4] == "all"]
    assert len(admitted) == 4  # one per hostile object
    for r in admitted:
        match = re.fullmatch(r"(\d+)/(\d+)", r[3])
        assert match is not None and int(match[2]) > 0, r
        assert match[1] == match[2], r
