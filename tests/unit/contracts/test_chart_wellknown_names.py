"""Every ``dradriver.dev/…`` name the chart writes (templates, values) is the constant of
:mod:`dradriver.api.wellknown`, read from the chart's files as text (no helm).

``tests/chart/test_chart.py`` checks the rendered finalizer policy with helm; this test
covers every template and values file, comments included (they tell operators which
annotation or finalizer a rule is about), and runs in the unit tier.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dradriver.api import wellknown

CHART = Path(__file__).resolve().parents[3] / "deployments" / "helm" / "dradriver"
NAME = re.compile(r"dradriver\.dev/[A-Za-z0-9._-]+")

WELLKNOWN = {
    value
    for key, value in vars(wellknown).items()
    if key.isupper() and isinstance(value, str) and value.startswith("dradriver.dev/")
}

NOT_WELLKNOWN = {
    # The DaemonSet's pod-template annotation: only the chart writes and reads it (a
    # config change rolls the pods); no component of dradriver looks at it.
    "dradriver.dev/config-checksum",
    # Extended resource names chosen in the values (the node plugin's device config), not
    # names dradriver puts on objects.
    "dradriver.dev/mock",
    "dradriver.dev/mock-dra",
}


def chart_files() -> list[Path]:
    files = sorted((CHART / "templates").rglob("*"))
    files += sorted(CHART.glob("values*.yaml")) + sorted((CHART / "ci").glob("*.yaml"))
    return [f for f in files if f.is_file()]


def test_the_chart_is_where_the_test_looks() -> None:
    assert (CHART / "Chart.yaml").is_file()
    assert len(WELLKNOWN) >= 4  # the annotations and finalizers (one name is both)


@pytest.mark.parametrize("path", chart_files(), ids=lambda p: str(p.relative_to(CHART)))
def test_every_dradriver_name_in_the_chart_is_a_wellknown_constant(path: Path) -> None:
    unknown = sorted(
        {name for name in NAME.findall(path.read_text()) if name not in NOT_WELLKNOWN} - WELLKNOWN
    )
    assert not unknown, (
        f"{path.relative_to(CHART)} names {unknown}, which dradriver.api.wellknown does not "
        "define: use the constant's value, or add the name to wellknown (or, if no "
        "component of dradriver reads it, to NOT_WELLKNOWN here)"
    )


def test_the_finalizer_policy_spells_the_annotation_its_value_and_the_finalizer() -> None:
    text = (CHART / "templates" / "controller" / "allocation-finalizer-policy.yaml").read_text()
    compared = re.findall(r"annotations\[\?'([^']+)'\]\.orValue\(''\) == '([^']+)'", text)
    assert compared == [(wellknown.ALLOCATION_ANNOTATION, wellknown.IMMEDIATE)]
    added = set(re.findall(r"value: \[?'([^']+)'\]?\}", text))
    assert added == {wellknown.FINALIZER}
    assert f"!('{wellknown.FINALIZER}' in object.metadata.?finalizers" in text


def test_the_values_name_no_wellknown_name_the_templates_do_not() -> None:
    """The values carry no annotation or finalizer of ours (those are fixed in the
    templates); only the resource names of NOT_WELLKNOWN."""
    for path in [CHART / "values.yaml", *sorted((CHART / "ci").glob("*.yaml"))]:
        assert set(NAME.findall(path.read_text())) <= NOT_WELLKNOWN, path.name
