"""What the node checks look at and what they report.

Invariants:

* Checks read the node only through :class:`Roots`: every file path is under one of its roots,
  and every program is run through its ``run`` callable, so tests give tmp trees and canned
  program output and never touch the real /proc, /sys, /dev, /etc or /var/run.
* A :class:`CheckResult` that is not ``ok`` or ``skip`` carries a ``fix``: a command or a
  setting, concrete enough to paste.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Status = Literal["ok", "warn", "fail", "skip"]

CommandRunner = Callable[[Sequence[str]], "str | None"]
"""Runs a program (argv) and returns what it printed (stdout and stderr), or None when it is
not installed, fails or does not answer in time."""

COMMAND_TIMEOUT_SECONDS = 10.0

KINDS = ("kvm", "fuse", "tun", "loop")
"""The device kinds with checks of their own (kernel module and device node)."""


def run_command(argv: Sequence[str]) -> str | None:
    """The default :data:`CommandRunner`: the program on this machine's PATH."""
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return done.stdout + done.stderr


def can_write(directory: Path) -> bool:
    """Whether this process may create files in ``directory``."""
    return os.access(directory, os.W_OK | os.X_OK)


@dataclass(frozen=True)
class Roots:
    """Where the node's filesystems are (``run`` stands for /var/run), and how programs run."""

    proc: Path = Path("/proc")
    sys: Path = Path("/sys")
    dev: Path = Path("/dev")
    etc: Path = Path("/etc")
    run: Path = Path("/var/run")
    command: CommandRunner = run_command
    writable: Callable[[Path], bool] = can_write

    def host_path(self, path: str) -> Path | None:
        """Where the host's absolute ``path`` is under these roots; None if under none."""
        for prefix, root in (
            ("/proc", self.proc),
            ("/sys", self.sys),
            ("/dev", self.dev),
            ("/etc", self.etc),
            ("/var/run", self.run),
            ("/run", self.run),
        ):
            if path == prefix or path.startswith(prefix + "/"):
                return root / path[len(prefix) :].lstrip("/")
        return None

    @classmethod
    def under(
        cls,
        base: Path,
        command: CommandRunner = run_command,
        writable: Callable[[Path], bool] = can_write,
    ) -> Roots:
        """Every root under ``base`` (``base/proc``, ``base/sys``, ..., ``base/var/run``): the
        host's filesystem mounted into a pod at ``base``, or a test's tmp tree."""
        return cls(
            proc=base / "proc",
            sys=base / "sys",
            dev=base / "dev",
            etc=base / "etc",
            run=base / "var" / "run",
            command=command,
            writable=writable,
        )


@dataclass(frozen=True)
class Needs:
    """What the driver configuration uses: device ``kinds`` (of :data:`KINDS`) and the host
    ``paths`` (exact or globs) its profiles name."""

    kinds: frozenset[str] = frozenset()
    paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = sorted(set(self.kinds) - set(KINDS))
        if unknown:
            raise ValueError(f"kinds: unknown {unknown}; use some of {', '.join(KINDS)}")

    @classmethod
    def from_paths(cls, paths: Iterable[str]) -> Needs:
        """The needs of a configuration naming ``paths``; kinds follow from the well-known
        nodes among them (/dev/kvm, /dev/fuse, /dev/net/tun, /dev/loop*)."""
        paths = tuple(paths)
        kinds = set()
        for path in paths:
            if path == "/dev/kvm":
                kinds.add("kvm")
            elif path == "/dev/fuse":
                kinds.add("fuse")
            elif path == "/dev/net/tun":
                kinds.add("tun")
            elif path.startswith("/dev/loop"):
                kinds.add("loop")
        return cls(kinds=frozenset(kinds), paths=paths)


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    detail: str
    fix: str = ""
