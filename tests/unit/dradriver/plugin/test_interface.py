"""The kubelet's claim reference: a UID that can name files, a namespace that is a DNS label,
a name that is a DNS subdomain (the apiserver's rules, lengths included)."""

from __future__ import annotations

import pytest

from dradriver.plugin.interface import ClaimRef, claim_ref_problem

pytestmark = pytest.mark.unit

UID = "0b6e2c5a-8a4e-4f1e-9d3c-2f1f0c7d9e11"


def problem(namespace: str = "default", name: str = "claim", uid: str = UID) -> str | None:
    return claim_ref_problem(ClaimRef(namespace, uid, name))


def test_a_plain_reference_is_valid() -> None:
    assert problem() is None
    assert problem("kube-system", "gpu.claim-0") is None


@pytest.mark.parametrize(
    ("namespace", "valid"),
    [
        ("a", True),
        ("a" * 63, True),
        ("a" * 64, False),
        ("team-1", True),
        ("1team", True),
        ("", False),
        ("-team", False),
        ("team-", False),
        ("Team", False),
        ("team.a", False),
        ("team_a", False),
        ("team\n", False),
    ],
)
def test_the_namespace_is_a_dns_label(namespace: str, valid: bool) -> None:
    found = problem(namespace=namespace)
    if valid:
        assert found is None
    else:
        assert found == f"claim namespace {namespace!r} is not a valid namespace name"


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("c", True),
        ("gpu.example-0", True),
        ("a" * 253, True),
        ("a" * 254, False),
        (".".join(["a" * 63] * 4)[:253], True),
        ("a" * 64, True),
        ("", False),
        ("a..b", False),
        (".a", False),
        ("a.", False),
        ("a-.b", False),
        ("Claim", False),
        ("claim/x", False),
        ("claim\n", False),
    ],
)
def test_the_name_is_a_dns_subdomain(name: str, valid: bool) -> None:
    found = problem(name=name)
    if valid:
        assert found is None
    else:
        assert found == f"claim name {name!r} is not a valid object name"


def test_the_uid_is_checked_first() -> None:
    assert problem("Bad", "Bad", "../x") == (
        "claim uid '../x' is not a valid UID (letters, digits, '-' and '.', at most 128, "
        "starting and ending with a letter or digit)"
    )
