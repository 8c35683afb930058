"""The controller half of ``dradriver demo``.

With dradriver-controller running (the manifests' RBAC, its own ServiceAccount), it
shows on the same node plugin: a claim allocated immediately with no pod and later used
by one; a network-attached device from a NetworkDevicePool, the pod held by the
scheduler until the controller sets the ``attached`` binding condition; and the
explanation of a claim that cannot be allocated (``dradriver explain``).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from devtools.cluster.api import AdminAPI
from devtools.cluster.kubeletstate import kubelet_cdi_ids
from devtools.cluster.local import LocalCluster
from devtools.cluster.wait import wait_until
from devtools.harness.nodeplugin import NodePlugin
from dradriver import DEFAULT_DRIVER_NAME
from dradriver.api import networkpool as net
from dradriver.api import parameters as params
from dradriver.host.cdi import CDIRegistry
from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for

DRIVER = DEFAULT_DRIVER_NAME
NAMESPACE = "dradriver-demo-controller"
POOL = "demo-fabric"
FABRIC_CLASS = "fabric.dradriver.dev"
PAUSE = "registry.k8s.io/pause:3.10"
POOLS = f"{DRIVER}/{net.VERSION}"
NODE = "node-1"  # where the demo's node plugin runs (the local cluster's first node)
WEBHOOK = "dradriver-demo-webhook"


def _claim_spec(device_class: str, selector: str | None = None) -> Obj:
    exactly: Obj = {"deviceClassName": device_class}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}}


def _pod(name: str, claim_ref: Obj) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "dev", **claim_ref}],
            "containers": [
                {"name": "main", "image": PAUSE, "resources": {"claims": [{"name": "dev"}]}}
            ],
        },
    }


def _devices(claim: Obj) -> list[Obj]:
    return list(
        ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results")
        or []
    )


def run_controller_demo(
    cluster: LocalCluster,
    api: AdminAPI,
    plugin: NodePlugin,
    say: Callable[[str], None],
    timeout: float,
) -> int:
    from devtools.harness.controller import (
        ControllerProcess,
        controller_kubeconfig,
        register_webhook,
        unregister_webhook,
        webhook_tls,
    )

    work = Path(tempfile.mkdtemp(prefix="dradriver-demo-controller-"))
    proc = ControllerProcess(
        "demo",
        controller_kubeconfig(api, cluster, work),
        work,
        extra_args=["--no-leader-elect", f"--allocation-namespace={NAMESPACE}"],
        webhook=webhook_tls(cluster, work),
    )
    proc.start()
    try:
        proc.wait_ready(timeout)
        say("dradriver-controller running (ServiceAccount dradriver-controller, manifests' RBAC)")
        # Ignore: a demo interrupted before unregistering must not block the cluster.
        register_webhook(api, proc, WEBHOOK, failure_policy="Ignore")
        say("its admission webhook registered (by URL on 127.0.0.1, TLS)")
        _fresh_namespace(api, timeout)
        _webhook(api, say)
        _immediate(api, say, timeout)
        _network(cluster, api, plugin, say, timeout)
        _explain(cluster, api, say, timeout)
        api.delete_namespace(NAMESPACE, timeout)
        api.delete(path_for(POOLS, net.PLURAL, name=POOL))
        wait_until(
            f"NetworkDevicePool {POOL} deleted",
            lambda: api.get_or_none(path_for(POOLS, net.PLURAL, name=POOL)) is None,
            timeout,
        )
        api.delete(path_for(RESOURCE_V1, "deviceclasses", name=FABRIC_CLASS))
        say("claims deleted and deallocated; fabric device detached; pool and its slices gone")
        return 0
    finally:
        unregister_webhook(api, WEBHOOK)
        proc.stop()
        shutil.rmtree(work, ignore_errors=True)


def _webhook(api: AdminAPI, say: Callable[[str], None]) -> None:
    bad = {
        "apiVersion": f"{DRIVER}/{params.VERSION}",
        "kind": params.KIND,
        "metadata": {"name": "fast"},
        "spec": {"profile": "fast", "selectors": ["device.attributes["]},
    }
    try:
        api.create(path_for(f"{DRIVER}/{params.VERSION}", params.PLURAL, NAMESPACE), bad)
    except KubeAPIError as e:
        say(
            f"DeviceClaimParameters with a broken CEL selector: denied ({e.status}): "
            f"{str(e.body.get('message', '')).splitlines()[0]}"  # CEL adds a caret diagram
        )
        return
    raise RuntimeError("the webhook admitted invalid DeviceClaimParameters")


def _fresh_namespace(api: AdminAPI, timeout: float) -> None:
    api.delete_namespace(NAMESPACE, timeout)  # a leftover of an interrupted run
    api.create_namespace(NAMESPACE)


def _get_claim(api: AdminAPI, name: str) -> Obj:
    return api.get(path_for(RESOURCE_V1, "resourceclaims", NAMESPACE, name))


def _running(api: AdminAPI, name: str) -> Obj | None:
    pod = api.get(path_for("v1", "pods", NAMESPACE, name))
    return pod if (pod.get("status") or {}).get("phase") == "Running" else None


def _immediate(api: AdminAPI, say: Callable[[str], None], timeout: float) -> None:
    api.create(
        path_for(RESOURCE_V1, "resourceclaims", NAMESPACE),
        {
            "metadata": {"name": "early", "annotations": {"dradriver.dev/allocation": "Immediate"}},
            "spec": _claim_spec(DRIVER),
        },
    )
    say("created claim early with annotation dradriver.dev/allocation: Immediate (no pod)")

    def allocated() -> Obj | None:
        claim = _get_claim(api, "early")
        return claim if _devices(claim) else None

    claim = wait_until("claim early allocated", allocated, timeout)
    devices = ", ".join(f"{r['pool']}/{r['device']}" for r in _devices(claim))
    say(f"early: allocated {devices} by dradriver-controller, before any pod exists")
    api.create(
        path_for("v1", "pods", NAMESPACE), _pod("early-user", {"resourceClaimName": "early"})
    )
    wait_until("pod early-user Running", lambda: _running(api, "early-user"), timeout)
    say("early-user: Running with the pre-allocated claim")


def _network(
    cluster: LocalCluster,
    api: AdminAPI,
    plugin: NodePlugin,
    say: Callable[[str], None],
    timeout: float,
) -> None:
    if api.get_or_none(path_for(POOLS, net.PLURAL, name=POOL)):
        api.delete(path_for(POOLS, net.PLURAL, name=POOL))
        wait_until(
            "old pool gone",
            lambda: api.get_or_none(path_for(POOLS, net.PLURAL, name=POOL)) is None,
            timeout,
        )
    api.create(
        path_for(POOLS, net.PLURAL),
        {
            "apiVersion": POOLS,
            "kind": net.KIND,
            "metadata": {"name": POOL},
            "spec": {
                # Reachable from the demo's node (where its node plugin runs).
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {
                                    "key": "metadata.name",
                                    "operator": "In",
                                    "values": [NODE],
                                }
                            ]
                        }
                    ]
                },
                "attach": {"backend": "simulated", "simulated": {"latencySeconds": 2}},
                "devices": [
                    {
                        "name": f"fabric-{i}",
                        "attributes": {"kind": {"string": "fabric"}, "port": {"int": i}},
                        "env": {"FABRIC_PORT": str(i)},
                    }
                    for i in range(2)
                ],
            },
        },
    )
    api.delete(path_for(RESOURCE_V1, "deviceclasses", name=FABRIC_CLASS))
    api.create(
        path_for(RESOURCE_V1, "deviceclasses"),
        {
            "metadata": {"name": FABRIC_CLASS},
            "spec": {
                "selectors": [
                    {
                        "cel": {
                            # Node-local devices have no "kind": test before reading it
                            # (a CEL error would fail the whole scheduling attempt).
                            "expression": f'device.driver == "{DRIVER}" && '
                            f'"kind" in device.attributes["{DRIVER}"] && '
                            f'device.attributes["{DRIVER}"].kind == "fabric"'
                        }
                    }
                ]
            },
        },
    )

    def published() -> list[Obj]:
        return [
            s
            for s in api.items(path_for(RESOURCE_V1, "resourceslices"))
            if s["spec"]["pool"]["name"] == net.pool_name(POOL)
        ]

    [slice_] = wait_until("network pool published", published, timeout)
    say(
        f"NetworkDevicePool {POOL} published by the controller: slice {slice_['metadata']['name']} "
        "(node selector instead of a node name; devices bindsToNode, binding condition "
        "dradriver.dev/attached)"
    )
    api.create(
        path_for(RESOURCE_V1, "resourceclaims", NAMESPACE),
        {"metadata": {"name": "fabric"}, "spec": _claim_spec(FABRIC_CLASS)},
    )
    api.create(
        path_for("v1", "pods", NAMESPACE), _pod("fabric-user", {"resourceClaimName": "fabric"})
    )
    say("created pod fabric-user with claim fabric (class fabric.dradriver.dev)")
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and "running" not in seen:
        claim = _get_claim(api, "fabric")
        results = _devices(claim)
        if results and "allocated" not in seen:
            seen.add("allocated")
            r = results[0]
            say(
                f"fabric: scheduler allocated {r['pool']}/{r['device']}; pod held in PreBind "
                "until the device is attached"
            )
        entry = (
            net.device_status(claim, DRIVER, results[0]["pool"], results[0]["device"])
            if results
            else None
        )
        if net.condition_true(entry, net.attached_condition(DRIVER)) and "attached" not in seen:
            seen.add("attached")
            node = (entry or {}).get("data", {}).get("node")
            say(f"fabric: controller attached it to {node}; condition dradriver.dev/attached=True")
        if _running(api, "fabric-user"):
            seen.add("running")
            pod = api.get(path_for("v1", "pods", NAMESPACE, "fabric-user"))
            say(f"fabric-user: Running on {pod['spec']['nodeName']}")
        time.sleep(0.2)
    if "running" not in seen:
        raise TimeoutError(f"network device demo timed out; saw {sorted(seen)}")
    uid = _get_claim(api, "fabric")["metadata"]["uid"]
    ids = kubelet_cdi_ids(cluster.layout.kubelet_root, uid, DRIVER)
    edits = CDIRegistry(plugin.cdi_dir, DRIVER).resolve_many(ids)
    env = " ".join(f"{k}={v}" for k, v in sorted(edits.env.items()) if k != "DRADRIVER_CLAIM")
    say(f"fabric-user/main env from the node plugin's CDI spec: {env}")


def _explain(
    cluster: LocalCluster, api: AdminAPI, say: Callable[[str], None], timeout: float
) -> None:
    from dradriver.cli.explain import run_explain

    api.create(
        path_for(RESOURCE_V1, "resourceclaims", NAMESPACE),
        {
            "metadata": {
                "name": "too-big",
                "annotations": {"dradriver.dev/allocation": "Immediate"},
            },
            "spec": _claim_spec(
                DRIVER,
                '"memory" in device.capacity["dradriver.dev"] && '
                'device.capacity["dradriver.dev"].memory.compareTo(quantity("64Gi")) >= 0',
            ),
        },
    )
    say("created claim too-big (Immediate, needs a device with >= 64Gi memory)")

    def explained() -> str | None:
        claim = _get_claim(api, "too-big")
        annotations = claim["metadata"].get("annotations") or {}
        return annotations.get("dradriver.dev/allocation-status")

    reason = wait_until("controller explains too-big", explained, timeout)
    say(f"too-big: not allocated; the controller says: {reason}")
    table = asyncio.run(
        run_explain(f"{NAMESPACE}/too-big", str(cluster.layout.admin_kubeconfig), True)
    )
    print(f"\n$ dradriver explain {NAMESPACE}/too-big\n{table}\n", flush=True)
