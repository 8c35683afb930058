"""The compatibility page's version matrix is what the compat tests recorded, and the
recorder's rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devtools import matrix, paths
from devtools.cluster.binaries import SUPPORTED_VERSIONS
from tests.cluster.conftest import Recorder


def test_the_compatibility_page_table_is_the_recorded_results() -> None:
    page = matrix.PAGE.read_text()
    assert matrix.with_table(page, matrix.render(matrix.load())) == page, (
        "the version matrix in docs/compatibility.md is stale: run `python -m devtools.matrix`"
    )


def test_the_matrix_page_is_in_the_docs_and_the_readme_links_to_it() -> None:
    assert matrix.PAGE == paths.REPO / "docs" / "compatibility.md"
    assert "compatibility.md" in (paths.REPO / "mkdocs.yml").read_text()
    assert matrix.BEGIN not in (paths.REPO / "README.md").read_text()


def test_every_supported_release_has_recorded_results() -> None:
    recorded = matrix.load()
    assert sorted(recorded) == sorted(SUPPORTED_VERSIONS)
    for version, cells in recorded.items():
        missing = sorted(set(matrix.FEATURES) - set(cells))
        assert not missing, f"{version}: no result for {missing} (run the compat subset on it)"


def test_results_merge_per_feature_and_render_as_one_row_each(tmp_path: Path) -> None:
    matrix.save("v1.34.4", {"shim": matrix.Cell("works")}, tmp_path)
    matrix.save(
        "v1.34.4", {"dra-health": matrix.Cell("not available", "gate X (alpha) is off")}, tmp_path
    )
    matrix.save("v1.37.2", {"shim": matrix.Cell("fails", "test_a")}, tmp_path)
    loaded = matrix.load(tmp_path)
    assert loaded["v1.34.4"] == {
        "shim": matrix.Cell("works"),
        "dra-health": matrix.Cell("not available", "gate X (alpha) is off"),
    }
    table = matrix.render(loaded)
    [shim] = [line for line in table.splitlines() if line.startswith("| device-plugin shim |")]
    assert shim == (
        "| device-plugin shim | works | not run | not run | **fails** (test_a) | not run |"
    )
    assert len(table.splitlines()) == 2 + len(matrix.FEATURES)


@pytest.mark.parametrize(
    "content",
    [
        {"version": "v1.35.4", "features": {}},  # named for another release
        {"version": "v1.34.4", "features": {"teleport": {"result": "works"}}},
        {"version": "v1.34.4", "features": {"shim": {"result": "maybe"}}},
        {"version": "v1.34.4", "features": {"shim": {"result": "works", "detail": 3}}},
    ],
)
def test_a_bad_results_file_is_refused(tmp_path: Path, content: object) -> None:
    (tmp_path / "v1.34.4.json").write_text(json.dumps(content))
    with pytest.raises(ValueError):
        matrix.load(tmp_path)


def test_a_release_tag_never_becomes_a_path() -> None:
    with pytest.raises(ValueError, match="release tag"):
        matrix.results_file("../../etc/passwd")


def test_a_table_cell_cannot_break_the_markdown_row() -> None:
    assert matrix.Cell("not available", "a | b\nc").text() == "not available (a \\| b c)"


def test_failures_win_over_passes_and_skips_give_the_reason() -> None:
    rec = Recorder()
    rec.passed["shim"].append("t1")
    rec.failed["shim"].append("t2")
    rec.skipped["dra-health"] += ["gate G (alpha) is off", "gate G (alpha) is off"]
    rec.passed["dra-service"].append("t3")
    rec.note("dra-service", "v1")
    assert rec.cells() == {
        "shim": matrix.Cell("fails", "t2"),
        "dra-health": matrix.Cell("not available", "gate G (alpha) is off"),
        "dra-service": matrix.Cell("works", "v1"),
    }
    with pytest.raises(ValueError, match="unknown matrix feature"):
        rec.note("teleport", "x")


def test_the_readme_table_can_be_regenerated() -> None:
    with pytest.raises(ValueError, match="no"):
        matrix.with_table("no markers here", "| x |\n")
