"""The node plugin's ResourceClaim status writes, confined by claim-status-policy.yaml.

Before Kubernetes 1.36 the plugin's ``resourceclaims/status`` grant is all the apiserver
checks, so the policy alone keeps a compromised plugin from rewriting claims. The local
cluster runs 1.36, which also checks ``resourceclaims/binding`` and ``resourceclaims/driver``
(granular status authorization). Every case runs twice: with the manifests' RBAC as
shipped, and with a test-only ClusterRole that grants those two broadly, so that the
apiserver lets through what 1.34 and 1.35 let through and only the policy decides.

The claims are written by the admin (no scheduler, no pods): allocated to the plugin's node
(a device of its pool, a network-pool device and another driver's device), to the other
node, or not at all.
"""

from __future__ import annotations

import copy
import shutil
import ssl
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from devtools.cluster.api import AdminAPI
from devtools.cluster.local import LocalCluster
from devtools.cluster.wait import wait_until
from devtools.harness.nodeplugin import NAMESPACE, SERVICE_ACCOUNT, plugin_identity
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1 as R
from dradriver.k8s.paths import path_for

DRIVER = "dradriver.dev"
OTHER_DRIVER = "other.example.com"
NODE = "node-2"  # where the plugin identity's token is bound
OTHER_NODE = "node-1"
NETWORK_POOL = "network/fabric-a"  # the controller's; its device status is the controller's
RBAC_ONLY = "rbac-1.36"
AS_ON_1_35 = "status-grant-only"
EMULATION = "dradriver-test-claim-status-as-on-1-35"
RBAC_API = "rbac.authorization.k8s.io/v1"


# ----- identity and RBAC -------------------------------------------------------------------


@pytest.fixture(scope="module")
def plugin(local_cluster: LocalCluster) -> Iterator[httpx.Client]:
    """An API client with the node plugin's identity on NODE (the DaemonSet's RBAC and token)."""
    work = Path("/tmp/dradriver-test-claimstatus")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(mode=0o700)
    with local_cluster.api() as api:
        kubeconfig = plugin_identity(api, local_cluster, NODE, work)
    token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    tls = ssl.create_default_context(cafile=str(local_cluster.layout.pki / "ca.crt"))
    with httpx.Client(
        base_url=local_cluster.layout.apiserver_url,
        verify=tls,
        headers={"Authorization": f"Bearer {token}"},
    ) as client:
        yield client


def plugin_may(plugin: httpx.Client, subresource: str, verb: str, name: str = "") -> bool:
    review = plugin.post(
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        json={
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "group": "resource.k8s.io",
                    "resource": "resourceclaims",
                    "subresource": subresource,
                    "verb": verb,
                    "name": name,
                }
            },
        },
    )
    review.raise_for_status()
    return bool(review.json()["status"].get("allowed"))


def emulated(plugin: httpx.Client) -> bool:
    """Whether the RBAC authorizer has picked up the emulation grant."""
    return plugin_may(plugin, "binding", "update") and plugin_may(
        plugin, "driver", "arbitrary-node:update", OTHER_DRIVER
    )


@pytest.fixture(scope="module", params=[RBAC_ONLY, AS_ON_1_35])
def rbac(
    request: pytest.FixtureRequest, plugin: httpx.Client, local_cluster: LocalCluster
) -> Iterator[str]:
    """The plugin's RBAC as shipped, or widened to what a 1.34/1.35 apiserver checks."""
    role = path_for(RBAC_API, "clusterroles", name=EMULATION)
    binding = path_for(RBAC_API, "clusterrolebindings", name=EMULATION)
    with local_cluster.api() as api:
        api.delete(binding)
        api.delete(role)
        if request.param == RBAC_ONLY:
            wait_until("no emulation grant", lambda: not emulated(plugin), 30)
            yield request.param
            return
        api.create(
            path_for(RBAC_API, "clusterroles"),
            {
                "metadata": {"name": EMULATION},
                "rules": [
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "resources": ["resourceclaims/binding"],
                        "verbs": ["update", "patch"],
                    },
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "resources": ["resourceclaims/driver"],
                        "verbs": ["arbitrary-node:update", "arbitrary-node:patch"],
                    },
                ],
            },
        )
        api.create(
            path_for(RBAC_API, "clusterrolebindings"),
            {
                "metadata": {"name": EMULATION},
                "subjects": [
                    {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}
                ],
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": EMULATION,
                },
            },
        )
        try:
            wait_until("the emulation grant in force", lambda: emulated(plugin), 30)
            yield request.param
        finally:
            api.delete(binding)
            api.delete(role)
            wait_until("the emulation grant gone", lambda: not emulated(plugin), 30)


# ----- claims ------------------------------------------------------------------------------


def node_selector(node: str) -> Obj:
    return {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }


def allocation_on(node: str) -> Obj:
    """A device of the node's pool, a network-pool device and another driver's device."""
    return {
        "devices": {
            "results": [
                {"request": "dev", "driver": DRIVER, "pool": node, "device": "policy-dev-0"},
                {"request": "net", "driver": DRIVER, "pool": NETWORK_POOL, "device": "accel-0"},
                {"request": "gpu", "driver": OTHER_DRIVER, "pool": node, "device": "gpu-0"},
            ]
        },
        "nodeSelector": node_selector(node),
    }


def device_status(driver: str, pool: str, device: str) -> Obj:
    return {
        "driver": driver,
        "pool": pool,
        "device": device,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Prepared",
                "message": "prepared by the node plugin",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
        "data": {"health": "ok"},
    }


OWN_DEVICE = device_status(DRIVER, NODE, "policy-dev-0")


@pytest.fixture(scope="module")
def claims_namespace(local_cluster: LocalCluster) -> Iterator[str]:
    name = f"t-claimstatus-{uuid.uuid4().hex[:6]}"
    with local_cluster.api() as api:
        api.create_namespace(name)
        try:
            yield name
        finally:
            api.delete_namespace(name)


def make_claim(api: AdminAPI, namespace: str, name: str, allocation: Obj | None) -> str:
    """A claim the admin allocated (or not); returns its path."""
    collection = path_for(R, "resourceclaims", namespace)
    claim = api.create(
        collection,
        {
            "metadata": {"name": name},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "dev", "exactly": {"deviceClassName": DRIVER}},
                        {"name": "net", "exactly": {"deviceClassName": DRIVER}},
                        {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}},
                    ]
                }
            },
        },
    )
    path = path_for(R, "resourceclaims", namespace, name)
    if allocation is not None:
        claim["status"] = {"allocation": allocation}
        api.request("PUT", path + "/status", claim)
    return path


def plugin_writes_status(
    plugin: httpx.Client, path: str, change: Callable[[Obj], None], dry_run: bool = False
) -> httpx.Response:
    """What the plugin would do: read the claim (it may), change its status, update it."""
    claim = plugin.get(path)
    claim.raise_for_status()
    changed = copy.deepcopy(claim.json())
    change(changed.setdefault("status", {}))
    return plugin.put(path + "/status", params={"dryRun": "All"} if dry_run else None, json=changed)


def add_device(entry: Obj) -> Callable[[Obj], None]:
    return lambda status: status.setdefault("devices", []).append(entry)


@pytest.fixture(scope="module")
def policy_in_force(
    plugin: httpx.Client, claims_namespace: str, local_cluster: LocalCluster
) -> None:
    """Wait until the apiserver enforces the policy (it loads policies asynchronously).

    The probe is a write that only the policy denies, whatever the RBAC: a status entry for
    the network-pool device (this driver, a claim on this node), made as a dry run.
    """
    with local_cluster.api() as api:
        path = make_claim(api, claims_namespace, "policy-probe", allocation_on(NODE))

    def denied() -> bool:
        entry = device_status(DRIVER, NETWORK_POOL, "accel-0")
        response = plugin_writes_status(plugin, path, add_device(entry), dry_run=True)
        return response.status_code == 403 and "own-claim-status" in response.text

    wait_until("the claim status policy in force", denied, 30)


# ----- cases -------------------------------------------------------------------------------


def test_plugin_writes_its_drivers_device_status_on_its_nodes_claim(
    rbac: str,
    policy_in_force: None,
    plugin: httpx.Client,
    api: AdminAPI,
    claims_namespace: str,
    unique_name: str,
) -> None:
    path = make_claim(api, claims_namespace, unique_name, allocation_on(NODE))
    response = plugin_writes_status(plugin, path, add_device(OWN_DEVICE))
    assert response.status_code == 200, response.text
    [stored] = api.get(path)["status"]["devices"]
    assert stored["driver"] == DRIVER and stored["device"] == "policy-dev-0"
    assert stored["data"] == {"health": "ok"}


def deallocate(status: Obj) -> None:
    del status["allocation"]


def allocate_here(status: Obj) -> None:
    status["allocation"] = allocation_on(NODE)


def reserve_for_a_pod(status: Obj) -> None:
    status["reservedFor"] = [{"resource": "pods", "name": "victim", "uid": str(uuid.uuid4())}]


# 1.36's own denials (status 422) name the synthetic subresource the plugin lacks.
NEEDS_BINDING = 'requires resource="resourceclaims/binding"'
NEEDS_DRIVER = 'requires resource="resourceclaims/driver"'
DENIED_CASES = [
    # (claim allocated to, what the plugin changes, the policy's denial, 1.36 RBAC's or None)
    pytest.param(
        NODE,
        deallocate,
        "may only write status.devices of ResourceClaims, not status.allocation",
        NEEDS_BINDING,
        id="deallocate",
    ),
    pytest.param(
        None,
        allocate_here,
        "may only write status.devices of ResourceClaims, not status.allocation",
        NEEDS_BINDING,
        id="allocate-a-pending-claim",
    ),
    pytest.param(
        NODE,
        reserve_for_a_pod,
        "may only write status.devices of ResourceClaims, not status.reservedFor",
        NEEDS_BINDING,
        id="reservedFor",
    ),
    pytest.param(
        NODE,
        add_device(device_status(OTHER_DRIVER, NODE, "gpu-0")),
        f"in the pool of its node 'node-2', not of {OTHER_DRIVER}/node-2/gpu-0",
        NEEDS_DRIVER,
        id="another-drivers-device",
    ),
    pytest.param(
        OTHER_NODE,
        add_device(device_status(DRIVER, OTHER_NODE, "policy-dev-0")),
        "runs on node 'node-2' and may only write the status of ResourceClaims allocated to "
        "that node; this one is allocated to node 'node-1'",
        NEEDS_DRIVER,
        id="claim-on-another-node",
    ),
    pytest.param(
        NODE,
        add_device(device_status(DRIVER, NETWORK_POOL, "accel-0")),
        f"in the pool of its node 'node-2', not of {DRIVER}/{NETWORK_POOL}/accel-0",
        None,  # 1.36 lets this driver's plugin write it on its node's claim
        id="network-pool-device",
    ),
]


@pytest.mark.parametrize(("allocated_to", "change", "policy_denial", "rbac_denial"), DENIED_CASES)
def test_plugin_cannot_rewrite_claim_status(
    allocated_to: str | None,
    change: Callable[[Obj], None],
    policy_denial: str,
    rbac_denial: str | None,
    rbac: str,
    policy_in_force: None,
    plugin: httpx.Client,
    api: AdminAPI,
    claims_namespace: str,
    unique_name: str,
) -> None:
    allocation = allocation_on(allocated_to) if allocated_to else None
    path = make_claim(api, claims_namespace, unique_name, allocation)
    before = api.get(path).get("status")
    response = plugin_writes_status(plugin, path, change)
    message = response.json().get("message", "")
    if rbac == RBAC_ONLY and rbac_denial is not None:
        # Kubernetes 1.36 denies it first, from the granular verbs rbac.yaml leaves out.
        assert response.status_code == 422, response.text
        assert rbac_denial in message
    else:
        assert response.status_code == 403, response.text
        assert "ValidatingAdmissionPolicy 'dradriver-kubeletplugin-own-claim-status'" in message
        assert policy_denial in message
    assert api.get(path).get("status") == before
