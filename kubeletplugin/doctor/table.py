"""The results of the node checks as a table for a terminal.

Invariants: one row per result, columns aligned (STATUS, CHECK, DETAIL); under each ``fail``
and ``warn`` row that has a fix, an indented ``fix:`` line; a last line counting each status.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from kubeletplugin.doctor.model import CheckResult, Status

_HEADER = ("STATUS", "CHECK", "DETAIL")
_ORDER: tuple[Status, ...] = ("ok", "warn", "fail", "skip")


def format_table(results: Sequence[CheckResult]) -> str:
    status_width = max([len(_HEADER[0]), *(len(r.status) for r in results)])
    name_width = max([len(_HEADER[1]), *(len(r.name) for r in results)])
    indent = " " * (status_width + 2)

    def row(status: str, name: str, detail: str) -> str:
        return f"{status:<{status_width}}  {name:<{name_width}}  {detail}".rstrip()

    lines = [row(*_HEADER)]
    for result in results:
        lines.append(row(result.status, result.name, result.detail))
        if result.fix and result.status in ("fail", "warn"):
            lines.append(f"{indent}fix: {result.fix}")
    counts = Counter(r.status for r in results)
    lines.append(", ".join(f"{counts[s]} {s}" for s in _ORDER if counts[s]) or "no checks")
    return "\n".join(lines) + "\n"
