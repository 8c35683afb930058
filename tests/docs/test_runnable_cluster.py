"""The README's cluster commands, run as written: start the local cluster, import the image,
install the chart, make a first claim, uninstall, stop the cluster.

The commands start the cluster themselves (``dradriver cluster up`` on the usual ports), so
this test needs the machine's local cluster to itself: it is skipped while one runs (as
in ``pytest tests``, whose cluster tier keeps the session's cluster up), and ``make test``
runs it on its own afterwards (``pytest -m cluster tests/docs``), as it runs the
compatibility subset. Whatever happens, the cluster is stopped at the end.

The blocks run from the repository root with ``.venv/bin`` and the local cluster's kubectl
first on PATH, as the README tells a reader to have them.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools import paths
from devtools.cluster.binaries import build_dir
from devtools.cluster.config import Layout, default_state_dir
from devtools.cluster.local import LocalCluster
from devtools.docs import runnable
from tests.docs.test_runnable import run_page

CLUSTER_PAGES = runnable.by_page(cluster=True)
VENV_BIN = paths.REPO / ".venv" / "bin"

pytestmark = pytest.mark.timeout(3600)


@pytest.fixture
def machine_to_ourselves() -> Iterator[Path]:
    """The default state dir, with no cluster running; the cluster is stopped afterwards."""
    state_dir = default_state_dir()
    if LocalCluster(Layout(state_dir=state_dir)).state() is not None:
        pytest.skip(
            "a local cluster is running: the README's commands start their own "
            "(make test runs this afterwards: pytest -m cluster tests/docs)"
        )
    if not (VENV_BIN / "dradriver").exists():
        pytest.skip(f"{VENV_BIN} has no dradriver: run `make install` first")
    try:
        yield state_dir
    finally:
        subprocess.run(
            [str(VENV_BIN / "dradriver"), "cluster", "down"],
            cwd=paths.REPO,
            capture_output=True,
            check=False,
            timeout=300,
        )


@pytest.mark.parametrize(
    "page", sorted(CLUSTER_PAGES), ids=lambda p: str(p.relative_to(paths.REPO))
)
def test_cluster_blocks_of_the_page_succeed(page: Path, machine_to_ourselves: Path) -> None:
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{build_dir()}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    # The reader types these blocks into a shell, not inside make: a make
    # variable inherited from `make test` (MAKELEVEL, MAKEFLAGS) would make
    # `$(make -s helm)` print "make[2]: Entering directory" into the command.
    for name in ("KUBECONFIG", "MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES"):
        env.pop(name, None)
    run_page(CLUSTER_PAGES[page], paths.REPO, env, timeout=3000)
    assert LocalCluster(Layout(state_dir=machine_to_ourselves)).state() is None, (
        "the page's commands leave the cluster running: its last block stops it"
    )
