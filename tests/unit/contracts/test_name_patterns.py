"""The Kubernetes name formats are written once; the API's schema patterns are built from them."""

from __future__ import annotations

import re

import pytest

from dradriver.api import parameters
from dradriver.k8s import names


def test_schema_patterns_are_the_anchored_formats_crds_carry() -> None:
    # The CRDs hold these strings verbatim: they must not change.
    assert parameters.DNS_LABEL_PATTERN == r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
    assert parameters.DNS_SUBDOMAIN_PATTERN == (
        r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
    )
    assert parameters.ENV_NAME_PATTERN == r"^[A-Za-z_][A-Za-z0-9_]*$"
    assert names.whole(names.QUALIFIED_NAME_REGEX) == (
        r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
        r"[A-Za-z_][A-Za-z0-9_]*$"
    )


@pytest.mark.parametrize(
    ("value", "label", "subdomain", "qualified"),
    [
        ("gpu-0", True, True, False),
        ("gpu.example.com", False, True, False),
        ("example.com/model", False, False, True),
        ("model", True, True, True),
        ("-gpu", False, False, False),
        ("GPU", False, False, True),
        ("a..b", False, False, False),
    ],
)
def test_the_formats_agree_with_the_validators(
    value: str, label: bool, subdomain: bool, qualified: bool
) -> None:
    assert bool(names.DNS_LABEL_RE.fullmatch(value)) is label
    assert bool(names.DNS_SUBDOMAIN_RE.fullmatch(value)) is subdomain
    assert bool(re.fullmatch(names.QUALIFIED_NAME_REGEX, value)) is qualified
    for check, ok in [
        (names.validate_dns_label, label),
        (names.validate_dns_subdomain, subdomain),
        (names.validate_qualified_name, qualified),
    ]:
        if ok:
            assert check(value) == value
        else:
            with pytest.raises(ValueError):
                check(value)
