"""Load the image archive into the local cluster's containerd (the nodes with the real runtime).

The fake runtime runs no containers, so its nodes need no image.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from devtools.cluster import images, runtimebin
from devtools.cluster.config import Layout, default_state_dir, parse_runtime
from devtools.cluster.local import LocalCluster

# A ~100 MB archive on a busy 2-core machine.
IMPORT_TIMEOUT = 300.0


def import_into_cluster(archive: Path, cluster: LocalCluster) -> list[str]:
    """Import ``archive`` into every real-runtime node of ``cluster``; the node names."""
    state = cluster.running()
    if state is None:
        raise images.ImageError(
            "no local cluster is running; start one with `dradriver cluster up --runtime real`"
        )
    layout = dataclasses.replace(
        cluster.layout, nodes=len(state.nodes) or 1, runtime=parse_runtime(state.runtime)
    )
    nodes = [n for n in layout.all_nodes() if n.containerd is not None]
    if not nodes:
        raise images.ImageError(
            "the running local cluster has no node with the real runtime "
            "(`dradriver cluster up --runtime real`)"
        )
    ctr = runtimebin.ensure_runtime_binaries() / "ctr"
    for node in nodes:
        assert node.containerd is not None
        images.import_image(ctr, str(node.containerd.address), archive, timeout=IMPORT_TIMEOUT)
    return [n.name for n in nodes]


def import_into_local_cluster(archive: Path) -> list[str]:
    """:func:`import_into_cluster` for the cluster in the default state dir."""
    return import_into_cluster(archive, LocalCluster(Layout(state_dir=default_state_dir())))
