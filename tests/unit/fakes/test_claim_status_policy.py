"""The node plugin's claim-status ValidatingAdmissionPolicy (manifests/kubeletplugin/
claim-status-policy.yaml, rendered from the chart) evaluated by the policy fake
(tests/fakes/policies.py) without a cluster; tests/cluster/test_claim_status_policy.py
runs it on the real apiserver."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from dradriver.k8s.objects import Obj
from tests.fakes.admission import Decision
from tests.fakes.policies import admission_request, decide, validate

POLICY_FILE = (
    Path(__file__).resolve().parents[3] / "manifests/kubeletplugin/claim-status-policy.yaml"
)
DRIVER = "dradriver.dev"
PLUGIN = "system:serviceaccount:dradriver:dradriver-kubeletplugin"
NODE_KEY = "authentication.kubernetes.io/node-name"


def policy() -> Obj:
    docs = [d for d in yaml.safe_load_all(POLICY_FILE.read_text()) if d]
    found: list[Obj] = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    assert len(found) == 1
    return found[0]


def allocated(node: str = "node-1") -> Obj:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": DRIVER}}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "r", "driver": DRIVER, "pool": node, "device": "dev-0"}]
                },
                "nodeSelector": {"nodeSelectorTerms": [term]},
            }
        },
    }


def with_device(claim: Obj, driver: str, pool: str) -> Obj:
    out = copy.deepcopy(claim)
    out["status"]["devices"] = [
        {"driver": driver, "pool": pool, "device": "dev-0", "conditions": [{"type": "Ready"}]}
    ]
    return out


def status_update(new: Obj, old: Obj, username: str = PLUGIN, node: str = "node-1") -> Obj:
    return admission_request(
        "UPDATE",
        new,
        old,
        sub_resource="status",
        username=username,
        extra={NODE_KEY: [node]} if username == PLUGIN else None,
    )


def test_the_plugin_writes_its_drivers_device_status_on_its_node() -> None:
    old = allocated()
    verdict = validate(policy(), status_update(with_device(old, DRIVER, "node-1"), old))
    assert verdict.allowed, verdict.message


@pytest.mark.parametrize(
    ("driver", "pool", "node", "says"),
    [
        ("gpu.example.com", "node-1", "node-1", "not of gpu.example.com/node-1/dev-0"),
        (DRIVER, "node-2", "node-1", f"not of {DRIVER}/node-2/dev-0"),
        (DRIVER, "node-1", "node-2", "allocated to node 'node-1'"),
    ],
)
def test_the_plugin_is_held_to_its_driver_and_its_node(
    driver: str, pool: str, node: str, says: str
) -> None:
    old = allocated()
    verdict = validate(policy(), status_update(with_device(old, driver, pool), old, node=node))
    assert not verdict.allowed and says in verdict.message, verdict.message


def test_the_plugin_may_not_touch_the_allocation() -> None:
    old = allocated()
    new = copy.deepcopy(old)
    new["status"]["allocation"]["devices"]["results"][0]["device"] = "dev-1"
    verdict = validate(policy(), status_update(new, old))
    assert not verdict.allowed
    assert verdict.message.endswith("not status.allocation"), verdict.message


def test_only_the_plugin_is_held_by_it() -> None:
    """The scheduler deallocating a claim, another driver's plugin writing its status: the
    match condition keeps the policy off their writes (without it they would be denied)."""
    old = allocated()
    cleared = copy.deepcopy(old)
    del cleared["status"]["allocation"]
    writes = [
        status_update(cleared, old, username="system:kube-scheduler"),
        status_update(with_device(old, "gpu.example.com", "node-1"), old, username="gpu-plugin"),
    ]
    unmatched = policy()
    del unmatched["spec"]["matchConditions"]
    for request in writes:
        assert decide(policy(), request) is Decision.SKIP
        assert validate(policy(), request).allowed
        assert not validate(unmatched, request).allowed  # what the condition prevents


def test_it_matches_claim_status_updates_only() -> None:
    old = allocated()
    spec_update = admission_request("UPDATE", old, old, username=PLUGIN, extra={NODE_KEY: ["n"]})
    assert decide(policy(), spec_update) is Decision.SKIP
