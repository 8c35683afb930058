"""``python -m bench``: every benchmark at full size (``make bench``), or tiny (``--smoke``).

``python -m bench [--smoke] [--only a,b] [--page docs/benchmarks.md] [--list]``

Benchmarks that need clusters on the usual ports run first; those that reuse the usual
local cluster run last, inside one cluster started here (or the running one), so that
they do not each start and stop their own. With ``--page``, the output goes into that
page's performance section (between the markers) with the machine, the date and the
versions.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.suite import Run, discover, run, section, write_section


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="each benchmark's SMOKE_ARGS")
    parser.add_argument("--only", default="", help="comma-separated benchmark names")
    parser.add_argument(
        "--page", type=Path, help="write the performance section into this Markdown page"
    )
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(argv)
    benches = discover()
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {b.name for b in benches}
        if unknown:
            parser.error(f"no such benchmark: {', '.join(sorted(unknown))}")
        benches = [b for b in benches if b.name in wanted]
    if args.list:
        for b in benches:
            print(f"{b.module:<32} cluster: {b.cluster:<10} smoke: {' '.join(b.smoke_args)}")
        return 0
    runs: list[Run] = []
    shared_cluster: contextlib.ExitStack | None = None
    try:
        for b in benches:
            if b.cluster == "shared" and shared_cluster is None:
                from bench.common import shared_layout
                from devtools.cluster.local import running_cluster

                shared_cluster = contextlib.ExitStack()
                shared_cluster.enter_context(running_cluster(shared_layout()))
            argv_b = b.smoke_args if args.smoke else ()
            print(f"\n=== python -m {b.module} {' '.join(argv_b)}", flush=True)
            runs.append(run(b, argv_b, echo=True))
    finally:
        if shared_cluster is not None:
            shared_cluster.close()
    print("\n=== summary")
    for r in runs:
        print(
            f"{r.bench.module:<32} {'ok' if r.ok else f'FAILED ({r.returncode})':<12}"
            f" {r.seconds:7.0f} s"
        )
    if args.page is not None:
        write_section(args.page, section(runs))
        print(f"wrote the performance section of {args.page}")
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
