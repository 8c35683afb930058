"""Registering the webhook by URL on loopback (local cluster, tests, demo).

In a real cluster ``manifests/controller/webhook.yaml`` registers it through a
Service; on the local cluster the apiserver is a host process, so the webhook
runs on 127.0.0.1 with a serving certificate from the cluster's own CA and is
registered with ``clientConfig.url``.

NetworkDevicePools are cluster-scoped, and a ``namespaceSelector`` never skips a
cluster-scoped object; so a configuration scoped by namespace labels (tests sharing a
cluster) gets a second webhook for them, scoped by the same labels on the object.
"""

from __future__ import annotations

import base64
from pathlib import Path

from devtools.cluster.pki import CertificateAuthority, CertPair
from dradriver import DEFAULT_DRIVER_NAME
from dradriver.api import networkpool as net
from dradriver.api import parameters as params
from dradriver.k8s.objects import Obj

WEBHOOK_NAME = "validate.dradriver.dev"
CLUSTER_WEBHOOK_NAME = "cluster.validate.dradriver.dev"
"""The webhook for cluster-scoped kinds when the configuration is scoped by labels."""


def issue_serving_cert(pki_dir: Path, out_dir: Path, host: str = "127.0.0.1") -> CertPair:
    """A serving certificate for ``host`` signed by the local cluster's CA (``pki_dir/ca.*``)."""
    ca = CertificateAuthority(CertPair(pki_dir / "ca.crt", pki_dir / "ca.key"), "unused")
    return ca.issue(
        CertPair(out_dir / "webhook.crt", out_dir / "webhook.key"),
        "dradriver-webhook",
        server=True,
        ips=(host,),
    )


def rules(driver: str = DEFAULT_DRIVER_NAME, scope: str | None = None) -> list[Obj]:
    """The rules of the webhook; ``scope`` ("Namespaced" or "Cluster") keeps only those."""
    operations = ["CREATE", "UPDATE"]
    every = [
        {
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["v1"],  # matchPolicy Equivalent converts v1beta* requests to v1
            "operations": operations,
            "resources": ["resourceclaims", "resourceclaimtemplates"],
            "scope": "Namespaced",
        },
        {
            "apiGroups": [driver],
            "apiVersions": [params.VERSION],
            "operations": operations,
            "resources": [params.PLURAL],
            "scope": "Namespaced",
        },
        {
            "apiGroups": [driver],
            "apiVersions": [net.VERSION],
            "operations": operations,
            "resources": [net.PLURAL],
            "scope": "Cluster",
        },
    ]
    return [r for r in every if scope is None or r["scope"] == scope]


def webhook_configuration(
    name: str,
    url: str,
    ca_bundle: bytes,
    *,
    namespace_labels: dict[str, str] | None = None,
    driver: str = DEFAULT_DRIVER_NAME,
    timeout_seconds: int = 10,
    failure_policy: str = "Fail",
) -> Obj:
    """A ValidatingWebhookConfiguration calling ``url``.

    ``namespace_labels`` scopes it: namespaced objects by their namespace's labels,
    cluster-scoped ones (NetworkDevicePools) by their own labels, in a second webhook
    named :data:`CLUSTER_WEBHOOK_NAME`.
    """

    def webhook(name: str, scope: str | None) -> Obj:
        return {
            "name": name,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": failure_policy,
            "matchPolicy": "Equivalent",
            "timeoutSeconds": timeout_seconds,
            "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_bundle).decode()},
            "rules": rules(driver, scope),
        }

    if namespace_labels:
        namespaced = webhook(WEBHOOK_NAME, "Namespaced")
        namespaced["namespaceSelector"] = {"matchLabels": dict(namespace_labels)}
        cluster = webhook(CLUSTER_WEBHOOK_NAME, "Cluster")
        cluster["objectSelector"] = {"matchLabels": dict(namespace_labels)}
        webhooks = [namespaced, cluster]
    else:
        webhooks = [webhook(WEBHOOK_NAME, None)]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": webhooks,
    }
