"""The site builds strictly and offline, every page is in the nav, the README stays short.

The strict build is what `make docs` runs (a warning, a broken link or anchor, a page
missing from the nav fails it); here it builds into a temporary directory.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

from devtools import paths

DOCS = paths.REPO / "docs"
README = paths.REPO / "README.md"
# A strict build took about 3 s on the 2-CPU dev VM; this bound catches a build that hangs.
BUILD_BOUND_SECONDS = 120


def _nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [p for item in nav for p in _nav_pages(item)]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in _nav_pages(value)]
    return []


def _mkdocs_config() -> dict[str, object]:
    config = yaml.safe_load((paths.REPO / "mkdocs.yml").read_text())
    assert isinstance(config, dict)
    return config


def test_strict_build_succeeds_offline(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=paths.REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_BOUND_SECONDS,
        check=False,
    )
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    assert took < BUILD_BOUND_SECONDS
    html = "".join(p.read_text() for p in site.rglob("*.html"))
    # No font, script or stylesheet from a CDN: the site works without a network.
    for host in ("fonts.googleapis.com", "fonts.gstatic.com", "unpkg.com", "cdn.jsdelivr.net"):
        assert host not in html, f"the site loads something from {host}"
    for page in _nav_pages(_mkdocs_config()["nav"]):
        assert (site / page.removesuffix(".md").removesuffix("index") / "index.html").is_file() or (
            site / "index.html"
        ).is_file()


def test_every_page_is_in_the_nav() -> None:
    nav = set(_nav_pages(_mkdocs_config()["nav"]))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages == nav, f"not in the nav: {sorted(pages - nav)}; missing: {sorted(nav - pages)}"


def test_the_theme_fetches_no_fonts() -> None:
    theme = _mkdocs_config()["theme"]
    assert isinstance(theme, dict)
    assert theme["name"] == "material"
    assert theme["font"] is False


def test_readme_is_short_and_keeps_the_two_commands_first() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 250
    assert lines[:4] == [
        "# dradriver",
        "",
        "    make demo    # a real Kubernetes 1.37 cluster on this machine, the DRA example, "
        "a timeline",
        "    make test    # ruff, mypy, every test tier on 1.37, the compatibility subset on "
        "1.34-1.36 and 1.38",
    ]


def test_readme_links_point_at_files_that_exist() -> None:
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    local = [t for t in targets if "://" not in t]
    assert local, "the README links into the docs"
    missing = [t for t in local if not (paths.REPO / t).exists()]
    assert not missing, f"README links to missing files: {missing}"
    # Every page a user needs is reachable from the README.
    for page in ("install.md", "concepts.md", "operations.md", "security.md", "reference/cli.md"):
        assert f"docs/{page}" in local
