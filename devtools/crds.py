"""Write or check the committed CRD YAML generated from dradriver's pydantic models.

python -m devtools.crds --write    # regenerate the chart's crds/, manifests/controller/crd-*
python -m devtools.crds --check    # exit 1 if a committed file is out of date

The same text goes to both places: the Helm chart installs the CRDs from its ``crds/``
(deployments/helm/dradriver/crds), and the plain manifests carry them as before (the
file names are a user contract). :mod:`devtools.manifests` checks that the two agree.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from devtools import paths
from dradriver.api import networkpool, parameters
from dradriver.api.crdgen import CRDKind

KINDS: tuple[CRDKind, ...] = (parameters.CRD_KIND, networkpool.CRD_KIND)
MANIFESTS = paths.MANIFESTS / "controller"
CHART_CRDS = paths.REPO / "deployments" / "helm" / "dradriver" / "crds"


def crd_path(kind: CRDKind, manifests: Path = MANIFESTS) -> Path:
    return manifests / kind.file_name


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.crds", description=__doc__)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="write the CRD files")
    action.add_argument("--check", action="store_true", help="fail if a file is out of date")
    parser.add_argument(
        "--dir", type=Path, help=f"only this directory (default: {MANIFESTS} and {CHART_CRDS})"
    )
    args = parser.parse_args(argv)
    stale = 0
    dirs = (args.dir,) if args.dir else (MANIFESTS, CHART_CRDS)
    for kind, directory in ((k, d) for d in dirs for k in KINDS):
        path = crd_path(kind, directory)
        text = kind.crd_yaml()
        if args.check:
            if not path.exists() or path.read_text() != text:
                print(f"{path} is out of date; run python -m devtools.crds --write")
                stale += 1
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
