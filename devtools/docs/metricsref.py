"""The metrics reference, from the metric declarations in the product code.

Reads the sources (never imports the applications: the import contracts forbid it) and
finds every ``Counter(...)``, ``Gauge(...)`` and ``Histogram(...)`` of ``dradriver.metrics``
whose name is a string literal or a module-level string constant: its name as exposed
(counters with ``_total``), kind, help text, labels, and the module that declares it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from devtools import paths
from devtools.docs.pages import DOCS, banner, cell

PAGE = DOCS / "reference" / "metrics.md"
PACKAGES = ("dradriver", "controller", "kubeletplugin")
KINDS = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram"}

# Which process serves a module's metrics, by module prefix (first match wins).
SERVED_BY = (
    ("kubeletplugin.", "dradriver-kubeletplugin"),
    ("controller.", "dradriver-controller"),
    ("dradriver.webhook.", "dradriver-controller (webhook port) and dradriver-webhook"),
    ("dradriver.runtime.", "dradriver-controller (its informers, queues and Lease)"),
)


class DeclarationError(ValueError):
    """A metric declaration whose name or help text is not a constant string."""


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str
    help: str
    labels: tuple[str, ...]
    module: str

    @property
    def exposed(self) -> str:
        return f"{self.name.removesuffix('_total')}_total" if self.kind == "counter" else self.name

    @property
    def served_by(self) -> str:
        for prefix, process in SERVED_BY:
            if self.module.startswith(prefix):
                return process
        return "the process that creates it"


def _constants(tree: ast.Module) -> dict[str, ast.expr]:
    """Module-level assignments, and names imported from the product's own modules."""
    found: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            source = paths.REPO / Path(*node.module.split(".")).with_suffix(".py")
            if node.module.split(".")[0] in PACKAGES and source.is_file():
                theirs = _constants(ast.parse(source.read_text()))
                for alias in node.names:
                    if alias.name in theirs:
                        found[alias.asname or alias.name] = theirs[alias.name]
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                found[target.id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            found[node.target.id] = node.value
    return found


def _string(node: ast.expr | None, constants: dict[str, ast.expr]) -> str | None:
    if isinstance(node, ast.Name) and node.id in constants:
        node = constants[node.id]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _labels(node: ast.expr | None, constants: dict[str, ast.expr]) -> tuple[str, ...] | None:
    if node is None:
        return ()
    if isinstance(node, ast.Name) and node.id in constants:
        node = constants[node.id]
    if isinstance(node, ast.List | ast.Tuple):
        items = [_string(e, constants) for e in node.elts]
        if all(i is not None for i in items):
            return tuple(i for i in items if i is not None)
    return None


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(paths.REPO).with_suffix("").parts)


def declarations(path: Path) -> list[Metric]:
    """The metrics ``path`` declares."""
    tree = ast.parse(path.read_text(), filename=str(path))
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "dradriver.metrics"
        for alias in node.names
        if alias.name in KINDS
    }
    if path == paths.REPO / "dradriver" / "metrics.py" or not imported:
        return []
    constants = _constants(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if node.func.id not in imported:
            continue
        keywords = {k.arg: k.value for k in node.keywords}
        args = list(node.args)
        name = _string(args[0] if args else keywords.get("name"), constants)
        text = _string(args[1] if len(args) > 1 else keywords.get("documentation"), constants)
        labels = _labels(args[2] if len(args) > 2 else keywords.get("labelnames"), constants)
        where = f"{path.relative_to(paths.REPO)}:{node.lineno}"
        if name is None or text is None or labels is None:
            raise DeclarationError(f"{where}: name, help and labels must be constant strings")
        found.append(Metric(name, KINDS[node.func.id], text, labels, _module_name(path)))
    return found


def collect() -> list[Metric]:
    metrics: list[Metric] = []
    for package in PACKAGES:
        for path in sorted((paths.REPO / package).rglob("*.py")):
            if "gen" in path.relative_to(paths.REPO).parts:
                continue
            metrics.extend(declarations(path))
    return sorted(metrics, key=lambda m: m.exposed)


def render() -> str:
    metrics = collect()
    out = [
        banner("devtools.docs.metricsref, from the metric declarations in the code"),
        "# Metrics reference",
        "",
        "Every metric the processes serve on `/metrics` (text exposition format 0.0.4). The",
        "node plugin serves them on `kubeletPlugin.httpPort` (8080), the controller on",
        "`controller.httpPort` (8081) and on the webhook port; `metrics.serviceMonitor` in the",
        "chart makes the Prometheus operator scrape both. Counters are exposed with `_total`",
        "(and a `_created` gauge), histograms with `_bucket`, `_sum` and `_count`.",
        "",
        "| Metric | Kind | Labels | Help | Served by | Declared in |",
        "|---|---|---|---|---|---|",
    ]
    for m in metrics:
        labels = ", ".join(f"`{label}`" for label in m.labels) or "none"
        out.append(
            f"| `{m.exposed}` | {m.kind} | {labels} | {cell(m.help)} | {cell(m.served_by)}"
            f" | `{m.module}` |"
        )
    out.append("")
    return "\n".join(out)
