"""The docs' tests: unit tier, but for the commands that need the local cluster.

tests/conftest.py marks tiers by directory; this one marks the files of tests/docs/:
``test_runnable_cluster.py`` is the cluster tier, every other file the unit tier.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CLUSTER_FILES = ("test_runnable_cluster.py",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath)).resolve()
        if path.parent != HERE:
            continue
        item.add_marker(pytest.mark.cluster if path.name in CLUSTER_FILES else pytest.mark.unit)
