"""Opaque config from classes and claims: merge order, scoping, specific errors."""

from __future__ import annotations

from typing import Any

import pytest

from dradriver.api.opaqueconfig import DeviceConfigError, effective_configs

D = "dradriver.dev"


def entry(
    source: str, params: dict[str, Any], requests: list[str] | None = None, driver: str = D
) -> dict[str, Any]:
    out: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        out["requests"] = requests
    return out


def cfg(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": f"{D}/v1alpha1", "kind": "DeviceConfig", **fields}


def test_claim_config_overrides_class_config_field_by_field() -> None:
    config = [
        entry("FromClaim", cfg(env={"A": "claim"})),
        entry("FromClass", cfg(env={"A": "class", "B": "class"}, profile="fast")),
    ]
    out = effective_configs(D, config, ["gpu"])
    assert out["gpu"].env == {"A": "claim", "B": "class"}
    assert out["gpu"].profile == "fast"


def test_entries_scoped_to_requests_and_subrequests() -> None:
    config = [entry("FromClaim", cfg(env={"X": "1"}), requests=["a"])]
    out = effective_configs(D, config, ["a/first", "b"])
    assert out["a/first"].env == {"X": "1"}
    assert out["b"].env == {}


def test_other_drivers_config_is_ignored() -> None:
    config = [entry("FromClaim", {"whatever": True}, driver="other.example.com")]
    assert effective_configs(D, config, ["a"])["a"].env == {}


def test_unknown_kind_is_named() -> None:
    with pytest.raises(
        DeviceConfigError, match=r"config\[0\] \(FromClaim\): unknown kind 'GpuConfig'"
    ):
        effective_configs(D, [entry("FromClaim", {**cfg(), "kind": "GpuConfig"})], ["a"])


def test_wrong_api_version_says_which_to_use() -> None:
    bad = {**cfg(), "apiVersion": f"{D}/v9"}
    with pytest.raises(DeviceConfigError, match=r"use 'dradriver\.dev/v1alpha1'"):
        effective_configs(D, [entry("FromClass", bad)], ["a"])


def test_invalid_value_names_the_field() -> None:
    with pytest.raises(
        DeviceConfigError, match=r"config\[1\] \(FromClaim\): field env:.*not a valid"
    ):
        effective_configs(
            D, [entry("FromClass", cfg()), entry("FromClaim", cfg(env={"1BAD": "x"}))], ["a"]
        )


def test_unknown_field_is_rejected_by_name() -> None:
    with pytest.raises(DeviceConfigError, match="field profil: unknown field"):
        effective_configs(D, [entry("FromClaim", cfg(profil="x"))], ["a"])


def test_inline_claim_parameters_give_their_node_settings() -> None:
    inline = {
        "apiVersion": f"{D}/v1alpha1",
        "kind": "DeviceClaimParameters",
        "spec": {"profile": "fast", "env": {"MODE": "x"}, "allocationMode": "Immediate"},
    }
    out = effective_configs(D, [entry("FromClaim", inline)], ["a"])
    assert out["a"].profile == "fast" and out["a"].env == {"MODE": "x"}


def test_parameters_reference_is_refused_on_the_node_with_a_reason() -> None:
    ref = {"apiVersion": f"{D}/v1alpha1", "kind": "DeviceClaimParametersReference", "name": "p"}
    with pytest.raises(DeviceConfigError, match="must be resolved by dradriver-controller"):
        effective_configs(D, [entry("FromClaim", ref)], ["a"])


@pytest.mark.parametrize(
    ("profile", "rule"),
    [
        ("../../etc/passwd", "not a DNS label"),
        ("fast; rm -rf /", "not a DNS label"),
        ("Fast", "not a DNS label"),
        ("fast\n", "not a DNS label"),
        ("-fast", "not a DNS label"),
        ("a" * 64, "at most 63"),
    ],
)
def test_profile_is_a_dns_label_on_the_node(profile: str, rule: str) -> None:
    """The profile reaches the setup hook (run as root) as DRADRIVER_PROFILE: the node
    refuses anything the README's "DNS label" does not allow, as the webhook does."""
    with pytest.raises(
        DeviceConfigError, match=rf"config\[0\] \(FromClaim\): field profile: .*{rule}"
    ):
        effective_configs(D, [entry("FromClaim", cfg(profile=profile))], ["a"])
    assert effective_configs(D, [entry("FromClaim", cfg(profile="fast-2"))], ["a"])[
        "a"
    ].profile == ("fast-2")


def test_env_name_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(DeviceConfigError, match="field env: 'A\\\\n' is not a valid"):
        effective_configs(D, [entry("FromClaim", cfg(env={"A\n": "x"}))], ["a"])
