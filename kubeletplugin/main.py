"""``dradriver-kubeletplugin``: the node component serving DRA to the kubelet."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from dradriver import DEFAULT_DRIVER_NAME


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dradriver-kubeletplugin",
        description="Registers with the kubelet, publishes this node's ResourceSlices and "
        "prepares devices for pods (DRA), optionally through the device-plugin API too.",
    )
    parser.add_argument(
        "--driver-name", default=DEFAULT_DRIVER_NAME, help="DRA driver name (default: %(default)s)"
    )
    parser.add_argument("--node-name", help="this node's name (default: env NODE_NAME)")
    parser.add_argument(
        "--kubelet-root",
        default="/var/lib/kubelet",
        help="kubelet root dir; plugin sockets live under it",
    )
    parser.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster config)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    build_parser().parse_args(argv)
    print("dradriver-kubeletplugin: not implemented yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
