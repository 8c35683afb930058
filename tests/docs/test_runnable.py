"""Every shell block the README and the docs mark ``<!-- runnable -->`` runs and succeeds.

The blocks of one page run in order, as one script, in an empty temporary directory, with
this checkout's console scripts first on PATH (each a wrapper that imports this
checkout, whatever the virtualenv's entry points point at). Blocks that need the local
cluster are tests/docs/test_runnable_cluster.py's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from devtools import paths
from devtools.docs import runnable

UNIT_PAGES = runnable.by_page(cluster=False)


def console_scripts(bin_dir: Path) -> Path:
    """``bin_dir`` with a wrapper per console script of pyproject.toml, running this checkout."""
    scripts = tomllib.loads((paths.REPO / "pyproject.toml").read_text())["project"]["scripts"]
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, target in scripts.items():
        module, _, func = target.partition(":")
        wrapper = bin_dir / name
        wrapper.write_text(
            f"#!{sys.executable}\n"
            "import sys\n"
            f"sys.path.insert(0, {str(paths.REPO)!r})\n"
            f"from {module} import {func}\n"
            f"sys.exit({func}())\n"
        )
        wrapper.chmod(0o755)
    return bin_dir


def run_page(blocks: list[runnable.Block], cwd: Path, env: dict[str, str], timeout: float) -> None:
    done = subprocess.run(
        ["bash", "-c", runnable.script(blocks)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, (
        f"a runnable block failed (exit {done.returncode})\n"
        f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    )


@pytest.mark.parametrize("page", sorted(UNIT_PAGES), ids=lambda p: str(p.relative_to(paths.REPO)))
def test_runnable_blocks_of_the_page_succeed(page: Path, tmp_path: Path) -> None:
    bin_dir = console_scripts(tmp_path / "bin")
    work = tmp_path / "work"
    work.mkdir()
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(tmp_path),
        "PYTHONPATH": str(paths.REPO),
        "LC_ALL": "C.UTF-8",
    }
    run_page(UNIT_PAGES[page], work, env, timeout=120)


def test_the_readme_has_runnable_blocks_of_both_kinds() -> None:
    readme = paths.REPO / "README.md"
    kinds = {b.cluster for b in runnable.blocks(readme)}
    assert kinds == {False, True}


def test_the_install_page_shows_the_readmes_install_commands() -> None:
    """docs/install.md repeats the README's runnable install block word for word."""
    readme = paths.REPO / "README.md"
    install = next(b for b in runnable.blocks(readme) if "helm) install" in b.script)
    assert install.cluster
    assert install.script in (paths.REPO / "docs" / "install.md").read_text()


def test_markers_are_parsed_with_their_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(paths, "REPO", tmp_path)
    page = tmp_path / "page.md"
    page.write_text(
        "text\n"
        "<!-- runnable -->\n```sh\necho one\n```\n"
        "<!-- runnable: cluster exits=0,3 -->\n```sh\necho two\n```\n"
        "```sh\necho not marked\n```\n"
    )
    first, second = runnable.blocks(page)
    assert (first.script, first.cluster, first.exits, first.line) == ("echo one\n", False, (0,), 3)
    assert (second.script, second.cluster, second.exits) == ("echo two\n", True, (0, 3))
    page.write_text("<!-- runnable: sometimes -->\n```sh\necho\n```\n")
    with pytest.raises(runnable.RunnableError, match="unknown runnable option 'sometimes'"):
        runnable.blocks(page)
    page.write_text("<!-- runnable -->\n```yaml\na: 1\n```\n")
    with pytest.raises(runnable.RunnableError, match="must precede a ```sh block"):
        runnable.blocks(page)


def test_the_script_accepts_only_the_declared_exit_codes(tmp_path: Path) -> None:
    def block(script: str, exits: tuple[int, ...]) -> runnable.Block:
        return runnable.Block(paths.REPO / "README.md", 1, script, False, exits)

    def code(*blocks: runnable.Block) -> int:
        return subprocess.run(
            ["bash", "-c", runnable.script(list(blocks))], cwd=tmp_path, capture_output=True
        ).returncode

    assert code(block("exit 0\n", (0,))) == 0
    assert code(block("false\n", (0,))) != 0
    assert code(block("(exit 1)\n", (0, 1)), block("touch ran\n", (0,))) == 0
    assert (tmp_path / "ran").exists()
    assert code(block("(exit 2)\n", (0, 1))) == 1
