"""``python -m devtools.image build [--name NAME] [--import]``: build (or find) the image.

Prints the archive's path on stdout and its name, digest, size and build
time on stderr. ``--import`` also loads it into the containerd of every
node of the running local cluster that has the real runtime, so that pods
naming ``dradriver:<version>`` with ``imagePullPolicy: IfNotPresent`` or
``Never`` start from it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from devtools.cluster.images import ImageError
from devtools.image.build import ensure_image
from devtools.image.importer import import_into_local_cluster


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.image")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build the dradriver image archive, or find it cached")
    build.add_argument("--name", help="image name (default docker.io/library/dradriver:VERSION)")
    build.add_argument(
        "--import",
        dest="import_",
        action="store_true",
        help="import it into the running local cluster's real-runtime nodes",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        image = ensure_image(args.name)
        how = "cached" if image.cached else f"built in {image.build_seconds:.0f}s"
        print(
            f"image {image.name} {image.manifest_digest[:19]} "
            f"{image.size / 1e6:.0f} MB ({how}, {time.monotonic() - started:.1f}s this run)",
            file=sys.stderr,
        )
        if args.import_:
            for node in import_into_local_cluster(image.path):
                print(f"imported into {node}'s containerd", file=sys.stderr)
    except ImageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(image.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
