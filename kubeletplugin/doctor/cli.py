"""``dradriver-kubeletplugin doctor``: the node checks as a table, and the start-up log line.

Invariants: the checks only read (files under the roots, ``--version`` of the runtimes);
the exit status is 1 when any check fails, 0 otherwise (warnings included), 2 for a
configuration that cannot be read. The plugin itself runs the same checks once at start-up
and logs each failing one with its fix; a failing check never stops the plugin.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from dradriver.devices.config import DriverConfig, load_config
from dradriver.devices.configyaml import DriverConfigError
from dradriver.log import get_logger
from kubeletplugin.doctor.checks import run_checks
from kubeletplugin.doctor.model import CheckResult, Needs, Roots
from kubeletplugin.doctor.table import format_table

log = get_logger("kubeletplugin.doctor")


def needs_of(config: DriverConfig) -> Needs:
    """What the configuration's host-device profiles and device globs use on the node."""
    paths: list[str] = []
    for source in config.sources:
        if source.host is not None:
            paths.extend(node.path for node in source.host.nodes)
        elif source.devglob is not None:
            paths.append(source.devglob.glob)
    return Needs.from_paths(paths)


def log_failures(config: DriverConfig, roots: Roots | None = None) -> list[CheckResult]:
    """Run the checks and log each failure once, with its fix (the plugin's start-up)."""
    failed = [r for r in run_checks(roots or Roots(), needs_of(config)) if r.status == "fail"]
    for result in failed:
        log.warning("node check failed", check=result.name, detail=result.detail, fix=result.fix)
    return failed


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dradriver-kubeletplugin doctor",
        description="Checks that this node can serve the configured devices: the container "
        "runtime applies CDI, cgroups, the CDI directories, the kernel modules and device "
        "nodes the profiles need, AppArmor and fuse, free loop devices.",
    )
    parser.add_argument("--config", type=Path, help="the driver configuration file")
    parser.add_argument(
        "--host-root",
        type=Path,
        default=Path("/"),
        help="where the node's /proc, /sys, /dev, /etc and /var/run are (in a pod that mounts "
        "the host at /host: --host-root=/host) (default: %(default)s)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config) if args.config else DriverConfig()
    except DriverConfigError as e:
        print(f"dradriver-kubeletplugin doctor: error: {e}", file=sys.stderr)
        return 2
    roots = Roots() if args.host_root == Path("/") else Roots.under(args.host_root)
    results = run_checks(roots, needs_of(config))
    print(format_table(results))
    return 1 if any(r.status == "fail" for r in results) else 0
