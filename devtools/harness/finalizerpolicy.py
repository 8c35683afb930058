"""The chart's allocation-finalizer MutatingAdmissionPolicy, installed on a test cluster.

The chart installs it on clusters that serve ``admissionregistration.k8s.io/v1``
MutatingAdmissionPolicy (Kubernetes 1.36+). Tests and benches that run the controller as
a process install it from the same template, rendered by ``helm template`` as for such a
cluster, and take it away again: it is cluster-wide, and a claim it gives the finalizer
in a namespace no controller serves could not be deleted.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import yaml

from devtools.cluster.api import AdminAPI
from devtools.cluster.apply import apply
from devtools.cluster.helmbin import ensure_helm
from devtools.cluster.wait import wait_until
from devtools.manifests import helm_template
from dradriver import DEFAULT_DRIVER_NAME
from dradriver.api.wellknown import ALLOCATION_ANNOTATION, FINALIZER, IMMEDIATE
from dradriver.k8s.paths import RESOURCE_V1, path_for

TEMPLATE = "templates/controller/allocation-finalizer-policy.yaml"
API = "admissionregistration.k8s.io/v1"
KIND_API = f"{API}/MutatingAdmissionPolicy"


def rendered(classes: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The policy and its binding, as the chart renders them for a 1.36+ cluster; it marks
    claims of the chart's classes and of ``classes`` (``controller.allocationDeviceClasses``)."""
    text = helm_template(
        ensure_helm(),
        "--api-versions",
        KIND_API,
        "--show-only",
        TEMPLATE,
        "--set-json",
        f"controller.allocationDeviceClasses={json.dumps(list(classes))}",
    )
    return [doc for doc in yaml.safe_load_all(text) if doc]


def served(api: AdminAPI) -> bool:
    """Whether the cluster serves MutatingAdmissionPolicy at v1 (the group version itself
    is served by every supported release, so an error here is an error, not a "no")."""
    resources = api.get(f"/apis/{API}").get("resources") or []
    return any(r.get("kind") == "MutatingAdmissionPolicy" for r in resources)


def _collection(doc: dict[str, Any]) -> str:
    plural = {
        "MutatingAdmissionPolicy": "mutatingadmissionpolicies",
        "MutatingAdmissionPolicyBinding": "mutatingadmissionpolicybindings",
    }[doc["kind"]]
    return path_for(API, plural)


def probe_claim(name: str) -> dict[str, Any]:
    """An immediate claim of the chart's class (the policy marks no other; dry run only, so
    the class need not exist)."""
    request = {"name": "r", "exactly": {"deviceClassName": DEFAULT_DRIVER_NAME}}
    return {
        "metadata": {"name": name, "annotations": {ALLOCATION_ANNOTATION: IMMEDIATE}},
        "spec": {"devices": {"requests": [request]}},
    }


@contextlib.contextmanager
def installed(
    api: AdminAPI, namespace: str, timeout: float = 60, classes: Sequence[str] = ()
) -> Iterator[list[dict[str, Any]]]:
    """Install the policy (marking claims of ``classes`` too, see :func:`rendered`); yield
    once the apiserver applies it (a dry-run create of an immediate claim in ``namespace``
    comes back with the finalizer); delete it after."""
    docs = rendered(classes)
    try:
        for doc in docs:
            apply(api, doc)

        def effective() -> bool:
            created = api.request(
                "POST",
                path_for(RESOURCE_V1, "resourceclaims", namespace),
                probe_claim(f"policy-probe-{uuid.uuid4().hex[:8]}"),
                params={"dryRun": "All"},
            )
            return FINALIZER in (created.get("metadata") or {}).get("finalizers", [])

        wait_until("the allocation-finalizer policy in effect", effective, timeout)
        yield docs
    finally:
        for doc in reversed(docs):
            api.delete(f"{_collection(doc)}/{doc['metadata']['name']}")
