"""Registering the webhook by URL on loopback (local cluster, tests, demo).

In a real cluster ``manifests/controller/webhook.yaml`` registers it through a
Service; on the local cluster the apiserver is a host process, so the webhook
runs on 127.0.0.1 with a serving certificate from the cluster's own CA and is
registered with ``clientConfig.url``.

NetworkDevicePools are cluster-scoped, and a ``namespaceSelector`` never skips a
cluster-scoped object; so a configuration scoped by namespace labels (tests sharing a
cluster) gets a second webhook for them, scoped by the same labels on the object.

The rules and ``matchConditions`` (only what concerns the driver reaches the webhook) come
from :mod:`dradriver.webhook.registration`, as in ``manifests/controller/webhook.yaml``.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from pathlib import Path

from devtools.cluster.pki import CertificateAuthority, CertPair
from dradriver import DEFAULT_DRIVER_NAME
from dradriver.k8s.objects import Obj
from dradriver.webhook import registration

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
    return registration.rules(driver, scope)


def webhook_configuration(
    name: str,
    url: str,
    ca_bundle: bytes,
    *,
    namespace_labels: dict[str, str] | None = None,
    driver: str = DEFAULT_DRIVER_NAME,
    device_classes: Sequence[str] | None = None,
    timeout_seconds: int = 10,
    failure_policy: str = "Fail",
) -> Obj:
    """A ValidatingWebhookConfiguration calling ``url``.

    ``namespace_labels`` scopes it: namespaced objects by their namespace's labels,
    cluster-scoped ones (NetworkDevicePools) by their own labels, in a second webhook
    named :data:`CLUSTER_WEBHOOK_NAME`. ``device_classes`` (default: those the driver's
    manifests install) are named in the ``matchConditions``.
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
            "matchConditions": registration.match_conditions(driver, device_classes),
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
