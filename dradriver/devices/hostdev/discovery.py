"""One scan of a host-device profile: which devices are there now, made of which nodes.

Invariants:

* Only character and block devices are members (a runtime refuses anything else as a CDI
  device node); a member's ``host_path`` is the node itself, links resolved, since the
  runtime's CDI library does not follow links, while the container sees the matched path.
* Groups follow generic-device-plugin: the i-th match (sorted) of every glob node makes
  device i; there are as many devices as the required glob with the fewest matches has; an
  optional glob short of matches leaves its member out; exact nodes join every device, and
  a missing required exact node means no device at all.
* A glob profile's device is named from its primary member's stable identity (see
  :mod:`.identity`); a profile of exact nodes only is one device named after the profile.
* ``usb`` matchers keep only devices whose primary member has a matching USB ancestor.

The scan reads the file system and returns values; it logs nothing (the source does, once
per path, since scans run every few seconds and after every hot-plug event).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field

from dradriver.devices.attributes import (
    ATTRIBUTE_VALUE_MAX_LENGTH,
    AttributeValue,
    IntAttribute,
    StringAttribute,
)
from dradriver.devices.hostdev import identity as ident
from dradriver.devices.hostdev import sysfs
from dradriver.devices.hostdev.config import HostNodeConfig, HostSourceConfig


@dataclass(frozen=True)
class Member:
    """One node of a device: as configured, as matched (a /dev path), as it is on disk."""

    node: HostNodeConfig
    dev_path: str
    host_path: str

    @property
    def container_path(self) -> str:
        return self.node.container_path(self.dev_path)


@dataclass(frozen=True)
class Found:
    """A device present in this scan."""

    name: str
    identity: ident.Identity
    members: tuple[Member, ...]
    attributes: dict[str, AttributeValue]


@dataclass
class Scan:
    found: list[Found] = field(default_factory=list)
    problems: dict[str, str] = field(default_factory=dict)
    """Path -> what is wrong with it (skipped, or named by path), for a warning."""


def _device_node(disk_path: str) -> str | None:
    real = os.path.realpath(disk_path)
    return real if sysfs.node_numbers(real) is not None else None


def _matches(config: HostSourceConfig, node: HostNodeConfig, scan: Scan) -> list[Member]:
    pattern = config.on_disk(node.path)
    paths = sorted(glob.glob(pattern)) if node.is_glob else [pattern]
    members = []
    for disk_path in paths:
        if not os.path.lexists(disk_path):
            continue
        host_path = _device_node(disk_path)
        if host_path is None:
            scan.problems[disk_path] = "is not a character or block device (or a link to one)"
            continue
        members.append(Member(node, config.in_dev(disk_path), host_path))
    return members


def groups(config: HostSourceConfig, scan: Scan) -> list[tuple[Member, ...]]:
    """The members of each device present now, primary member first."""
    matched = [(node, _matches(config, node, scan)) for node in config.nodes]
    exact = [(n, m) for n, m in matched if not n.is_glob]
    for node, members in exact:
        if not members and not node.optional:
            scan.problems[config.on_disk(node.path)] = (
                "is missing (a required node of every device)"
            )
            return []
    exact_members = [m[0] for _, m in exact if m]
    globs = [(n, m) for n, m in matched if n.is_glob]
    if not globs:
        return [tuple(exact_members)]
    counts = [len(m) for n, m in globs if not n.optional]
    count = min(counts) if counts else max(len(m) for _, m in globs)
    out = []
    for i in range(count):
        members = [m[i] for _, m in globs if i < len(m)]
        out.append((*members, *exact_members))
    return out


def _string(attributes: dict[str, AttributeValue], name: str, value: str | None) -> None:
    if value and len(value) <= ATTRIBUTE_VALUE_MAX_LENGTH:
        attributes[name] = StringAttribute(value=value)


@dataclass(frozen=True)
class _Facts:
    numbers: sysfs.NodeNumbers | None
    subsystem: str | None
    usb: sysfs.UsbInfo | None


def _facts(config: HostSourceConfig, host_path: str) -> _Facts:
    numbers = sysfs.node_numbers(host_path)
    node_dir = None if numbers is None else sysfs.sysfs_dir(config.sysfs_root, numbers)
    if node_dir is None:
        return _Facts(numbers, None, None)
    usb_dir = sysfs.usb_ancestor(node_dir, config.sysfs_root)
    usb = None if usb_dir is None else sysfs.usb_info(usb_dir)
    return _Facts(numbers, sysfs.subsystem(node_dir), usb)


def _attributes(
    config: HostSourceConfig, primary: Member, facts: _Facts, identity: ident.Identity
) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {}
    _string(attributes, "path", config.in_dev(primary.host_path))
    _string(attributes, "identity", identity.text())
    _string(attributes, "subsystem", facts.subsystem)
    if facts.numbers is not None:
        attributes["major"] = IntAttribute(value=facts.numbers.major)
        attributes["minor"] = IntAttribute(value=facts.numbers.minor)
    if facts.usb is not None:
        _string(attributes, "vendor", facts.usb.vendor)
        _string(attributes, "product", facts.usb.product)
        _string(attributes, "serial", facts.usb.serial)
        _string(attributes, "busPath", facts.usb.bus_path)
    return attributes


@dataclass(frozen=True)
class _Links:
    by_id: dict[str, list[str]]
    by_path: dict[str, list[str]]


def _candidates(primary: Member, facts: _Facts, links: _Links) -> ident.Candidates:
    by_id = links.by_id.get(primary.host_path, [None])[0]
    by_path = links.by_path.get(primary.host_path, [None])[0]
    matched_in = os.path.dirname(primary.dev_path)  # a link the profile matched comes first
    if matched_in in {f"/dev/{d}" for d in sysfs.BY_ID_DIRS}:
        by_id = os.path.basename(primary.dev_path)
    elif matched_in in {f"/dev/{d}" for d in sysfs.BY_PATH_DIRS}:
        by_path = os.path.basename(primary.dev_path)
    usb = facts.usb
    serial = None if usb is None else ident.usb_serial_identity(usb.vendor, usb.product, usb.serial)
    return ident.Candidates(
        path=primary.dev_path,
        by_id=by_id,
        serial=serial,
        by_path=by_path,
    )


def _usb_wanted(config: HostSourceConfig, facts: _Facts) -> bool:
    if not config.usb:
        return True
    usb = facts.usb
    if usb is None:
        return False
    return any(m.matches(usb.vendor, usb.product, usb.serial) for m in config.usb)


def scan(config: HostSourceConfig) -> Scan:
    """The devices of the profile present now (and the paths skipped, with why)."""
    result = Scan()
    links = _Links(
        sysfs.link_index(config.dev_root, sysfs.BY_ID_DIRS),
        sysfs.link_index(config.dev_root, sysfs.BY_PATH_DIRS),
    )
    taken: set[str] = set()
    for members in groups(config, result):
        primary = members[0]
        facts = _facts(config, primary.host_path)
        if not _usb_wanted(config, facts):
            continue
        if not config.has_glob:
            identity = ident.Identity("path", primary.dev_path)
            name = config.name
        else:
            found = ident.choose(config.identity, _candidates(primary, facts, links))
            if found is None:
                result.problems[primary.dev_path] = f"has no {config.identity} identity"
                continue
            identity, name = found, ident.device_name(config.name, found)
            if name in taken:  # two devices claim one identity (cheap USB serials do)
                result.problems[primary.dev_path] = (
                    f"has the same {identity.kind} identity as another match; named by path"
                )
                identity = ident.Identity("path", primary.dev_path)
                name = ident.device_name(config.name, identity)
        taken.add(name)
        attributes = _attributes(config, primary, facts, identity)
        result.found.append(Found(name, identity, members, attributes))
    return result
