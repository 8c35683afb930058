"""Read one sample of a registry the way Prometheus would: from its /metrics text.

The text is parsed by ``prometheus_client``'s parser (a dev dependency), an
implementation independent of :mod:`dradriver.metrics`, so a test that reads a value
also checks that the exposition carries it.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from dradriver.metrics import Registry


def sample_value(
    registry: Registry, name: str, labels: dict[str, str] | None = None
) -> float | None:
    """The value of the sample ``name`` with exactly ``labels``, None if there is none."""
    wanted = labels or {}
    for family in text_string_to_metric_families(registry.exposition().decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels == wanted:
                return float(sample.value)
    return None
