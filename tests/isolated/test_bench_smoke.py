"""Smoke runs of the benchmarks that start isolated clusters of their own (``CLUSTER =
"own"``: free ports, a temporary state dir), at their SMOKE_ARGS sizes: each must finish
and print its tables. No timing is checked.
"""

from __future__ import annotations

import pytest

from bench.suite import Bench
from tests.cluster.test_bench_smoke import benches, check


@pytest.mark.parametrize("b", benches("own"), ids=lambda b: b.name)
def test_smoke_on_a_cluster_of_its_own(b: Bench) -> None:
    check(b)
