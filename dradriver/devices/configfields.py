"""Field types the configuration models share: absolute paths, hex IDs, extended resource
names, and the room check for attributes a source sets itself.

Each type validates on its own and its error says what is expected, with an example.
"""

from __future__ import annotations

import os
import re
from typing import Annotated

from pydantic import AfterValidator

from dradriver.devices.model import MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE, DeviceProperties
from dradriver.k8s import names


def check_absolute_path(value: str) -> str:
    if not os.path.isabs(value):
        raise ValueError(f"{value!r} is not an absolute path")
    return value


AbsolutePath = Annotated[str, AfterValidator(check_absolute_path)]


def reserved_attributes(
    template: DeviceProperties, reserved: tuple[str, ...], added_by: str
) -> None:
    """Checks a template for devices a source discovers: room for the source's attributes."""
    clash = sorted(set(template.attributes) & set(reserved))
    if clash:
        raise ValueError(f"attributes {clash} are set by {added_by} itself")
    total = len(template.attributes) + len(template.capacity) + len(reserved)
    if total > MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE:
        raise ValueError(
            f"{added_by} adds {len(reserved)} attributes, which makes {total} "
            f"attributes and capacities; at most {MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE} "
            "are allowed per device"
        )


HexID = Annotated[str, AfterValidator(lambda v: _hex(v, 4, 4, "a PCI ID"))]
HexClass = Annotated[str, AfterValidator(lambda v: _hex(v, 1, 6, "a PCI class prefix"))]


def _hex(value: str, low: int, high: int, what: str) -> str:
    digits = value.lower().removeprefix("0x")
    if not low <= len(digits) <= high or not re.fullmatch(r"[0-9a-f]+", digits):
        size = f"{low}" if low == high else f"{low} to {high}"
        raise ValueError(f"{value!r} is not {what}: expected {size} hex digits, e.g. 0x10de")
    return "0x" + digits


def validate_extended_resource_name(value: str) -> str:
    """The kubelet's rule for a device-plugin resource name (``IsExtendedResourceName``)."""
    if "/" not in value:
        raise ValueError(
            f"resource name {value!r} needs a domain: use <domain>/<name>, e.g. dradriver.dev/mock"
        )
    if "kubernetes.io/" in value:
        raise ValueError(
            f"resource name {value!r} is in the kubernetes.io namespace, which is reserved for "
            "native resources; use your own domain, e.g. dradriver.dev/mock"
        )
    if value.startswith("requests."):
        raise ValueError(f"resource name {value!r} must not start with 'requests.'")
    try:
        names.validate_label_name(f"requests.{value}", "resource name")
    except ValueError as err:
        raise ValueError(
            f"resource name {value!r} is not a valid extended resource name "
            f"(<DNS subdomain>/<name of letters, digits, '-', '_', '.'>): {err}"
        ) from err
    return value


ExtendedResourceName = Annotated[str, AfterValidator(validate_extended_resource_name)]
