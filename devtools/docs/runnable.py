"""The shell blocks the README and the docs mark as runnable, which tests/docs runs.

A fenced ``sh`` block is runnable when the line right before its opening fence is an HTML
comment (invisible on the page and on GitHub)::

    <!-- runnable -->                 no cluster: run in an empty temporary directory
    <!-- runnable: exits=0,1 -->      ... and these exit codes count as success
    <!-- runnable: cluster -->        needs the local cluster: run from the repository root

Options are separated by spaces (``<!-- runnable: cluster exits=0,1 -->``).

The blocks of one page and kind run as one ``bash -euo pipefail`` script, in the order
they appear (so a later block may use a file or an ``export`` of an earlier one), each
block's place echoed before it, so a failure's output names the block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from devtools import paths
from devtools.docs.pages import markdown_pages

MARKER = re.compile(r"^<!--\s*runnable(?::\s*(?P<options>[^>]*?))?\s*-->\s*$")
FENCE = re.compile(r"^```(?P<lang>[\w-]*)")


class RunnableError(ValueError):
    """A runnable marker that is not followed by a shell block, or an unknown option."""


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    script: str
    cluster: bool
    exits: tuple[int, ...]

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(paths.REPO)}:{self.line}"


def _options(text: str, where: str) -> tuple[bool, tuple[int, ...]]:
    cluster = False
    exits: tuple[int, ...] = (0,)
    for option in text.split():
        if option == "cluster":
            cluster = True
        elif re.fullmatch(r"exits=\d+(,\d+)*", option):
            exits = tuple(int(code) for code in option.removeprefix("exits=").split(","))
        else:
            raise RunnableError(f"{where}: unknown runnable option {option!r}")
    return cluster, exits


def blocks(page: Path) -> list[Block]:
    """The runnable blocks of one markdown page, in order."""
    lines = page.read_text().splitlines()
    found = []
    for i, line in enumerate(lines):
        match = MARKER.match(line.strip())
        if not match:
            continue
        where = f"{page.relative_to(paths.REPO)}:{i + 1}"
        indent = len(line) - len(line.lstrip())  # a block inside a list item is indented
        fence = FENCE.match(lines[i + 1].strip()) if i + 1 < len(lines) else None
        if fence is None or fence["lang"] not in ("sh", "bash", "shell"):
            raise RunnableError(f"{where}: a runnable marker must precede a ```sh block")
        end = next(
            (j for j in range(i + 2, len(lines)) if lines[j].strip().startswith("```")), None
        )
        if end is None:
            raise RunnableError(f"{where}: the block is not closed")
        cluster, exits = _options(match["options"] or "", where)
        script = "\n".join(text[indent:] for text in lines[i + 2 : end]) + "\n"
        found.append(Block(page, i + 2, script, cluster, exits))
    return found


def all_blocks() -> list[Block]:
    return [b for page in markdown_pages() for b in blocks(page)]


def script(page_blocks: list[Block]) -> str:
    """One bash script running ``page_blocks`` in order; the accepted exit codes of a
    block apply to its last command."""
    parts = ["set -euo pipefail"]
    for b in page_blocks:
        parts.append(f"echo '== {b.where}' >&2")
        if b.exits == (0,):
            parts.append(b.script)
        else:
            accepted = " ".join(str(code) for code in b.exits)
            parts.append("set +e\n" + b.script.rstrip("\n") + "\ncode=$?\nset -e")
            parts.append(
                f'case " {accepted} " in *" $code "*) ;; '
                f'*) echo "{b.where}: exit $code, not one of {accepted}" >&2; exit 1;; esac'
            )
    return "\n".join(parts) + "\n"


def by_page(cluster: bool) -> dict[Path, list[Block]]:
    """The runnable blocks of one kind, grouped by page."""
    grouped: dict[Path, list[Block]] = {}
    for b in all_blocks():
        if b.cluster == cluster:
            grouped.setdefault(b.page, []).append(b)
    return grouped
