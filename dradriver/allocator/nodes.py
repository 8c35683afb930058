"""Nodes and node selectors as the allocator needs them.

:func:`selector_matches` is core/v1 ``NodeSelector`` matching (terms ORed, requirements of
a term ANDed, an empty term matches nothing; ``matchExpressions`` on labels with In, NotIn,
Exists, DoesNotExist, Gt, Lt; ``matchFields`` on ``metadata.name`` with In, NotIn).
:func:`merge_selectors` builds an allocation's node selector the way the scheduler's
``createNodeSelector`` does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dradriver.k8s.objects import Obj

__all__ = ["NodeInfo", "merge_selectors", "node_info", "node_name_selector", "selector_matches"]


@dataclass(frozen=True)
class NodeInfo:
    """A node's name and labels; ``key`` names both (the inventory's cache key), computed
    once: a NodeInfo is not changed after it is made."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    key: tuple[str, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        key = (self.name, *sorted(f"{k}={v}" for k, v in self.labels.items()))
        object.__setattr__(self, "key", key)


def node_info(node: Mapping[str, Any] | NodeInfo | str) -> NodeInfo:
    """A node from a Node object, a :class:`NodeInfo` or a bare name (no labels)."""
    if isinstance(node, NodeInfo):
        return node
    if isinstance(node, str):
        return NodeInfo(node)
    meta = node.get("metadata") or {}
    return NodeInfo(str(meta.get("name", "")), dict(meta.get("labels") or {}))


def _requirement_matches(req: Mapping[str, Any], value: str | None) -> bool:
    op = req.get("operator")
    values = list(req.get("values") or [])
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt"):
        if value is None or len(values) != 1:
            return False
        try:
            have, want = int(value), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def _term_matches(term: Mapping[str, Any], node: NodeInfo) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    for req in expressions:
        if not _requirement_matches(req, node.labels.get(str(req.get("key")))):
            return False
    for req in fields:
        value = node.name if req.get("key") == "metadata.name" else None
        if not _requirement_matches(req, value):
            return False
    return True


def selector_matches(selector: Mapping[str, Any] | None, node: NodeInfo) -> bool:
    if not selector:
        return False
    return any(_term_matches(term, node) for term in selector.get("nodeSelectorTerms") or [])


def node_name_selector(name: str) -> Obj:
    return {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [name]}]}
        ]
    }


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return (
        a.get("key") == b.get("key")
        and a.get("operator") == b.get("operator")
        and set(a.get("values") or []) == set(b.get("values") or [])
    )


def merge_selectors(selectors: Iterable[Mapping[str, Any]]) -> Obj | None:
    """One term with the requirements of every single-term selector (None if none)."""
    fields: list[Obj] = []
    expressions: list[Obj] = []
    for selector in selectors:
        terms = selector.get("nodeSelectorTerms") or []
        if len(terms) != 1:
            continue
        for source, target in (
            (terms[0].get("matchFields") or [], fields),
            (terms[0].get("matchExpressions") or [], expressions),
        ):
            for req in source:
                if not any(_same(req, have) for have in target):
                    target.append(dict(req))
    if not fields and not expressions:
        return None
    term: Obj = {}
    if expressions:
        term["matchExpressions"] = expressions
    if fields:
        term["matchFields"] = fields
    return {"nodeSelectorTerms": [term]}
