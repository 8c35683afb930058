"""`dradriver cluster up` tells its user how to reach the cluster with the tools we build."""

from __future__ import annotations

from pathlib import Path

from devtools.cli import usage_hints


def test_hints_name_the_kubeconfig_kubectl_and_the_built_helm() -> None:
    lines = usage_hints("/s/kubeconfig", Path("/c/kube/v1.37.2-x"), Path("/c/helm/helm"))
    assert lines[0] == "kubectl: KUBECONFIG=/s/kubeconfig /c/kube/v1.37.2-x/kubectl get nodes"
    assert lines[1] == "helm:    KUBECONFIG=/s/kubeconfig /c/helm/helm list -A"
    assert "On the local cluster" in lines[2]


def test_hints_say_how_to_build_helm_when_it_is_not_built() -> None:
    [_, helm, _] = usage_hints("/s/kubeconfig", Path("/k"), None)
    assert "$(make -s helm) list -A" in helm
    assert "builds helm v3" in helm
