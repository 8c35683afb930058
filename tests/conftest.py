"""Test tiers: ``unit``, ``grpc``, ``fuzz``, ``chart``, ``cluster`` and ``isolated``, marked by
directory. ``isolated`` tests start clusters of their own on free ports (never the shared
one), so ``make test`` runs them beside the other tiers.

The fuzz tier's hypothesis tests take the ``fuzz`` profile registered here as
their parent settings: derandomized (every run tries the same examples, so a
failure reproduces), no deadline, no example database, and a failure prints the
falsifying example and a ``@reproduce_failure`` blob. Each test bounds its own
``max_examples``.

The cluster tier runs against the project's local cluster: real etcd,
kube-apiserver, kube-controller-manager, kube-scheduler and kubelets; node-1
runs real containers (containerd + runc) and node-2 the fake CRI runtime.
One cluster serves the whole session; if one is already running
(``dradriver cluster up``) with the same feature gates, runtime and at least
as many nodes it is reused and left running, otherwise it is started here and
stopped at the end.
Feature gates for the run: ``DRADRIVER_FEATURE_GATES=Name=true,...``; node-1's
runtime: ``DRADRIVER_RUNTIME=real|fake`` (default real; with fake the tests of
tests/cluster/test_real_runtime.py are skipped); nodes: ``DRADRIVER_NODES``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from devtools.cluster.api import AdminAPI
from devtools.cluster.config import (
    Layout,
    default_state_dir,
    parse_feature_gates,
    parse_runtime,
)
from devtools.cluster.local import LocalCluster, running_cluster

TIERS = ("unit", "grpc", "fuzz", "chart", "cluster", "isolated")
UNIT_DIRS = ("devtools", "bench")  # tests of the dev tooling and the benches' logic: unit tier
TESTS = Path(__file__).resolve().parent

settings.register_profile(
    "fuzz",
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The tier is the directory right under tests/: a folder deeper down may share a tier's
    # name (tests/devtools/cluster/ holds unit tests of devtools/cluster/).
    for item in items:
        path = Path(str(item.fspath)).resolve()
        top = path.relative_to(TESTS).parts[0] if path.is_relative_to(TESTS) else ""
        if top in TIERS:
            item.add_marker(getattr(pytest.mark, top))
        elif top in UNIT_DIRS:
            item.add_marker(pytest.mark.unit)


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster]:
    gates = parse_feature_gates(os.environ.get("DRADRIVER_FEATURE_GATES", ""))
    layout = Layout(
        state_dir=default_state_dir(),
        nodes=int(os.environ.get("DRADRIVER_NODES", "2")),
        runtime=parse_runtime(os.environ.get("DRADRIVER_RUNTIME", "real")),
    )
    # The release: DRADRIVER_KUBE_VERSION, else the primary one (binaries.resolve_version).
    with running_cluster(layout, gates) as (cluster, _, _):
        yield cluster


@pytest.fixture
def api(local_cluster: LocalCluster) -> Iterator[AdminAPI]:
    with local_cluster.api() as client:
        yield client


@pytest.fixture
def unique_name() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def namespace(api: AdminAPI, unique_name: str) -> Iterator[str]:
    api.create_namespace(unique_name)
    yield unique_name
    # Wait until it is gone, so the pods' devices are free again for the next test.
    api.delete_namespace(unique_name, 120)


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short temporary directory: unix socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
