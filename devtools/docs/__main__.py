"""``python -m devtools.docs [--check]``: write (or check) every generated part of the docs.

The reference pages (configuration, Helm values, metrics, command line) and the diagrams'
SVGs. ``--check`` writes nothing and exits 1 naming each file that differs; ``make docs``
runs it without ``--check`` before ``mkdocs build --strict``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from devtools import paths
from devtools.docs import cliref, configref, diagrams, helmref, metricsref
from devtools.docs.pages import sync

REFERENCES: tuple[tuple[Path, Callable[[], str]], ...] = (
    (configref.PAGE, configref.render),
    (helmref.PAGE, helmref.render),
    (metricsref.PAGE, metricsref.render),
    (cliref.PAGE, cliref.render),
)


def generated() -> dict[Path, str]:
    """Every generated file of the docs and what it must hold."""
    files = {page: render() for page, render in REFERENCES}
    files.update(diagrams.outputs())
    return files


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.docs", description=__doc__)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 on drift")
    args = parser.parse_args(argv)
    stale = []
    for path, text in generated().items():
        outcome = sync(path, text, write=not args.check)
        if outcome.changed:
            stale.append(path.relative_to(paths.REPO))
    for path in stale:
        verb = "differs from its source" if args.check else "written"
        print(f"{path}: {verb}", file=sys.stderr)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
