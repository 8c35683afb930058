"""Registering the webhook by URL on loopback (local cluster, tests, demo).

In a real cluster ``manifests/controller/webhook.yaml`` registers it through a
Service; on the local cluster the apiserver is a host process, so the webhook
runs on 127.0.0.1 with a serving certificate from the cluster's own CA and is
registered with ``clientConfig.url``.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from dradriver import DEFAULT_DRIVER_NAME
from dradriver import parameters as params
from dradriver.cluster.pki import CertificateAuthority, CertPair

WEBHOOK_NAME = "validate.dradriver.dev"
Obj = dict[str, Any]


def issue_serving_cert(pki_dir: Path, out_dir: Path, host: str = "127.0.0.1") -> CertPair:
    """A serving certificate for ``host`` signed by the local cluster's CA (``pki_dir/ca.*``)."""
    ca = CertificateAuthority(CertPair(pki_dir / "ca.crt", pki_dir / "ca.key"), "unused")
    return ca.issue(
        CertPair(out_dir / "webhook.crt", out_dir / "webhook.key"),
        "dradriver-webhook",
        server=True,
        ips=(host,),
    )


def rules(driver: str = DEFAULT_DRIVER_NAME) -> list[Obj]:
    operations = ["CREATE", "UPDATE"]
    return [
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
    ]


def webhook_configuration(
    name: str,
    url: str,
    ca_bundle: bytes,
    *,
    namespace_labels: dict[str, str] | None = None,
    driver: str = DEFAULT_DRIVER_NAME,
    timeout_seconds: int = 10,
) -> Obj:
    """A ValidatingWebhookConfiguration calling ``url``; ``namespace_labels`` scopes it."""
    webhook: Obj = {
        "name": WEBHOOK_NAME,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "matchPolicy": "Equivalent",
        "timeoutSeconds": timeout_seconds,
        "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_bundle).decode()},
        "rules": rules(driver),
    }
    if namespace_labels:
        webhook["namespaceSelector"] = {"matchLabels": dict(namespace_labels)}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [webhook],
    }
