"""``kind: DeviceConfig``: this driver's node-side settings in opaque device configuration.

Kubernetes passes ``opaque.parameters`` through untouched; the driver owns the schema. The
kubelet plugin merges these per request (:mod:`dradriver.api.opaqueconfig`); inline
DeviceClaimParameters turn into one (:meth:`~dradriver.api.parameters.
DeviceClaimParametersSpec.device_config`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from dradriver.errors import FieldError, FieldErrors, from_validation_error
from dradriver.k8s import names

# fullmatch: with re.match, "$" also matches before a trailing newline ("A\n" would pass).
_ENV_NAME = names.C_IDENTIFIER_RE


def _profile(value: str) -> str:
    # docs/controller.md and docs/security.md promise a DNS label, and the value reaches
    # the setup hook (run as root) as DRADRIVER_PROFILE: the same rule as
    # DeviceClaimParameters' spec.profile.
    return names.validate_dns_label(value, "profile")


Profile = Annotated[str, AfterValidator(_profile)]


class DeviceConfigError(FieldErrors):
    """Bad opaque device configuration for this driver (a ``devices.config[].opaque`` entry)."""


class DeviceConfig(BaseModel):
    """``kind: DeviceConfig`` parameters for dradriver devices."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    api_version: str = Field(alias="apiVersion")
    kind: Literal["DeviceConfig"]
    env: dict[str, str] = Field(
        default_factory=dict, description="extra environment for containers using the device"
    )
    profile: Profile | None = Field(
        default=None, description="passed to setup hooks as DRADRIVER_PROFILE (a DNS label)"
    )
    setup_args: list[str] = Field(default_factory=list, alias="setupArgs", max_length=32)

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
        return value


def parse_device_config(parameters: Mapping[str, Any]) -> DeviceConfig:
    """Validate DeviceConfig ``parameters`` whose kind and apiVersion were checked.

    Raises :class:`DeviceConfigError` with one error per problem, reported at the parameters
    object and naming the field in the message (``field env: ...``): the form these errors
    have in kubelet events and webhook denials.
    """
    try:
        return DeviceConfig.model_validate(parameters)
    except ValidationError as e:
        raise DeviceConfigError(
            *(_at_object(error) for error in from_validation_error(e, DeviceConfig))
        ) from e


def _at_object(error: FieldError) -> FieldError:
    message = f"field {error.path}: {error.message}" if error.path else error.message
    return FieldError("", message, error.allowed)
