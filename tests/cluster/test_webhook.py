"""The admission webhook on the real apiserver, registered by URL on loopback.

The cluster is shared with other tests running at the same time: the webhook
configuration has a unique name and only matches a namespace carrying a label
no other namespace has, and it is deleted at the end whatever happens.
"""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from dradriver import parameters as params
from dradriver.cluster.api import AdminAPI, APIError, path_for, wait_until
from dradriver.cluster.local import LocalCluster
from dradriver.cluster.nodeplugin import apply_file, free_port
from dradriver.cluster.process import log_tail
from dradriver.kube.paths import RESOURCE_V1
from dradriver.webhook.register import WEBHOOK_NAME, issue_serving_cert, webhook_configuration

DRIVER = "dradriver.dev"
API_VERSION = f"{DRIVER}/{params.VERSION}"
LABEL = "dradriver.dev/webhook-test"
CONFIGS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
CRD = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{params.PLURAL}.{DRIVER}"
BAD_SELECTOR = 'device.attributes["dradriver.dev"].model =='
DENIED = f'admission webhook "{WEBHOOK_NAME}" denied the request: '
Obj = dict[str, Any]


@dataclass(frozen=True)
class Webhook:
    namespace: str
    kubeconfig: Path
    workdir: Path


def _install_crd(api: AdminAPI) -> None:
    apply_file(api, params.CRD_FILE)

    def established() -> bool:
        conditions = (api.get(CRD).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_until("CRD established", established, 30)


def parameters(namespace: str, name: str, spec: Obj) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": params.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def claim(namespace: str, name: str, opaque_parameters: Obj | None = None) -> Obj:
    devices: Obj = {"requests": [{"name": "dev", "exactly": {"deviceClassName": DRIVER}}]}
    if opaque_parameters is not None:
        devices["config"] = [{"opaque": {"driver": DRIVER, "parameters": opaque_parameters}}]
    return {
        "apiVersion": RESOURCE_V1,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": devices},
    }


def parameters_path(namespace: str) -> str:
    return path_for(API_VERSION, params.PLURAL, namespace)


def denied(api: AdminAPI, path: str, body: Obj) -> str:
    with pytest.raises(APIError) as info:
        api.create(path, body)
    message = str(info.value.body.get("message", ""))
    assert info.value.status == 422, info.value.body
    assert message.startswith(DENIED), message
    return message[len(DENIED) :]


@pytest.fixture(scope="module")
def webhook(local_cluster: LocalCluster) -> Iterator[Webhook]:
    unique = uuid.uuid4().hex[:8]
    namespace = f"t-webhook-{unique}"
    config_name = f"dradriver-webhook-test-{unique}"
    workdir = Path(tempfile.mkdtemp(prefix="dra-webhook-"))
    pki = local_cluster.layout.pki
    pair = issue_serving_cert(pki, workdir)
    port = free_port()
    log_path = workdir / "webhook.log"
    with local_cluster.api() as api, log_path.open("wb") as log:
        _install_crd(api)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dradriver.webhook",
                f"--address=127.0.0.1:{port}",
                f"--cert={pair.cert}",
                f"--key={pair.key}",
                "--log-level=debug",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            tls = ssl.create_default_context(cafile=str(pki / "ca.crt"))
            base = f"https://127.0.0.1:{port}"
            with httpx.Client(verify=tls, timeout=5) as http:

                def healthy() -> bool:
                    if proc.poll() is not None:
                        raise RuntimeError(f"webhook exited:\n{log_tail(log_path)}")
                    try:
                        return http.get(f"{base}/readyz").status_code == 200
                    except httpx.TransportError:
                        return False

                wait_until("webhook ready", healthy, 30)
            api.create(
                "/api/v1/namespaces",
                {"metadata": {"name": namespace, "labels": {LABEL: unique}}},
            )
            api.create(
                CONFIGS,
                webhook_configuration(
                    config_name,
                    f"{base}/validate",
                    (pki / "ca.crt").read_bytes(),
                    namespace_labels={LABEL: unique},
                ),
            )

            # The apiserver picks new configurations up through a watch: probe with a
            # dry run (sideEffects None) until the webhook answers.
            def active() -> bool:
                probe = parameters(namespace, "probe", {"selectors": [BAD_SELECTOR]})
                try:
                    api.create(parameters_path(namespace) + "?dryRun=All", probe)
                except APIError as e:
                    if DENIED in str(e.body.get("message", "")):
                        return True
                    raise
                return False

            wait_until("webhook configuration active", active, 30)
            yield Webhook(namespace, local_cluster.layout.admin_kubeconfig, workdir)
        finally:
            api.delete(f"{CONFIGS}/{config_name}")
            api.delete(path_for("v1", "namespaces", name=namespace))
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            shutil.rmtree(workdir, ignore_errors=True)


def test_selector_that_does_not_compile_is_denied(api: AdminAPI, webhook: Webhook) -> None:
    body = parameters(webhook.namespace, "bad-selector", {"selectors": [BAD_SELECTOR]})
    message = denied(api, parameters_path(webhook.namespace), body)
    assert message.startswith("spec.selectors[0]: ")
    assert "Syntax error" in message
    body["spec"] = {"selectors": ["device.nosuch == 1"]}
    message = denied(api, parameters_path(webhook.namespace), body)
    assert "spec.selectors[0]: undefined field 'nosuch' of device" in message


def test_valid_parameters_are_admitted(api: AdminAPI, webhook: Webhook) -> None:
    spec = {
        "profile": "fast",
        "selectors": ['device.attributes["dradriver.dev"].model == "mock"'],
        "allocationMode": "Immediate",
    }
    created = api.create(
        parameters_path(webhook.namespace), parameters(webhook.namespace, "good", spec)
    )
    assert created["spec"]["profile"] == "fast"
    # An update that breaks the selector is denied too. A merge patch, not a PUT: a
    # controller of a concurrent test may write the status meanwhile (no 409 then).
    with pytest.raises(APIError) as info:
        api.request(
            "PATCH",
            path_for(API_VERSION, params.PLURAL, webhook.namespace, "good"),
            content=json.dumps({"spec": {"selectors": [BAD_SELECTOR]}}),
            headers={"Content-Type": "application/merge-patch+json"},
        )
    assert info.value.status == 422, info.value.body
    assert str(info.value.body.get("message")).startswith(DENIED + "spec.selectors[0]: ")


def test_claim_with_bad_opaque_config_is_denied(api: AdminAPI, webhook: Webhook) -> None:
    path = path_for(RESOURCE_V1, "resourceclaims", webhook.namespace)
    bad_kind = claim(webhook.namespace, "bad-kind", {"apiVersion": API_VERSION, "kind": "Gpu"})
    message = denied(api, path, bad_kind)
    assert message == (
        "spec.devices.config[0].opaque.parameters.kind: unknown kind 'Gpu'; dradriver.dev "
        "accepts DeviceConfig, DeviceClaimParameters, DeviceClaimParametersReference"
    )
    bad_field = claim(
        webhook.namespace,
        "bad-field",
        {"apiVersion": API_VERSION, "kind": "DeviceConfig", "colour": "red"},
    )
    message = denied(api, path, bad_field)
    assert message == (
        "spec.devices.config[0].opaque.parameters: field colour: unknown field "
        "(allowed: apiVersion, kind, env, profile, setupArgs)"
    )
    bad_mode = claim(
        webhook.namespace,
        "bad-mode",
        {"apiVersion": API_VERSION, "kind": params.KIND, "spec": {"allocationMode": "Soon"}},
    )
    message = denied(api, path, bad_mode)
    assert message == (
        "spec.devices.config[0].opaque.parameters.spec.allocationMode: Input should be "
        "'Immediate' or 'WaitForFirstConsumer'"
    )


def test_valid_claims_are_admitted(api: AdminAPI, webhook: Webhook) -> None:
    path = path_for(RESOURCE_V1, "resourceclaims", webhook.namespace)
    for name, opaque in [
        ("plain", None),
        ("device-config", {"apiVersion": API_VERSION, "kind": "DeviceConfig", "env": {"A": "1"}}),
        ("inline", {"apiVersion": API_VERSION, "kind": params.KIND, "spec": {"profile": "x"}}),
        # A missing parameters object is the controller's to report, not a denial.
        (
            "reference",
            {"apiVersion": API_VERSION, "kind": params.REFERENCE_KIND, "name": "not-there"},
        ),
    ]:
        created = api.create(path, claim(webhook.namespace, name, opaque))
        assert created["metadata"]["name"] == name


def test_template_and_older_api_versions(api: AdminAPI, webhook: Webhook) -> None:
    bad = claim(webhook.namespace, "t", {"apiVersion": "dradriver.dev/v9", "kind": "DeviceConfig"})
    template = {
        "apiVersion": RESOURCE_V1,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": webhook.namespace},
        "spec": {"spec": bad["spec"]},
    }
    message = denied(
        api, path_for(RESOURCE_V1, "resourceclaimtemplates", webhook.namespace), template
    )
    assert message == (
        "spec.spec.devices.config[0].opaque.parameters.apiVersion: 'dradriver.dev/v9' is not "
        "supported; use 'dradriver.dev/v1alpha1'"
    )
    # A v1beta2 claim is converted to v1 before the webhook sees it (matchPolicy Equivalent).
    beta = {**bad, "apiVersion": "resource.k8s.io/v1beta2", "metadata": {"name": "beta"}}
    message = denied(
        api, path_for("resource.k8s.io/v1beta2", "resourceclaims", webhook.namespace), beta
    )
    assert message.startswith("spec.devices.config[0].opaque.parameters.apiVersion:")


def test_request_selector_for_our_class_is_denied(api: AdminAPI, webhook: Webhook) -> None:
    body = claim(webhook.namespace, "bad-request")
    body["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": 'device.attributes["dradriver.dev"].model.startsWith(1)'}}
    ]
    with pytest.raises(APIError) as info:
        api.create(path_for(RESOURCE_V1, "resourceclaims", webhook.namespace), body)
    # The apiserver compiles request selectors itself and may deny before us; either way
    # the answer names the field.
    assert "spec.devices.requests[0].exactly.selectors[0].cel.expression" in str(
        info.value.body.get("message")
    )


def test_kubectl_apply_shows_a_readable_message(webhook: Webhook) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    manifest = webhook.workdir / "bad.yaml"
    bad = parameters(webhook.namespace, "kubectl-bad", {"selectors": [BAD_SELECTOR]})
    manifest.write_text(yaml.safe_dump(bad))
    result = subprocess.run(
        [kubectl, f"--kubeconfig={webhook.kubeconfig}", "apply", "-f", str(manifest)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert DENIED + "spec.selectors[0]: " in result.stderr, result.stderr
