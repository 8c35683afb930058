"""The candidate nodes the searches send: one tuple until a node's name or labels change."""

from __future__ import annotations

from typing import Any, cast

from controller.claims.context import ClaimSources
from controller.claims.search import SearchBatches
from tests.fakes.informer import FakeInformer
from tests.unit.dradriver.allocator.builders import node


def searches(nodes: FakeInformer) -> SearchBatches:
    sources = ClaimSources(
        cast(Any, FakeInformer()),
        cast(Any, FakeInformer()),
        cast(Any, FakeInformer()),
        cast(Any, nodes),
    )
    return SearchBatches(cast(Any, None), sources, [], timeout=10.0)


def test_a_status_update_keeps_the_nodes_a_new_label_or_node_replaces_them() -> None:
    nodes = FakeInformer(node("a"), node("b"))
    batches = searches(nodes)
    first = batches.nodes()
    assert [n.name for n in first] == ["a", "b"]
    busy = node("a")
    busy["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    nodes.apply(busy)  # a heartbeat: the same name and labels
    assert batches.nodes() is first
    nodes.apply(node("a", zone="z1"))
    relabelled = batches.nodes()
    assert relabelled is not first and relabelled[0].labels == {"zone": "z1"}
    nodes.apply(node("c"))
    assert [n.name for n in batches.nodes()] == ["a", "b", "c"]
    nodes.remove(node("b"))
    assert [n.name for n in batches.nodes()] == ["a", "c"]
