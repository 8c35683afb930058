"""Explanation rows as text: a table for people, a short message for events and conditions.

Invariants:
- :func:`format_table` has one line per row (``available`` rows optional) under a header,
  columns padded to their widest cell, the reason last and unpadded.
- :func:`summarize` is at most ``max_length`` characters: "allocatable: ..." when every
  row is ``allocated``; otherwise the claim-level problems, then per request with a
  problem its reasons, how many devices are available and the four most common
  exclusions (naming up to five claims that hold the devices).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

from dradriver.allocator.explain import (
    ALLOCATED,
    AVAILABLE,
    ERROR,
    EXCLUDED,
    UNSATISFIED,
    ExplainRow,
)

__all__ = ["format_table", "summarize"]


def format_table(rows: Sequence[ExplainRow], *, include_available: bool = True) -> str:
    """A plain-text table: REQUEST DRIVER POOL DEVICE VERDICT REASON."""
    header = ("REQUEST", "DRIVER", "POOL", "DEVICE", "VERDICT", "REASON")
    lines = [
        (r.request or "-", r.driver or "-", r.pool or "-", r.device or "-", r.verdict, r.reason)
        for r in rows
        if include_available or r.verdict != AVAILABLE
    ]
    widths = [
        max([len(header[i]), *(len(line[i]) for line in lines)]) for i in range(len(header) - 1)
    ]
    out = []
    for line in [header, *lines]:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(line[:-1])]
        out.append("  ".join([*cells, line[-1]]).rstrip())
    return "\n".join(out)


def summarize(rows: Sequence[ExplainRow], max_length: int = 1024) -> str:
    """One message for an event or condition: per request, what excluded how many devices."""
    if not rows:
        return ""
    if all(r.verdict == ALLOCATED for r in rows):
        return "allocatable: " + ", ".join(f"{r.request}={r.pool}/{r.device}" for r in rows)
    parts: list[str] = []
    for row in rows:
        if row.verdict in (ERROR, UNSATISFIED) and not row.request:
            parts.append(row.reason)
    by_request: dict[str, list[ExplainRow]] = defaultdict(list)
    for row in rows:
        if row.request:
            by_request[row.request].append(row)
    for request, request_rows in by_request.items():
        problems = [r for r in request_rows if r.verdict in (ERROR, UNSATISFIED)]
        if not problems:
            continue
        devices = [r for r in request_rows if r.device]
        available = sum(1 for r in devices if r.verdict == AVAILABLE)
        reasons: Counter[str] = Counter()
        holders: list[str] = []
        for r in devices:
            if r.verdict != EXCLUDED:
                continue
            if r.category == "allocated":
                reasons["allocated to other claims"] += 1
                for holder in r.reason.removeprefix("allocated to claim ").split(", "):
                    if holder not in holders:
                        holders.append(holder)
            else:
                reasons[r.reason] += 1
        detail = "; ".join(
            f"{count} x {reason}"
            + (
                f" ({', '.join(holders[:5])}{' …' if len(holders) > 5 else ''})"
                if reason == "allocated to other claims"
                else ""
            )
            for reason, count in reasons.most_common(4)
        )
        head = "; ".join(p.reason for p in problems)
        text = f"request {request}: {head}"
        if devices:
            text += f" ({available} of {len(devices)} devices available"
            text += f"; excluded: {detail})" if detail else ")"
        parts.append(text)
    message = ". ".join(parts) or "cannot be allocated"
    if len(message) > max_length:
        message = message[: max_length - 1] + "…"
    return message
