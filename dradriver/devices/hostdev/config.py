"""The configuration of one host-device profile (``sources[i].host``).

Invariants, checked here so that discovery never meets them broken:

* ``name`` is a DNS label short enough for every device name derived from it.
* Every node path is an absolute path under ``/dev`` (resolved under ``devRoot`` on disk),
  exact or a glob; at least one node is not ``optional``.
* A glob node's ``mountPath`` is a directory (ends in ``/``: each match appears there under
  its own name) or one path, where each device's match appears (generic-device-plugin's
  ``/dev/ttyACM*`` -> ``/dev/modem``): then a container takes one device of the profile.
* ``permissions`` is a non-empty subset of ``rwm``; ``share`` is 1..65536.
* Container edits come from ``nodes``, ``env`` and read-only ``mounts`` only, and sharing
  from ``share`` only (``edits`` and ``allowMultipleAllocations`` are refused).
* The attributes and capacity the source adds itself are reserved and fit the API limit.

Example::

    host:
      name: serial
      nodes: [{path: /dev/ttyUSB*, mountPath: /dev/}]
      identity: serial
      usb: [{vendor: "0x0403", product: "0x6001"}]
"""

from __future__ import annotations

import glob
import os
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from dradriver.devices.configfields import AbsolutePath, ExtendedResourceName
from dradriver.devices.model import MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE, DeviceProperties
from dradriver.k8s import names

MAX_SHARE = 65536
DEV = "/dev"

SLOTS_CAPACITY = "slots"
SLOT_ATTRIBUTE = "slot"
HOST_DEVICE_ATTRIBUTE = "hostDevice"
HOST_ATTRIBUTES = (
    "path",
    "identity",
    "subsystem",
    "major",
    "minor",
    "vendor",
    "product",
    "serial",
    "busPath",
    SLOT_ATTRIBUTE,
    HOST_DEVICE_ATTRIBUTE,
)
"""Attributes the host source sets itself (a profile may not set them)."""

IdentityMode = Literal["auto", "path", "byId", "byPath", "serial"]
LONGEST_IDENTITY_SUFFIX = len("-bypath-") + 8
"""What a glob match adds to the profile name: ``-<kind>-<8 hex digits>``."""


def is_glob(path: str) -> bool:
    return glob.has_magic(path)


def _check_glob_component(part: str) -> None:
    depth = 0
    for char in part:
        if char == "[":
            depth += 1
        elif char == "]" and depth:
            depth -= 1
    if depth:
        raise ValueError(f"{part!r} has a '[' without its ']'; close the set, e.g. loop[0-7]")


def _node_path(value: str) -> str:
    if not os.path.isabs(value):
        raise ValueError(f"{value!r} is not an absolute path; write it as /dev/...")
    if value != DEV and not value.startswith(DEV + "/"):
        raise ValueError(f"{value!r} is not under /dev; device nodes are paths under /dev")
    if value.endswith("/") or "//" in value:
        raise ValueError(f"{value!r} has an empty path component; remove the extra '/'")
    parts = value.split("/")[1:]
    if ".." in parts or "." in parts:
        raise ValueError(f"{value!r} contains '.' or '..'; write the path without them")
    for part in parts:
        if "**" in part:
            raise ValueError(f"{value!r}: '**' (recursive globs) is not supported; use '*'")
        _check_glob_component(part)
    return value


def _permissions(value: str) -> str:
    if not value or set(value) - set("rwm") or len(set(value)) != len(value):
        raise ValueError(
            f"permissions {value!r} must be letters from 'rwm', each at most once, e.g. 'rw'"
        )
    return value


def _env_name(value: str) -> str:
    if not value or "=" in value or "\0" in value:
        raise ValueError(f"environment variable name {value!r} must be non-empty without '='")
    return value


class HostNodeConfig(BaseModel):
    """One host node (or glob of nodes) that is part of a device."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    path: Annotated[str, AfterValidator(_node_path)]
    mount_path: AbsolutePath | None = Field(default=None, alias="mountPath")
    permissions: Annotated[str, AfterValidator(_permissions)] = "rw"
    optional: bool = False

    @property
    def is_glob(self) -> bool:
        return is_glob(self.path)

    def container_path(self, matched: str) -> str:
        """Where the container sees ``matched`` (a /dev path this node's ``path`` matched)."""
        if self.mount_path is None:
            return matched
        if self.mount_path.endswith("/"):
            return self.mount_path + os.path.basename(matched)
        return self.mount_path


def _usb_id(value: str) -> str:
    digits = value.lower().removeprefix("0x")
    if len(digits) != 4 or any(c not in "0123456789abcdef" for c in digits):
        raise ValueError(f'{value!r} is not a USB ID: expected 4 hex digits, e.g. "0x1d6b"')
    return digits


UsbID = Annotated[str, AfterValidator(_usb_id)]
"""Four lower-case hex digits without ``0x`` (as sysfs writes ``idVendor``)."""


class UsbMatcher(BaseModel):
    """A USB device by vendor and product ID, and serial number if given."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    vendor: UsbID
    product: UsbID
    serial: Annotated[str, Field(min_length=1)] | None = None

    def matches(self, vendor: str | None, product: str | None, serial: str | None) -> bool:
        if vendor != self.vendor or product != self.product:
            return False
        return self.serial is None or serial == self.serial


class HostMount(BaseModel):
    """An extra mount for the container; read-only, so a device profile cannot widen access."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    host_path: AbsolutePath = Field(alias="hostPath")
    container_path: AbsolutePath = Field(alias="containerPath")
    read_only: bool = Field(default=True, alias="readOnly")

    @model_validator(mode="after")
    def _read_only(self) -> HostMount:
        if not self.read_only:
            raise ValueError(
                "readOnly: host profiles add read-only mounts only; remove readOnly: false "
                "(a writable path belongs in the pod spec)"
            )
        return self


def _some_nodes(nodes: tuple[HostNodeConfig, ...]) -> tuple[HostNodeConfig, ...]:
    if not nodes:
        raise ValueError("no nodes; add at least one, e.g. [{path: /dev/kvm}]")
    return nodes


class HostSourceConfig(DeviceProperties):
    """One profile: host device nodes that make devices, and how they are shared."""

    name: Annotated[str, AfterValidator(lambda v: names.validate_dns_label(v, "name"))]
    nodes: Annotated[tuple[HostNodeConfig, ...], AfterValidator(_some_nodes)]
    share: int | None = Field(default=None, ge=1, le=MAX_SHARE)
    identity: IdentityMode = "auto"
    usb: tuple[UsbMatcher, ...] = ()
    sysfs_root: AbsolutePath = Field(default="/sys", alias="sysfsRoot")
    dev_root: AbsolutePath = Field(default=DEV, alias="devRoot")
    env: dict[Annotated[str, AfterValidator(_env_name)], str] = Field(default_factory=dict)
    mounts: tuple[HostMount, ...] = ()
    extended_resource_name: ExtendedResourceName | None = Field(
        default=None, alias="extendedResourceName"
    )

    @model_validator(mode="after")
    def _profile_rules(self) -> HostSourceConfig:
        if all(node.optional for node in self.nodes):
            raise ValueError("nodes: every node is optional; make at least one optional: false")
        if "edits" in self.model_fields_set:
            raise ValueError("edits: not used by host profiles; use nodes, env and mounts")
        if self.allow_multiple_allocations:
            raise ValueError(
                "allowMultipleAllocations: host profiles share a device with share: <count>"
            )
        if SLOTS_CAPACITY in self.capacity:
            raise ValueError(f"capacity {SLOTS_CAPACITY!r} is set by share; use another name")
        self._check_reserved_attributes()
        self._check_name_length()
        return self

    def _check_reserved_attributes(self) -> None:
        clash = sorted(set(self.attributes) & set(HOST_ATTRIBUTES))
        if clash:
            raise ValueError(f"attributes {clash} are set by the host source itself")
        total = len(self.attributes) + len(self.capacity) + len(HOST_ATTRIBUTES) + 1
        if total > MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE:
            raise ValueError(
                f"attributes: the host source adds {len(HOST_ATTRIBUTES) + 1} attributes and "
                f"capacities, which makes {total}; at most "
                f"{MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE} are allowed per device"
            )

    def _check_name_length(self) -> None:
        longest = len(self.name) + self.longest_suffix
        if longest > names.DNS_LABEL_MAX_LENGTH:
            room = names.DNS_LABEL_MAX_LENGTH - self.longest_suffix
            raise ValueError(
                f"name {self.name!r}: device names derived from it would be {longest} characters "
                f"long; use a name of at most {room} characters"
            )

    @property
    def has_glob(self) -> bool:
        return any(node.is_glob for node in self.nodes)

    @property
    def longest_suffix(self) -> int:
        """How much longer than ``name`` a device name of this profile can be."""
        suffix = LONGEST_IDENTITY_SUFFIX if self.has_glob else 0
        if self.share is not None:
            suffix += len(f"-{self.share - 1}")
        return suffix

    def on_disk(self, path: str) -> str:
        """Where a /dev path is on this machine: under ``devRoot``."""
        return self.dev_root.rstrip("/") + path[len(DEV) :]

    def in_dev(self, disk_path: str) -> str:
        """The /dev path of a path under ``devRoot`` (the inverse of :meth:`on_disk`)."""
        root = self.dev_root.rstrip("/")
        if disk_path == root or disk_path.startswith(root + "/"):
            return DEV + disk_path[len(root) :]
        return disk_path
