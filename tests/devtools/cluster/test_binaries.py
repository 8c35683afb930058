"""The version matrix's build side: one Go module per release, chosen per cluster."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from devtools.cluster import binaries
from devtools.cluster.config import Layout
from devtools.cluster.local import AlreadyRunning, ClusterState, running_cluster
from devtools.cluster.process import ProcessRecord


def test_every_supported_release_has_a_module_pinned_to_it() -> None:
    for version in binaries.SUPPORTED_VERSIONS:
        go_mod = (binaries.version_module(version) / "go.mod").read_text()
        assert re.search(rf"^require k8s\.io/kubernetes {re.escape(version)}$", go_mod, re.M) or (
            f"\tk8s.io/kubernetes {version}\n" in go_mod
        ), version
        staging = "v0." + version.removeprefix("v1.")
        pins = re.findall(r"^\t(k8s\.io/\S+) => (k8s\.io/\S+) (\S+)$", go_mod, re.M)
        assert len(pins) >= 30, version
        assert all(a == b and v == staging for a, b, v in pins), version
        assert (binaries.version_module(version) / "go.sum").stat().st_size > 0
    stable = [v for v in binaries.SUPPORTED_VERSIONS if "-" not in v]
    assert stable[-1] == binaries.PRIMARY_VERSION
    assert list(binaries.SUPPORTED_VERSIONS) == sorted(
        binaries.SUPPORTED_VERSIONS, key=lambda v: (binaries.minor_of(v), v)
    )


def test_kubectl_is_built_with_the_cluster() -> None:
    assert "kubectl" in binaries.COMPONENTS
    assert (binaries.module_dir() / "cmd" / "kubectl" / "main.go").exists()


def test_releases_are_cached_side_by_side(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRADRIVER_CACHE_DIR", str(tmp_path))
    dirs = {binaries.build_dir(v) for v in binaries.SUPPORTED_VERSIONS}
    assert len(dirs) == len(binaries.SUPPORTED_VERSIONS)
    for version in binaries.SUPPORTED_VERSIONS:
        assert binaries.build_dir(version).name.startswith(version + "-")


def test_the_version_comes_from_the_argument_then_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(binaries.VERSION_ENV, raising=False)
    assert binaries.resolve_version() == binaries.PRIMARY_VERSION
    monkeypatch.setenv(binaries.VERSION_ENV, "1.35")
    assert binaries.resolve_version() == "v1.35.4"
    assert binaries.resolve_version("v1.34") == "v1.34.4"
    assert binaries.resolve_version("v1.36.3") == "v1.36.3"


@pytest.mark.parametrize("bad", ["v1.33", "v1.36.9", "latest", "v1.37.2; rm -rf /"])
def test_an_unknown_version_names_the_choices(bad: str) -> None:
    with pytest.raises(binaries.BinaryError, match=re.escape("choose one of v1.34.4")):
        binaries.resolve_version(bad)


def test_a_generated_module_pins_exactly_the_releases_staging_modules() -> None:
    upstream = (
        "module k8s.io/kubernetes\n\ngo 1.27.0\n\nrequire (\n\tk8s.io/api v0.0.0\n)\n\n"
        "replace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n"
        "\tk8s.io/kubectl => ./staging/src/k8s.io/kubectl\n"
        "\tgithub.com/x/y => github.com/x/y v1.0.0\n)\n"
    )
    text = binaries.module_text("v1.38.0-beta.0", upstream)
    assert "go 1.27.0\n" in text
    assert "require k8s.io/kubernetes v1.38.0-beta.0\n" in text
    assert "\tk8s.io/api => k8s.io/api v0.38.0-beta.0\n" in text
    assert "\tk8s.io/kubectl => k8s.io/kubectl v0.38.0-beta.0\n" in text
    assert "github.com/x/y" not in text
    with pytest.raises(ValueError, match="release tag"):
        binaries.module_text("main", upstream)


def test_a_running_cluster_of_another_release_is_not_reused(tmp_path: Path) -> None:
    layout = Layout(state_dir=tmp_path, nodes=1)
    # This test's own process stands in for a live component (alive() checks pid + exe).
    me = ProcessRecord("etcd", os.getpid(), os.path.realpath(sys.executable), str(tmp_path / "l"))
    state = ClusterState(
        kubeconfig="k",
        node_name="node-1",
        kubelet_root="/var/lib/kubelet",
        feature_gates={},
        components=[me],
        nodes=["node-1"],
        kube_version="v1.35.4",
    )
    state.save(layout.state_file)
    needed = re.escape("runs Kubernetes v1.35.4, v1.37.2 is needed")
    with pytest.raises(AlreadyRunning, match=needed), running_cluster(layout, kube_version="v1.37"):
        pass
    with running_cluster(layout, kube_version="v1.35") as (cluster, found, started):
        assert not started and found.kube_version == cluster.kube_version == "v1.35.4"


def test_state_files_from_before_the_matrix_ran_1_36(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text(
        json.dumps({"kubeconfig": "k", "node_name": "n", "kubelet_root": "/r", "feature_gates": {}})
    )
    loaded = ClusterState.load(path)
    assert loaded is not None and loaded.kube_version == "v1.36.3"


def test_a_release_needing_a_newer_go_names_the_approved_toolchain() -> None:
    upstream = "module k8s.io/kubernetes\n\ngo 1.27.0\n"
    assert "toolchain go1.27.3\n" in binaries.module_text("v1.38.0-beta.0", upstream, "go1.26.8")
    assert "toolchain" not in binaries.module_text("v1.38.0-beta.0", upstream, "go1.27.3")
    assert "toolchain" not in binaries.module_text("v1.38.0-beta.0", upstream)


def test_a_refused_module_is_replaced_by_our_stand_in_and_built_with_it(tmp_path: Path) -> None:
    upstream = (
        "module k8s.io/kubernetes\n\ngo 1.27.0\n\nrequire (\n"
        "\tsigs.k8s.io/iptables-wrappers v1.0.0\n)\n"
    )
    text = binaries.module_text("v1.38.0-beta.0", upstream)
    assert "replace (\n\tsigs.k8s.io/iptables-wrappers => ./stubs/iptables-wrappers\n)" in text
    assert "stubs" not in binaries.module_text("v1.38.0-beta.0", "go 1.27.0\n")
    (tmp_path / "go.mod").write_text(text)
    (tmp_path / "go.sum").write_text("")
    names = [name for name, _ in binaries._source_files(tmp_path, tmp_path / "cmd")]
    assert "stubs/iptables-wrappers/go.mod" in names
    assert "stubs/iptables-wrappers/pkg/iptables/iptables.go" in names
    # The stand-in is part of the cache key: changing it rebuilds.
    assert binaries.source_key(tmp_path, "v1.38.0-beta.0") != binaries.source_key(
        tmp_path, "v1.38.0-beta.0", tmp_path / "nocmd"
    )


def test_the_pinned_1_38_module_builds_with_its_toolchain() -> None:
    module = binaries.version_module("v1.38.0-beta.0")
    assert binaries.toolchain_of(module) == binaries.NEWER_TOOLCHAIN
    assert binaries.go_env(module)["GOTOOLCHAIN"] == binaries.NEWER_TOOLCHAIN
    assert binaries.toolchain_of(binaries.version_module("v1.37.2")) is None
