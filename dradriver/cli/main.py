"""``dradriver``: the umbrella command (``explain``; ``cluster`` and ``demo`` from devtools)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any

from dradriver import __version__
from dradriver.cli import configimport
from dradriver.log import configure


def _no_devtools(args: argparse.Namespace) -> int:
    print(
        f"dradriver {args.command}: the local cluster and the demo are dev tools, not part of "
        "the installed driver; in a checkout run `make install` (it installs ./devtools)",
        file=sys.stderr,
    )
    return 2


COMMAND_PLUGINS = "dradriver.commands"
"""Entry-point group through which other distributions add subcommands (devtools adds
``cluster`` and ``demo``); the core knows none of them by name."""


def _plugins() -> list[Any]:
    return [ep.load() for ep in entry_points(group=COMMAND_PLUGINS)]


def cmd_explain(args: argparse.Namespace) -> int:
    import asyncio

    from dradriver.cli.explain import run_explain

    print(
        asyncio.run(
            run_explain(args.claim, args.kubeconfig, not args.only_excluded, args.all_drivers)
        )
    )
    return 0


def build_parser(plugins: Sequence[Any]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dradriver",
        description="dradriver: a Kubernetes DRA driver. This command runs the local "
        "test cluster and the demo; the driver itself runs as dradriver-controller and "
        "dradriver-kubeletplugin.",
    )
    parser.add_argument("--version", action="version", version=f"dradriver {__version__}")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    sub = parser.add_subparsers(dest="command", required=True)

    explain = sub.add_parser(
        "explain",
        help="why a ResourceClaim is or is not allocated, device by device",
        description="Runs dradriver's allocator (the scheduler's semantics) for one claim "
        "against the cluster's slices, classes and other claims, and prints a table: "
        "for each candidate device, whether it could be allocated and why not.",
    )
    explain.add_argument("claim", metavar="NAMESPACE/CLAIM")
    explain.add_argument("--kubeconfig", help="kubeconfig (default: $KUBECONFIG, ~/.kube/config)")
    explain.add_argument(
        "--only-excluded", action="store_true", help="leave out devices that could be allocated"
    )
    explain.add_argument(
        "--all-drivers",
        action="store_true",
        help="show every driver's devices, not only those of the drivers the claim's "
        'DeviceClasses name (device.driver == "...")',
    )
    explain.set_defaults(func=cmd_explain)
    configimport.register(sub)
    for plugin in plugins:
        plugin.register(sub)
    if not plugins:
        for name in ("cluster", "demo"):
            sub.add_parser(name, help="needs the dev tools").set_defaults(func=_no_devtools)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    plugins = _plugins()
    args = build_parser(plugins).parse_args(argv)
    configure(args.log_level)
    errors: tuple[type[Exception], ...] = (ValueError, RuntimeError)
    for plugin in plugins:
        errors += tuple(plugin.ERRORS)
    try:
        code: int = args.func(args)
    except errors as e:
        print(f"dradriver: error: {e}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
