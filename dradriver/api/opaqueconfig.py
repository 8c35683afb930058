"""Opaque device configuration for this driver, as it arrives in claims and classes.

Kubernetes passes ``opaque.parameters`` through untouched; the driver owns the
schema. Entries apply in order (class config first, then claim config) and
later entries override earlier ones, field by field.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

API_VERSION = "v1alpha1"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ConfigError(ValueError):
    """Bad opaque config; the message names the entry and the field."""


class DeviceConfig(BaseModel):
    """``kind: DeviceConfig`` parameters for dradriver devices."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    api_version: str = Field(alias="apiVersion")
    kind: Literal["DeviceConfig"]
    env: dict[str, str] = Field(
        default_factory=dict, description="extra environment for containers using the device"
    )
    profile: str | None = Field(
        default=None, max_length=63, description="passed to setup hooks as DRADRIVER_PROFILE"
    )
    setup_args: list[str] = Field(default_factory=list, alias="setupArgs", max_length=32)

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
        return value


class EffectiveConfig(BaseModel):
    """The merged configuration for one request's devices."""

    env: dict[str, str] = Field(default_factory=dict)
    profile: str | None = None
    setup_args: list[str] = Field(default_factory=list)

    def overlay(self, cfg: DeviceConfig) -> EffectiveConfig:
        return EffectiveConfig(
            env={**self.env, **cfg.env},
            profile=cfg.profile if cfg.profile is not None else self.profile,
            setup_args=cfg.setup_args or self.setup_args,
        )


def _field_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(root)"


def parse_parameters(driver: str, parameters: Any, where: str) -> DeviceConfig:
    """Validate one opaque ``parameters`` object; ``where`` names it in errors."""
    if not isinstance(parameters, dict):
        raise ConfigError(f"{where}: parameters must be an object, got {type(parameters).__name__}")
    expected = f"{driver}/{API_VERSION}"
    kind = parameters.get("kind")
    if kind in ("DeviceClaimParameters", "DeviceClaimParametersReference"):
        return _from_claim_parameters(driver, parameters, where)
    if kind != "DeviceConfig":
        raise ConfigError(
            f"{where}: unknown kind {kind!r}; {driver} accepts DeviceConfig and "
            "DeviceClaimParameters"
        )
    if parameters.get("apiVersion") != expected:
        raise ConfigError(
            f"{where}: apiVersion {parameters.get('apiVersion')!r} is not supported; "
            f"use {expected!r}"
        )
    try:
        return DeviceConfig.model_validate(parameters)
    except ValidationError as e:
        first = e.errors()[0]
        raise ConfigError(f"{where}: field {_field_path(first['loc'])}: {first['msg']}") from e


def _from_claim_parameters(driver: str, parameters: dict[str, Any], where: str) -> DeviceConfig:
    """Inline DeviceClaimParameters carry their node-side settings; a reference cannot be
    read on the node (the plugin has no access to the CRD), so it is refused clearly."""
    from dradriver.api import parameters as claim_params  # imports this module

    try:
        parsed = claim_params.parse_opaque(driver, parameters, where)
    except claim_params.ParametersError as e:
        raise ConfigError(str(e)) from e
    if isinstance(parsed, claim_params.ParametersReference):
        raise ConfigError(
            f"{where}: DeviceClaimParametersReference {parsed.name!r} must be resolved by "
            "dradriver-controller before the node prepares the claim; use inline "
            "DeviceClaimParameters or a DeviceConfig"
        )
    assert isinstance(parsed, claim_params.InlineParameters)
    return DeviceConfig.model_validate(parsed.spec.device_config(driver))


def effective_configs(
    driver: str, allocation_config: list[dict[str, Any]], requests: list[str]
) -> dict[str, EffectiveConfig]:
    """Merge the allocation's config entries for this driver, per request name.

    ``allocation_config`` is ``status.allocation.devices.config``: class entries
    (source FromClass) come before claim entries (FromClaim); an entry without
    ``requests`` applies to every request. A request ``req/sub`` also matches
    entries naming ``req``.
    """
    ordered = sorted(
        enumerate(allocation_config),
        key=lambda item: (0 if item[1].get("source") == "FromClass" else 1, item[0]),
    )
    out = {r: EffectiveConfig() for r in requests}
    for index, entry in ordered:
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        where = f"config[{index}] ({entry.get('source', 'FromClaim')})"
        cfg = parse_parameters(driver, opaque.get("parameters"), where)
        targets = entry.get("requests") or []
        for request in requests:
            if not targets or request in targets or request.split("/")[0] in targets:
                out[request] = out[request].overlay(cfg)
    return out
