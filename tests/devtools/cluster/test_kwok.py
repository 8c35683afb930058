"""The simulated nodes' configuration: heartbeat tuning, kwok's stages, the nodes' pools."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from devtools.cluster import kwok, kwokbin
from devtools.cluster.kwokpools import DEVICES_PER_NODE, MODELS, NodeSlices, SliceIndex, devices
from dradriver.k8s.objects import Obj
from dradriver.resourceslice.pool import node_pool


@pytest.mark.parametrize("count", [1, 20, 100, 400, 1000, 5000, 10_000])
def test_heartbeat_keeps_renewals_in_budget_and_inside_the_grace_period(count: int) -> None:
    beat = kwok.heartbeat(count)
    assert count / beat.renew_seconds <= kwok.RENEWALS_PER_SECOND
    # kwok renews at a quarter of the lease duration
    assert beat.lease_seconds / 4 >= beat.renew_seconds
    # the node lifecycle controller must see a renewal within its grace period, twice over
    assert beat.grace_seconds >= 2 * beat.renew_seconds - 1e-9 or count < 400
    assert beat.grace_seconds > beat.renew_seconds


def test_small_clusters_keep_the_controller_managers_defaults() -> None:
    assert kwok.controller_manager_args(0) == []
    assert kwok.controller_manager_args(100) == []
    assert kwok.controller_manager_args(5000) == ["--node-monitor-grace-period=500s"]


def test_kwok_manages_only_labelled_nodes_and_plays_our_stages() -> None:
    docs = yaml.safe_load_all(yaml.safe_dump_all(kwok.config(1000)))
    options, *stages = list(docs)
    assert options["kind"] == "KwokConfiguration"
    assert options["options"]["manageNodesWithLabelSelector"] == kwok.SELECTOR
    assert options["options"]["nodeLeaseDurationSeconds"] == kwok.heartbeat(1000).lease_seconds
    kinds = {(s["metadata"]["name"], s["spec"]["resourceRef"]["kind"]) for s in stages}
    assert kinds == {
        ("dradriver-node-ready", "Node"),
        ("dradriver-pod-running", "Pod"),
        ("dradriver-pod-delete", "Pod"),
    }
    delete = next(s for s in stages if s["metadata"]["name"] == "dradriver-pod-delete")
    assert delete["spec"]["next"] == {"finalizers": {"empty": True}, "delete": True}


def test_simulated_node_is_labelled_and_tainted() -> None:
    node = kwok.node_object("kwok-node-00007")
    assert node["metadata"]["labels"][kwok.LABEL] == "true"
    assert node["spec"]["taints"] == [kwok.TAINT]
    assert kwok.node_names(3) == ["kwok-node-00000", "kwok-node-00001", "kwok-node-00002"]


def test_node_pool_is_what_the_static_source_declares() -> None:
    pool = node_pool("x.example.com", "kwok-node-00000", devices(), [])
    assert len(pool.devices) == DEVICES_PER_NODE
    models = [d["attributes"]["model"]["string"] for d in pool.devices]
    assert sorted(set(models)) == sorted(MODELS)
    assert all("int" in d["attributes"]["index"] for d in pool.devices)


class _Recorder:
    """Stands in for the informer's handler registration only (the index is pure logic)."""

    def __init__(self) -> None:
        self.handlers: dict[str, Callable[..., None]] = {}

    def add_handler(self, **handlers: Callable[..., None]) -> None:
        self.handlers = handlers


def _slice(name: str, node: str) -> Obj:
    return {"metadata": {"name": name}, "spec": {"nodeName": node}}


def test_slice_index_gives_each_node_only_its_slices() -> None:
    informer = _Recorder()
    index = SliceIndex(informer)  # type: ignore[arg-type]
    a, b = NodeSlices(index, "a"), NodeSlices(index, "b")
    seen: list[str] = []
    a.add_handler(on_add=lambda obj: seen.append(obj["metadata"]["name"]))
    informer.handlers["on_add"](_slice("a-0", "a"))
    informer.handlers["on_add"](_slice("b-0", "b"))
    assert [s["metadata"]["name"] for s in a.items()] == ["a-0"]
    assert [s["metadata"]["name"] for s in b.items()] == ["b-0"]
    assert seen == ["a-0"]
    informer.handlers["on_delete"](_slice("a-0", "a"))
    assert a.items() == []


def test_kwok_build_key_follows_the_module(tmp_path: Path) -> None:
    source = tmp_path / "kwokbin"
    source.mkdir()
    gomod = (kwokbin.source_dir() / "go.mod").read_text()
    (source / "go.mod").write_text(gomod)
    (source / "go.sum").write_text("a\n")
    assert kwokbin.pinned_version(source) == "v0.8.0"
    first = kwokbin.source_key(source)
    (source / "go.sum").write_text("b\n")
    assert kwokbin.source_key(source) != first
