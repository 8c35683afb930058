"""The shape contract: no product module over 600 lines, no function over 80 lines.

Run by ``make lint`` (``python -m devtools.shape``). A room that grows past its limit holds
two things; the fix is to split it, not to raise the limit. Today's exceptions are listed in
``pyproject.toml`` under ``[tool.dradriver.shape]``, each with the reason it stays, and the
check fails as well when a listed exception no longer needs its entry (so the list only
shrinks).

Invariants:
- Product code is ``dradriver/``, ``controller/`` and ``kubeletplugin/`` (generated gRPC
  stubs excluded); tests, devtools and bench are not measured.
- A module's size is its number of lines; a function's is from its ``def`` line (decorators
  excluded) to its last line, nested functions counted inside their parent as well as alone.
"""

from __future__ import annotations

import argparse
import ast
import sys
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from devtools.paths import REPO

MODULE_LINES = 600
FUNCTION_LINES = 80
PRODUCT = ("dradriver", "controller", "kubeletplugin")
SKIPPED_PARTS = ("gen", "__pycache__")


@dataclass(frozen=True)
class Finding:
    """One module or function over its limit: ``where`` is ``path`` or ``path:qualname``."""

    where: str
    lines: int
    limit: int

    def __str__(self) -> str:
        return f"{self.where}: {self.lines} lines (limit {self.limit})"


def product_files(root: Path) -> Iterator[Path]:
    for top in PRODUCT:
        for path in sorted((root / top).rglob("*.py")):
            if not any(part in SKIPPED_PARTS for part in path.relative_to(root).parts):
                yield path


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = f"{prefix}{node.name}"
            yield name, node
            yield from _functions(node, f"{name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")


def measure(path: Path, relative: str) -> list[Finding]:
    """The findings of one file, measured against the limits."""
    text = path.read_text(encoding="utf-8")
    findings = []
    lines = len(text.splitlines())
    if lines > MODULE_LINES:
        findings.append(Finding(relative, lines, MODULE_LINES))
    for name, node in _functions(ast.parse(text, filename=relative)):
        assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        size = (node.end_lineno or node.lineno) - node.lineno + 1
        if size > FUNCTION_LINES:
            findings.append(Finding(f"{relative}:{name}", size, FUNCTION_LINES))
    return findings


def exceptions(pyproject: Path) -> dict[str, str]:
    """``[tool.dradriver.shape] exceptions``: where -> the reason it may stay over."""
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    table = data.get("tool", {}).get("dradriver", {}).get("shape", {})
    listed = table.get("exceptions", {})
    for where, reason in listed.items():
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(f"[tool.dradriver.shape] exceptions.{where!r}: give a reason")
    return dict(listed)


def check(root: Path) -> tuple[list[Finding], list[str]]:
    """(findings not excepted, excepted places that are within the limits now)."""
    allowed = exceptions(root / "pyproject.toml")
    findings = [
        f for path in product_files(root) for f in measure(path, path.relative_to(root).as_posix())
    ]
    over = [f for f in findings if f.where not in allowed]
    found = {f.where for f in findings}
    stale = sorted(where for where in allowed if where not in found)
    return over, stale


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=REPO, help="the repository root")
    args = parser.parse_args(argv)
    over, stale = check(args.root)
    for finding in over:
        print(f"shape: {finding}: split it (or list it with a reason in pyproject.toml)")
    for where in stale:
        print(f"shape: {where} is within the limits now: remove its exception")
    if over or stale:
        return 1
    print(f"shape: every product module <= {MODULE_LINES} lines, function <= {FUNCTION_LINES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
