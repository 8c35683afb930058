"""Smoke runs of the benchmarks that need a cluster, at their SMOKE_ARGS sizes (bench/__init__.py):
each must finish and print its tables. No timing is checked.

``shared`` ones reuse the session cluster (its runtime passed on, see
``bench.common.shared_layout``); ``exclusive`` ones need the usual ports and run only when
no local cluster is running; ``own`` ones, on isolated clusters, are in tests/isolated/.
"""

from __future__ import annotations

import pytest

from bench.suite import Bench, discover, has_table, run
from devtools.cluster.config import Layout, default_state_dir
from devtools.cluster.local import LocalCluster

TIMEOUT = 900.0


def benches(*kinds: str) -> list[Bench]:
    """Those of ``kinds`` without a smoke test of their own (``OWN_SMOKE_TEST``)."""
    return [b for b in discover() if b.cluster in kinds and b.own_smoke_test is None]


def check(b: Bench, env: dict[str, str] | None = None) -> None:
    result = run(b, b.smoke_args, env=env, timeout=TIMEOUT)
    assert result.ok, result.output[-4000:]
    assert has_table(result.output), result.output[-4000:]


@pytest.mark.parametrize("b", benches("shared"), ids=lambda b: b.name)
def test_smoke_on_the_session_cluster(b: Bench, local_cluster: LocalCluster) -> None:
    state = local_cluster.state()
    assert state is not None
    check(b, {"DRADRIVER_RUNTIME": state.runtime})


@pytest.mark.parametrize("b", benches("exclusive"), ids=lambda b: b.name)
def test_smoke_of_a_benchmark_that_needs_the_usual_ports(b: Bench) -> None:
    if LocalCluster(Layout(state_dir=default_state_dir())).running() is not None:
        pytest.skip(f"{b.module} starts clusters on the usual ports: a local cluster runs")
    check(b)
