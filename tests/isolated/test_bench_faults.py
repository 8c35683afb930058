"""A smoke run of the fault suite (``python -m bench.faults --quick``).

The suite starts an isolated cluster of its own (free ports, a temporary state dir, no
kubelet), so it neither needs nor touches the shared one. What is checked is correctness,
never timing: the table is printed with a row for every fault, every figure promised to
be 0 is 0 (no leaked, doubled or lost device, no orphan spec, no claim torn down, no
allocation lost or duplicated, no request failed across a certificate swap), every claim of
another driver was admitted while the hostile objects were processed, a huge POST got 413
and the swapped certificate was served. The latency column is printed, not asserted.
"""

from __future__ import annotations

import re

import pytest

from bench import faults

HEADER = ["fault", "runs", "metric", "value", "promised"]
FAULTS: tuple[str, ...] = ("(a) ", "(b) ", "(c) ", "(d) ", "(e) ")
FAULTS += ("(f0) ", "(f1) ", "(f2) ", "(f4) ", "(f5) ", "(f6) ")  # issue 21's findings


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
    assert any(r[0].startswith("(f3) ") for r in rows), "no row for fault (f3)"
    zero_rows = [r for r in rows if r[4] == "0"]
    assert len(zero_rows) >= 22  # (a) 5, (b) 2, (c) 4, (d) 3, (f0) 2, (f1) 3, (f5) 1, (f6) 2
    assert [r for r in zero_rows if r[3] != "0"] == []
    scope = [r for r in rows if r[0].startswith("(f1) ")]
    assert [r[3] for r in scope if r[4] == "0"] == ["0", "0", "0"]  # taken, finalized, annotated
    assert [r[3] for r in scope if r[4] == "1"] == ["1"]  # one event per claim left alone
    admitted = [r for r in rows if r[4] == "all"]
    assert len(admitted) == 4  # one per hostile object
    for r in admitted:
        match = re.fullmatch(r"(\d+)/(\d+)", r[3])
        assert match is not None and int(match[2]) > 0, r
        assert match[1] == match[2], r
    # Every claim of the other namespace was allocated (the latency is printed only).
    fair = [r for r in rows if r[0].startswith("(f2) ")]
    assert len(fair) == 2 and all(re.fullmatch(r"\d+\.\d\d", r[3]) for r in fair), fair
    # (f4): the huge POST is refused before it is read, with and without a length.
    (answers,) = [r for r in rows if r[0].startswith("(f4) ") and r[2].startswith("answers")]
    assert answers[3] == "413, 413"
    # (f6): the new certificate is served after the swap.
    (reload,) = [r for r in rows if r[0].startswith("(f6) ") and r[2].startswith("seconds")]
    assert reload[3] != "never"
