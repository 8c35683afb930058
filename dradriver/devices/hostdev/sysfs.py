"""Readers of sysfs and /dev for one device node; they change nothing and raise nothing.

Invariants: every reader takes its roots (``sysfs_root``, ``dev_root``) as arguments, so
tests point them at trees they make; a missing or unreadable file reads as ``None`` (a
device that vanishes while it is read is just a device without that attribute).

The kernel's layout: ``<sysfs>/dev/{char,block}/<major>:<minor>`` links to the node's
directory under ``<sysfs>/devices``; its ``subsystem`` link names the subsystem (tty,
block, misc, usb, ...). A USB device is the nearest ancestor directory holding
``idVendor`` and ``idProduct`` (with ``serial``, ``busnum`` and ``devpath``); udev's
stable links live in ``<dev>/serial/by-id``, ``<dev>/disk/by-id`` and their ``by-path``.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Literal

NodeKind = Literal["char", "block"]

BY_ID_DIRS = ("serial/by-id", "disk/by-id")
BY_PATH_DIRS = ("serial/by-path", "disk/by-path")


@dataclass(frozen=True)
class NodeNumbers:
    kind: NodeKind
    major: int
    minor: int


@dataclass(frozen=True)
class UsbInfo:
    vendor: str | None
    product: str | None
    serial: str | None
    bus_path: str


def node_numbers(path: str) -> NodeNumbers | None:
    """The kind and numbers of the device node at ``path`` (links followed), or None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if stat.S_ISCHR(st.st_mode):
        kind: NodeKind = "char"
    elif stat.S_ISBLK(st.st_mode):
        kind = "block"
    else:
        return None
    return NodeNumbers(kind, os.major(st.st_rdev), os.minor(st.st_rdev))


def read_value(path: str) -> str | None:
    """A sysfs attribute file's text, stripped; None if missing, unreadable or empty."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(4096).strip()
    except OSError:
        return None
    return text or None


def sysfs_dir(sysfs_root: str, numbers: NodeNumbers) -> str | None:
    """The node's resolved sysfs directory, from ``<sysfs>/dev/<kind>/<major>:<minor>``."""
    link = os.path.join(sysfs_root, "dev", numbers.kind, f"{numbers.major}:{numbers.minor}")
    if not os.path.isdir(link):
        return None
    return os.path.realpath(link)


def subsystem(node_dir: str) -> str | None:
    """The subsystem's name (the ``subsystem`` link's target basename)."""
    link = os.path.join(node_dir, "subsystem")
    if not os.path.islink(link):
        return None
    return os.path.basename(os.path.realpath(link))


def usb_ancestor(node_dir: str, sysfs_root: str) -> str | None:
    """The nearest USB device directory at or above the node (through its ``device`` link)."""
    device = os.path.join(node_dir, "device")
    start = os.path.realpath(device) if os.path.exists(device) else node_dir
    root = os.path.realpath(sysfs_root)
    current = start
    while current.startswith(root + os.sep):
        if os.path.isfile(os.path.join(current, "idVendor")) and os.path.isfile(
            os.path.join(current, "idProduct")
        ):
            return current
        current = os.path.dirname(current)
    return None


def usb_info(usb_dir: str) -> UsbInfo:
    """Vendor, product (lower-case hex), serial and bus path (``1-1.2``) of a USB device."""
    vendor = read_value(os.path.join(usb_dir, "idVendor"))
    product = read_value(os.path.join(usb_dir, "idProduct"))
    busnum = read_value(os.path.join(usb_dir, "busnum"))
    devpath = read_value(os.path.join(usb_dir, "devpath"))
    bus_path = f"{busnum}-{devpath}" if busnum and devpath else os.path.basename(usb_dir)
    return UsbInfo(
        vendor=vendor.lower() if vendor else None,
        product=product.lower() if product else None,
        serial=read_value(os.path.join(usb_dir, "serial")),
        bus_path=bus_path,
    )


def link_index(dev_root: str, link_dirs: tuple[str, ...]) -> dict[str, list[str]]:
    """Resolved target -> names of the links to it in ``<dev_root>/<dir>`` (sorted).

    Read once per scan: looking up every match's links is then a dict lookup.
    """
    index: dict[str, list[str]] = {}
    for link_dir in link_dirs:
        directory = os.path.join(dev_root, link_dir)
        try:
            entries = sorted(os.listdir(directory))
        except OSError:
            continue
        for entry in entries:
            path = os.path.join(directory, entry)
            if os.path.islink(path):
                index.setdefault(os.path.realpath(path), []).append(entry)
    return index
