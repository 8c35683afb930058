"""`dradriver cluster up` tells its user how to reach the cluster with the tools we build."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from devtools.cli import _cluster, register, usage_hints


def test_hints_name_the_kubeconfig_kubectl_and_the_built_helm() -> None:
    lines = usage_hints("/s/kubeconfig", Path("/c/kube/v1.37.2-x"), Path("/c/helm/helm"))
    assert lines[0] == "kubectl: KUBECONFIG=/s/kubeconfig /c/kube/v1.37.2-x/kubectl get nodes"
    assert lines[1] == "helm:    KUBECONFIG=/s/kubeconfig /c/helm/helm list -A"
    assert "On the local cluster" in lines[2]


def test_hints_say_how_to_build_helm_when_it_is_not_built() -> None:
    [_, helm, _] = usage_hints("/s/kubeconfig", Path("/k"), None)
    assert "$(make -s helm) list -A" in helm
    assert "builds helm v3" in helm


def test_cluster_up_takes_a_number_of_simulated_nodes(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["cluster", "up", "--state-dir", str(tmp_path), "--kwok-nodes", "7"])
    assert _cluster(args).kwok_nodes == 7
    down = parser.parse_args(["cluster", "down", "--state-dir", str(tmp_path)])
    assert _cluster(down).kwok_nodes == 0
    with pytest.raises(SystemExit):
        parser.parse_args(["cluster", "up", "--kwok-nodes", "-1"])
