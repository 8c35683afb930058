"""Linux capabilities by name, and which ones this process has.

Invariants: a name is written as Kubernetes writes it in ``securityContext.capabilities``
(``NET_ADMIN``, no ``CAP_`` prefix) and is one of :data:`NAMES`; :func:`effective` reads the
``CapEff`` mask of ``/proc/self/status`` (or a given status file) and never raises: an
unreadable file reads as ``None`` (unknown), never as "no capabilities".
"""

from __future__ import annotations

import re
from pathlib import Path

NAMES = (
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
)
"""Every capability in the order of its bit (``capability.h``): ``NAMES[n]`` is bit n."""

_CAP_EFF = re.compile(r"^CapEff:\s*([0-9a-fA-F]+)\s*$", re.MULTILINE)


def check_name(value: str) -> str:
    """``value`` if it names a capability; ValueError saying how to write it otherwise."""
    if value.upper().startswith("CAP_") and value.upper()[4:] in NAMES:
        raise ValueError(f"write {value[4:].upper()!r} without the CAP_ prefix, as Kubernetes does")
    if value not in NAMES:
        raise ValueError(
            f"{value!r} is not a Linux capability; use a name like NET_ADMIN or SYS_ADMIN "
            "(capabilities(7) without CAP_)"
        )
    return value


def effective(status: Path = Path("/proc/self/status")) -> frozenset[str] | None:
    """The names in this process's effective set, or None if it cannot be read."""
    try:
        text = status.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    found = _CAP_EFF.search(text)
    if found is None:
        return None
    mask = int(found.group(1), 16)
    return frozenset(name for bit, name in enumerate(NAMES) if mask >> bit & 1)
