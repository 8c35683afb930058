"""Check CDI spec files with containerd's own CDI library, outside any cluster.

The checker is ``runtimebin/containerd/cmd/cdicheck``, built by
:mod:`devtools.cluster.runtimebin` in the module that pins containerd v2.4.2's
dependencies: it loads the spec directory into a CDI cache and injects each
device into a container spec, exactly what containerd does at container
creation. So "accepted" here means containerd 2.4.2 accepts it, including the
checks that need the host (a device node's host path must be a device node).

    errors = check_specs(cdi_dir)            # every device of every spec
    errors = check_specs(cdi_dir, [cdi_id])  # these devices (and all of them at once)

:func:`run_checker` returns the whole report, including what each device adds to
a container (device nodes with their type and numbers, env, mounts).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.cluster import runtimebin

CHECKER = "cdicheck"
TIMEOUT_SECONDS = 60.0


class CDICheckError(RuntimeError):
    """The checker itself failed (not a verdict on the specs)."""


@dataclass(frozen=True)
class LinuxDevice:
    """A device node as the OCI spec gets it: type and numbers come from the host path."""

    path: str
    type: str
    major: int
    minor: int


@dataclass(frozen=True)
class InjectedDevice:
    """What one CDI device adds to a container, as containerd's CDI library computed it."""

    cdi_id: str
    spec: str
    linux_devices: tuple[LinuxDevice, ...]
    env: tuple[str, ...]
    mounts: tuple[dict[str, Any], ...]


@dataclass
class CheckReport:
    specs: dict[str, tuple[str, ...]] = field(default_factory=dict)  # loaded: path -> names
    devices: dict[str, InjectedDevice] = field(default_factory=dict)  # injected: id -> edits
    errors: list[str] = field(default_factory=list)  # one line per rejected spec or device


def checker_path() -> Path:
    """The checker binary (built on first use, about 15 s cold; cached with the runtime)."""
    return runtimebin.ensure_binary(CHECKER)


def run_checker(spec_dirs: Sequence[Path], ids: Sequence[str] | None = None) -> CheckReport:
    """Load ``spec_dirs`` (later ones win, as in containerd's ``cdi_spec_dirs``) and inject
    ``ids``, or every device of every loaded spec when ``ids`` is None."""
    cmd = [str(checker_path())]
    for spec_dir in spec_dirs:
        cmd += ["-spec-dir", str(spec_dir)]
    if ids is None:
        cmd.append("-all")
    else:
        cmd += ["--", *ids]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=TIMEOUT_SECONDS)
    if proc.returncode not in (0, 1):
        raise CDICheckError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()}")
    report = CheckReport()
    for line in proc.stdout.splitlines():
        _add_record(report, json.loads(line))
    if (proc.returncode == 1) != bool(report.errors):
        raise CDICheckError(
            f"{CHECKER} exited {proc.returncode} with {len(report.errors)} errors reported:\n"
            f"{proc.stdout}{proc.stderr}"
        )
    return report


def _add_record(report: CheckReport, record: dict[str, Any]) -> None:
    error = record.get("error")
    if "together" in record:
        if error:
            report.errors.append(f"devices {','.join(record['together'])} together: {error}")
    elif "device" in record:
        if error:
            report.errors.append(f"device {record['device']}: {error}")
            return
        report.devices[record["device"]] = InjectedDevice(
            cdi_id=record["device"],
            spec=record["spec"],
            linux_devices=tuple(
                LinuxDevice(d["path"], d["type"], d["major"], d["minor"])
                for d in record.get("linuxDevices", [])
            ),
            env=tuple(record.get("env", [])),
            mounts=tuple(record.get("mounts", [])),
        )
    elif error:
        report.errors.append(f"spec {record['spec']}: {error}")
    else:
        report.specs[record["spec"]] = tuple(record.get("devices", []))


def check_specs(spec_dir: Path, ids: Sequence[str] | None = None) -> list[str]:
    """What containerd 2.4.2 would reject in ``spec_dir``: one line per spec or device;
    empty when everything is accepted. ``ids`` None checks every device defined there."""
    return run_checker([spec_dir], ids).errors
