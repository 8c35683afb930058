"""The generated parts of the docs are what their generators make from the code today.

Each reference page and each diagram has its own test, so a failure names the one that
drifted; `make docs` (``python -m devtools.docs``) rewrites them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools import paths
from devtools.docs import __main__ as docs_main
from devtools.docs import cliref, configref, diagrams, helmref, metricsref
from devtools.docs.pages import between_markers, cell


def _same(path: Path, wanted: str) -> None:
    assert path.is_file(), f"{path.relative_to(paths.REPO)} is missing: run `make docs`"
    assert path.read_text() == wanted, (
        f"{path.relative_to(paths.REPO)} differs from what its generator makes: run `make docs`"
    )


def test_configuration_reference_is_the_models() -> None:
    _same(configref.PAGE, configref.render())


def test_helm_values_reference_is_the_schema() -> None:
    _same(helmref.PAGE, helmref.render())


def test_metrics_reference_is_the_declarations() -> None:
    _same(metricsref.PAGE, metricsref.render())


def test_cli_reference_is_the_help() -> None:
    _same(cliref.PAGE, cliref.render())


@pytest.mark.parametrize("source", diagrams.sources(), ids=lambda p: p.name)
def test_diagram_svg_is_its_source(source: Path) -> None:
    _same(source.with_suffix(".svg"), diagrams.render_file(source))


def test_every_generated_file_is_in_the_nav_or_embedded() -> None:
    mkdocs = (paths.REPO / "mkdocs.yml").read_text()
    for page in (configref.PAGE, helmref.PAGE, metricsref.PAGE, cliref.PAGE):
        assert str(page.relative_to(paths.REPO / "docs")) in mkdocs
    embedded = "".join(p.read_text() for p in (paths.REPO / "docs").rglob("*.md"))
    for svg in diagrams.outputs():
        assert f"diagrams/{svg.name}" in embedded, f"{svg.name} is on no page"


def test_check_mode_reports_a_drifted_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = tmp_path / "metrics.md"
    page.write_text("stale\n")
    monkeypatch.setattr(docs_main, "REFERENCES", ((page, lambda: "fresh\n"),))
    monkeypatch.setattr(diagrams, "outputs", dict)
    monkeypatch.setattr(paths, "REPO", tmp_path)
    assert docs_main.main(["--check"]) == 1
    assert page.read_text() == "stale\n"
    assert docs_main.main([]) == 0
    assert page.read_text() == "fresh\n"
    assert docs_main.main(["--check"]) == 0


def test_table_cells_escape_pipes_outside_code_spans_only() -> None:
    assert cell("a|b `(ms|s)`\nnext") == "a\\|b `(ms|s)` next"


def test_a_marked_block_is_found_between_its_markers_and_refused_out_of_order() -> None:
    text = "before<!-- b -->inside<!-- e -->after"
    start, stop = between_markers(text, "<!-- b -->", "<!-- e -->", "block")
    assert text[start:stop] == "inside"
    for broken in ("before<!-- b -->no end", "<!-- e -->end first<!-- b -->"):
        with pytest.raises(ValueError, match="no block"):
            between_markers(broken, "<!-- b -->", "<!-- e -->", "block")
