"""The admission webhook on the real apiserver, registered by URL on loopback.

The cluster is shared with other tests running at the same time: the webhook
configuration has a unique name and only matches a namespace (or, for the
cluster-scoped NetworkDevicePools, an object) carrying a label no other has, and
it is deleted at the end whatever happens. The webhook runs standalone
(``dradriver-webhook``) and inside ``dradriver-controller`` (``--webhook-address``).
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from devtools.cluster.api import AdminAPI
from devtools.cluster.local import LocalCluster
from devtools.cluster.process import ManagedProcess
from devtools.cluster.wait import wait_until
from devtools.harness.controller import (
    NAMESPACE,
    ControllerProcess,
    controller_kubeconfig,
    install_crds,
    register_webhook,
    unregister_webhook,
    webhook_tls,
)
from devtools.harness.nodeplugin import free_port
from devtools.harness.webhook import (
    CLUSTER_WEBHOOK_NAME,
    WEBHOOK_NAME,
    issue_serving_cert,
    webhook_configuration,
)
from dradriver.api import networkpool as net
from dradriver.api import parameters as params
from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for

DRIVER = "dradriver.dev"
API_VERSION = f"{DRIVER}/{params.VERSION}"
LABEL = "dradriver.dev/webhook-test"
CONFIGS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
BAD_SELECTOR = 'device.attributes["dradriver.dev"].model =='
DENIED = f'admission webhook "{WEBHOOK_NAME}" denied the request: '
DENIED_POOL = f'admission webhook "{CLUSTER_WEBHOOK_NAME}" denied the request: '
POOLS = path_for(f"{DRIVER}/{net.VERSION}", net.PLURAL)


@dataclass(frozen=True)
class Webhook:
    namespace: str
    kubeconfig: Path
    workdir: Path
    labels: dict[str, str]  # of the namespace; cluster-scoped objects carry them themselves


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


def network_pool(name: str, labels: dict[str, str], spec: Obj) -> Obj:
    return {
        "apiVersion": f"{DRIVER}/{net.VERSION}",
        "kind": net.KIND,
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": spec,
    }


def denied(api: AdminAPI, path: str, body: Obj, prefix: str = DENIED) -> str:
    with pytest.raises(KubeAPIError) as info:
        api.create(path, body)
    message = str(info.value.body.get("message", ""))
    assert info.value.status == 422, info.value.body
    assert message.startswith(prefix), message
    return message[len(prefix) :]


def delete_pool(api: AdminAPI, name: str) -> None:
    """Delete a pool this test made; a controller of a concurrent test may have put its
    detach finalizer on it (nothing is attached: drop it)."""
    path = f"{POOLS}/{name}"
    api.delete(path)
    if api.get_or_none(path) is not None:
        try:
            api.merge_patch(path, {"metadata": {"finalizers": None}})
        except KubeAPIError as e:
            if e.status != 404:
                raise
    wait_until(f"pool {name} deleted", lambda: api.get_or_none(path) is None, 30)


def start_webhook(local_cluster: LocalCluster, workdir: Path) -> tuple[ManagedProcess, str]:
    """A standalone ``dradriver-webhook`` on a free loopback port, serving; its base URL."""
    pki = local_cluster.layout.pki
    pair = issue_serving_cert(pki, workdir)
    port = free_port()
    proc = ManagedProcess.start(
        "dradriver-webhook",
        [
            sys.executable,
            "-m",
            "dradriver.webhook",
            f"--address=127.0.0.1:{port}",
            f"--cert={pair.cert}",
            f"--key={pair.key}",
            "--log-level=debug",
        ],
        log_path=workdir / "webhook.log",
        cwd=workdir / "webhook.cwd",
    )
    tls = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    base = f"https://127.0.0.1:{port}"
    try:
        with httpx.Client(verify=tls, timeout=5) as http:
            proc.wait_ready(
                "webhook ready",
                lambda: http.get(f"{base}/readyz").status_code == 200,
                30,
                ignore=(httpx.TransportError,),
            )
    except BaseException:
        proc.stop(timeout=10)
        raise
    return proc, base


def register(
    api: AdminAPI, local_cluster: LocalCluster, name: str, base: str, namespace: str, unique: str
) -> None:
    """Register the webhook at ``base`` for objects labelled ``LABEL: unique`` (and their
    namespace ``namespace``), and return once the apiserver calls it."""
    api.create(
        CONFIGS,
        webhook_configuration(
            name,
            f"{base}/validate",
            (local_cluster.layout.pki / "ca.crt").read_bytes(),
            namespace_labels={LABEL: unique},
        ),
    )

    # The apiserver picks new configurations up through a watch: probe with a
    # dry run (sideEffects None) until the webhook answers.
    def active() -> bool:
        probe = parameters(namespace, "probe", {"selectors": [BAD_SELECTOR]})
        try:
            api.create(parameters_path(namespace) + "?dryRun=All", probe)
        except KubeAPIError as e:
            if DENIED in str(e.body.get("message", "")):
                return True
            raise
        return False

    wait_until("webhook configuration active", active, 30)


@pytest.fixture(scope="module")
def webhook(local_cluster: LocalCluster) -> Iterator[Webhook]:
    unique = uuid.uuid4().hex[:8]
    namespace = f"t-webhook-{unique}"
    config_name = f"dradriver-webhook-test-{unique}"
    workdir = Path(tempfile.mkdtemp(prefix="dra-webhook-"))
    with local_cluster.api() as api:
        install_crds(api)
        proc, base = start_webhook(local_cluster, workdir)
        try:
            api.create(
                "/api/v1/namespaces",
                {"metadata": {"name": namespace, "labels": {LABEL: unique}}},
            )
            register(api, local_cluster, config_name, base, namespace, unique)
            yield Webhook(
                namespace, local_cluster.layout.admin_kubeconfig, workdir, {LABEL: unique}
            )
        finally:
            api.delete(f"{CONFIGS}/{config_name}")
            api.delete(path_for("v1", "namespaces", name=namespace))
            proc.stop(timeout=10)
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
    with pytest.raises(KubeAPIError) as info:
        api.merge_patch(
            path_for(API_VERSION, params.PLURAL, webhook.namespace, "good"),
            {"spec": {"selectors": [BAD_SELECTOR]}},
        )
    assert info.value.status == 422, info.value.body
    assert str(info.value.body.get("message")).startswith(DENIED + "spec.selectors[0]: ")


@pytest.mark.compat("webhook")
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


@pytest.mark.compat("webhook")
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
    with pytest.raises(KubeAPIError) as info:
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


def test_network_pools_are_validated(api: AdminAPI, webhook: Webhook) -> None:
    name = f"t-webhook-{uuid.uuid4().hex[:8]}"
    labels = webhook.labels
    devices = [{"name": "nic-0", "attributes": {"model": {"string": "x1"}}}]
    # An unknown backend: the CRD schema denies it before the webhook is called; either
    # way the message names the field and the allowed values.
    bad = network_pool(name, labels, {"attach": {"backend": "tftp"}, "devices": devices})
    with pytest.raises(KubeAPIError) as info:
        api.create(POOLS, bad)
    assert info.value.status == 422, info.value.body
    message = str(info.value.body.get("message"))
    assert "spec.attach.backend" in message
    assert '"simulated"' in message and '"exec"' in message, message
    # What no schema checks is the webhook's.
    bad["spec"]["attach"] = {"backend": "exec"}
    message = denied(api, POOLS, bad, DENIED_POOL)
    assert message == "spec.attach: backend exec needs the exec section (command)"
    twice = network_pool(name, labels, {"attach": {"backend": "simulated"}, "devices": devices * 2})
    assert denied(api, POOLS, twice, DENIED_POOL) == "spec: device name 'nic-0' is given twice"
    dotted = network_pool(
        f"{name}.a", labels, {"attach": {"backend": "simulated"}, "devices": devices}
    )
    assert denied(api, POOLS, dotted, DENIED_POOL).startswith(
        f"metadata.name: NetworkDevicePool name '{name}.a' is not a DNS label"
    )

    good = network_pool(name, labels, {"attach": {"backend": "simulated"}, "devices": devices})
    try:
        created = api.create(POOLS, good)
        assert created["spec"]["attach"]["backend"] == "simulated"
        with pytest.raises(KubeAPIError) as info:
            api.merge_patch(f"{POOLS}/{name}", {"spec": {"attach": {"backend": "exec"}}})
        assert info.value.status == 422, info.value.body
        assert str(info.value.body.get("message")) == (
            DENIED_POOL + "spec.attach: backend exec needs the exec section (command)"
        )
    finally:
        delete_pool(api, name)


# --- while the webhook is down -------------------------------------------------------

CANNOT_CALL = f'failed calling webhook "{WEBHOOK_NAME}"'


def test_while_the_webhook_is_down_only_this_drivers_writes_are_refused(
    api: AdminAPI, local_cluster: LocalCluster
) -> None:
    """failurePolicy Fail with matchConditions: with the webhook server stopped, other
    drivers' claims are admitted, ours are refused naming the webhook, and the finalizer
    of one of our claims (and of our parameters) can still be removed."""
    unique = uuid.uuid4().hex[:8]
    namespace = f"t-webhook-down-{unique}"
    config_name = f"dradriver-webhook-down-{unique}"
    workdir = Path(tempfile.mkdtemp(prefix="dra-webhook-down-"))
    claims = path_for(RESOURCE_V1, "resourceclaims", namespace)
    templates = path_for(RESOURCE_V1, "resourceclaimtemplates", namespace)
    hold = {"finalizers": ["example.com/hold"]}
    config = {"apiVersion": API_VERSION, "kind": "DeviceConfig", "profile": "fast"}
    # Ours by its request for our DeviceClass. (Not with opaque config too: the apiserver
    # compares opaque parameters as bytes, and a merge patch re-encodes those this
    # client sent with spaces, so it would be refused as "spec: field is immutable",
    # webhook or not.)
    ours = claim(namespace, "ours")
    ours["metadata"].update(hold)
    dcp = parameters(namespace, "params", {"profile": "fast"})
    dcp["metadata"].update(hold)
    install_crds(api)
    proc, base = start_webhook(local_cluster, workdir)
    try:
        api.create(
            "/api/v1/namespaces", {"metadata": {"name": namespace, "labels": {LABEL: unique}}}
        )
        register(api, local_cluster, config_name, base, namespace, unique)
        api.create(claims, ours)
        api.create(parameters_path(namespace), dcp)

        assert proc.stop(timeout=10) is not None  # the webhook server is gone (port closed)

        # Other drivers' claims and templates are admitted: the webhook is not called.
        other = {
            "apiVersion": RESOURCE_V1,
            "kind": "ResourceClaim",
            "metadata": {"name": "other", "namespace": namespace},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}},
                        {
                            "name": "any",
                            "firstAvailable": [
                                {"name": "a", "deviceClassName": "fpga.example.com"}
                            ],
                        },
                    ],
                    "config": [
                        {"opaque": {"driver": "gpu.example.com", "parameters": {"mode": "x"}}}
                    ],
                }
            },
        }
        assert api.create(claims, other)["metadata"]["name"] == "other"
        other_template = {
            "apiVersion": RESOURCE_V1,
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "other", "namespace": namespace},
            "spec": {"spec": other["spec"]},
        }
        assert api.create(templates, other_template)["metadata"]["name"] == "other"

        # Ours are refused, and the message names the webhook that could not be called.
        for path, body in (
            (claims, claim(namespace, "ours-2", config)),
            (claims, claim(namespace, "ours-3")),
            (parameters_path(namespace), parameters(namespace, "params-2", {})),
        ):
            with pytest.raises(KubeAPIError) as info:
                api.create(path, body)
            assert info.value.status == 500, info.value.body
            assert CANNOT_CALL in str(info.value.body.get("message")), info.value.body
        with pytest.raises(KubeAPIError) as info:
            api.merge_patch(f"{parameters_path(namespace)}/params", {"spec": {"profile": "slow"}})
        assert CANNOT_CALL in str(info.value.body.get("message")), info.value.body

        # Metadata changes of our objects need no webhook: annotate, drop the finalizer,
        # and the deletion (never sent to the webhook) completes.
        for path in (f"{claims}/ours", f"{parameters_path(namespace)}/params"):
            api.merge_patch(path, {"metadata": {"annotations": {"example.com/seen": "yes"}}})
            api.delete(path)
            assert api.get(path)["metadata"].get("deletionTimestamp")  # held by the finalizer
            api.merge_patch(path, {"metadata": {"finalizers": None}})

            def gone(path: str = path) -> bool:
                return api.get_or_none(path) is None

            wait_until(f"{path} deleted", gone, 30)
    finally:
        api.delete(f"{CONFIGS}/{config_name}")
        for path in (f"{claims}/ours", f"{parameters_path(namespace)}/params"):
            if api.get_or_none(path) is not None:
                api.merge_patch(path, {"metadata": {"finalizers": None}})
        api.delete(path_for("v1", "namespaces", name=namespace))
        proc.stop(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


# --- served by dradriver-controller ---------------------------------------------------


def _foreign_lease(api: AdminAPI, name: str) -> None:
    """A Lease another replica holds for an hour: the controller stays a standby."""
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    api.create(
        path_for("coordination.k8s.io/v1", "leases", NAMESPACE),
        {
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "holderIdentity": "someone-else",
                "leaseDurationSeconds": 3600,
                "acquireTime": now,
                "renewTime": now,
            },
        },
    )


def test_controller_serves_the_webhook(api: AdminAPI, local_cluster: LocalCluster) -> None:
    """dradriver-controller --webhook-address: a standby validates too, and /readyz on the
    webhook port is the controller's readiness."""
    unique = uuid.uuid4().hex[:8]
    namespace = f"t-ctl-webhook-{unique}"
    config_name = f"dradriver-webhook-test-ctl-{unique}"
    lease_name = f"controller-webhook-{unique}"
    workdir = Path(tempfile.mkdtemp(prefix="dra-ctl-webhook-"))
    controller = ControllerProcess(
        f"webhook-{unique}",
        controller_kubeconfig(api, local_cluster, workdir),
        workdir,
        lease_name,
        extra_args=[f"--allocation-namespace={namespace}"],
        webhook=webhook_tls(local_cluster, workdir),
    )
    try:
        _foreign_lease(api, lease_name)
        api.create(
            "/api/v1/namespaces", {"metadata": {"name": namespace, "labels": {LABEL: unique}}}
        )
        controller.start()
        wait_until("controller ready", controller.ready, 60)
        register_webhook(api, controller, config_name, namespace_labels={LABEL: unique})

        body = parameters(namespace, "bad", {"selectors": [BAD_SELECTOR]})
        message = denied(api, parameters_path(namespace), body)
        assert message.startswith("spec.selectors[0]: ")
        pool = network_pool(
            f"t-ctl-webhook-{unique}", {LABEL: unique}, {"attach": {"backend": "exec"}}
        )
        pool["spec"]["devices"] = [{"name": "nic-0"}]
        message = denied(api, POOLS + "?dryRun=All", pool, DENIED_POOL)
        assert message == "spec.attach: backend exec needs the exec section (command)"
        created = api.create(parameters_path(namespace), parameters(namespace, "good", {}))
        assert created["metadata"]["name"] == "good"

        ready = controller.webhook_get("/readyz")
        assert ready is not None and ready.status_code == 200
        assert ready.text == "ok: standby with synced caches (leader: someone-else)\n"
        plain = controller.get("/readyz")
        assert plain is not None and plain.text == ready.text
        metrics = controller.webhook_get("/metrics")
        assert metrics is not None
        assert (
            'dradriver_webhook_requests_total{kind="DeviceClaimParameters",operation="CREATE",'
            'outcome="denied"}' in metrics.text
        )
        assert f'dradriver_leader{{lease="{NAMESPACE}/{lease_name}"}} 0.0' in metrics.text
        health = controller.webhook_get("/healthz")
        assert health is not None and health.text == "ok\n"
        # TLS only: plain HTTP on the webhook port gets no answer.
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{controller.webhook_port}/healthz", timeout=2)
        assert controller.terminate() == 0
    finally:
        unregister_webhook(api, config_name)
        controller.stop()
        api.delete(path_for("v1", "namespaces", name=namespace))
        api.delete(path_for("coordination.k8s.io/v1", "leases", NAMESPACE, lease_name))
        shutil.rmtree(workdir, ignore_errors=True)
