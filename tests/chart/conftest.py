"""The chart tier: ``helm lint`` / ``helm template`` of deployments/helm/dradriver.

helm is built from the Go module proxy (``make helm``, devtools.cluster.helmbin) on the
first run and found in the cache afterwards; ``DRADRIVER_HELM`` names another binary.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.cluster.helmbin import ensure_helm


@pytest.fixture(scope="session")
def helm() -> Path:
    return ensure_helm()
