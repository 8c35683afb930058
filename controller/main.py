"""``dradriver-controller``: the leader-elected control-plane component."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from dradriver import DEFAULT_DRIVER_NAME


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dradriver-controller",
        description="Allocates ResourceClaims that carry dradriver parameters, owns "
        "network-attached device pools and cleans up after deallocation.",
    )
    parser.add_argument(
        "--driver-name", default=DEFAULT_DRIVER_NAME, help="DRA driver name (default: %(default)s)"
    )
    parser.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster config)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    build_parser().parse_args(argv)
    print("dradriver-controller: not implemented yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
