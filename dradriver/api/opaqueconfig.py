"""Opaque device configuration for this driver, as the kubelet plugin applies it.

Entries of a claim's allocation apply in order (class config first, then claim config) and
later entries override earlier ones, field by field. An entry is ``DeviceConfig``
(:mod:`dradriver.api.deviceconfig`) or inline ``DeviceClaimParameters``
(:mod:`dradriver.api.parameters`); a reference must have been replaced by what the
controller pinned (:mod:`dradriver.api.pinnedparameters`) before it gets here.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from dradriver.api import parameters as claim_params
from dradriver.api.deviceconfig import DeviceConfig, DeviceConfigError, parse_device_config
from dradriver.api.group import (
    DEVICE_CONFIG_KIND,
    PARAMETERS_KIND,
    PARAMETERS_REFERENCE_KIND,
    api_version,
)

__all__ = [
    "DeviceConfig",
    "DeviceConfigError",
    "EffectiveConfig",
    "effective_configs",
    "parse_parameters",
]


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


def parse_parameters(driver: str, parameters: Any, where: str) -> DeviceConfig:
    """The node-side settings of one opaque ``parameters`` object.

    ``where`` names the entry in errors (:class:`DeviceConfigError`, subject ``where``).
    """
    if not isinstance(parameters, dict):
        raise DeviceConfigError(
            f"parameters must be an object, got {type(parameters).__name__}", subject=where
        )
    kind = parameters.get("kind")
    if kind in (PARAMETERS_KIND, PARAMETERS_REFERENCE_KIND):
        return _from_claim_parameters(driver, parameters, where)
    if kind != DEVICE_CONFIG_KIND:
        raise DeviceConfigError(
            f"unknown kind {kind!r}; {driver} accepts {DEVICE_CONFIG_KIND} and {PARAMETERS_KIND}",
            subject=where,
        )
    expected = api_version(driver)
    if parameters.get("apiVersion") != expected:
        raise DeviceConfigError(
            f"apiVersion {parameters.get('apiVersion')!r} is not supported; use {expected!r}",
            subject=where,
        )
    try:
        return parse_device_config(parameters)
    except DeviceConfigError as e:
        raise DeviceConfigError(*e.field_errors, subject=where) from e


def _from_claim_parameters(driver: str, parameters: dict[str, Any], where: str) -> DeviceConfig:
    """Inline DeviceClaimParameters carry their node-side settings; a reference cannot be
    read on the node (the plugin has no access to the CRD), so it is refused clearly."""
    try:
        parsed = claim_params.parse_opaque(driver, parameters, "")
    except claim_params.ParametersError as e:
        raise DeviceConfigError(*e.field_errors, subject=where) from e
    if isinstance(parsed, claim_params.ParametersReference):
        raise DeviceConfigError(
            f"{PARAMETERS_REFERENCE_KIND} {parsed.name!r} must be resolved by "
            "dradriver-controller before the node prepares the claim; use inline "
            f"{PARAMETERS_KIND} or a {DEVICE_CONFIG_KIND}",
            subject=where,
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
