"""The Helm chart without a cluster: lint, render, values schema, the manifests it renders.

Every render is parsed and checked for what the feature promises (rolling update with a
surge, leader election, the webhook's TLS wiring, the driver config dradriver accepts),
so deleting a template or a value's effect fails here, not only in the cluster tier.
"""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from devtools import manifests
from devtools.cluster import chartvalues
from devtools.cluster.config import Layout
from devtools.docs.pages import markdown_pages
from devtools.manifests import CHART, helm_template
from dradriver import cel
from dradriver.api.networkpool import NetworkDevicePoolSpec
from dradriver.api.wellknown import ALLOCATION_ANNOTATION, FINALIZER, IMMEDIATE
from dradriver.devices.config import DriverConfig, parse_config
from dradriver.devices.sources import build_sources, discover_all
from dradriver.webhook import registration

Obj = dict[str, Any]
DRIVER = "dradriver.dev"
CI = CHART / "ci"
FEATURE_VALUES = sorted(p.name for p in CI.glob("*-values.yaml"))
REPO = Path(__file__).resolve().parents[2]


def render(helm: Path, *args: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all(helm_template(helm, *args)) if d]


def values(name: str) -> tuple[str, str]:
    return ("--values", str(CI / name))


def one(docs: Iterable[Obj], kind: str, name: str | None = None) -> Obj:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} rendered"
    return found[0]


def kinds(docs: Iterable[Obj]) -> set[str]:
    return {d["kind"] for d in docs}


def driver_config(docs: list[Obj]) -> DriverConfig:
    config_map = one(docs, "ConfigMap", "dradriver-kubeletplugin-config")
    return parse_config(config_map["data"]["config.yaml"], "the chart's ConfigMap")


def failure(helm: Path, *args: str) -> str:
    """stderr of a ``helm template`` that must fail."""
    cmd = [str(helm), "template", "dradriver", str(CHART), "--namespace", "dradriver", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode != 0, f"helm template {' '.join(args)} passed"
    return proc.stderr


def test_helm_is_the_pinned_v3(helm: Path) -> None:
    out = subprocess.run([str(helm), "version", "--short"], capture_output=True, text=True)
    assert out.stdout.startswith("v3.22.0"), out.stdout


@pytest.mark.parametrize("values_file", [None, *FEATURE_VALUES])
def test_lint(helm: Path, values_file: str | None) -> None:
    args = [] if values_file is None else list(values(values_file))
    proc = subprocess.run(
        [str(helm), "lint", "--strict", str(CHART), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


def test_defaults_render_every_part(helm: Path) -> None:
    docs = render(helm, "--include-crds")
    assert {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "DaemonSet",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "Secret",
        "ValidatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "DeviceClass",
        "CustomResourceDefinition",
    } <= kinds(docs)
    assert "Namespace" not in kinds(docs), "helm install --create-namespace makes it"
    assert "ServiceMonitor" not in kinds(docs)

    daemonset = one(docs, "DaemonSet")
    assert daemonset["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    plugin = daemonset["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in plugin["env"]}
    # Per-pod socket names: the plugin suffixes them with its pod's UID.
    assert env["POD_UID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert "KUBERNETES_SERVICE_HOST" not in env

    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    controller = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--leader-elect" in controller["command"]
    assert "--lease-name=dradriver-controller" in controller["command"]
    assert "--webhook-address=:8443" in controller["command"]
    assert controller["securityContext"]["runAsNonRoot"] is True
    assert controller["resources"]["requests"] == {"cpu": "50m", "memory": "128Mi"}

    config = driver_config(docs)
    assert config.driver_name == DRIVER
    assert not config.device_plugin.enabled


def test_default_tls_is_a_chart_generated_certificate_for_the_service(helm: Path) -> None:
    docs = render(helm)
    secret = one(docs, "Secret", "dradriver-webhook-tls")
    (hook,) = one(docs, "ValidatingWebhookConfiguration")["webhooks"]
    assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    assert hook["clientConfig"]["service"] == {
        "namespace": "dradriver",
        "name": "dradriver-webhook",
        "path": "/validate",
        "port": 443,
    }
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    leaf = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    assert leaf.issuer == ca.subject
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "dradriver-webhook.dradriver.svc" in names.get_values_for_type(x509.DNSName)
    assert "Certificate" not in kinds(docs)
    volumes = one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": "dradriver-webhook-tls"}} in volumes


def test_cert_manager_tls(helm: Path) -> None:
    docs = render(helm, "--set", "webhook.tls.mode=cert-manager")
    assert "Secret" not in kinds(docs), "cert-manager fills the Secret"
    certificate = one(docs, "Certificate")
    assert certificate["spec"]["secretName"] == "dradriver-webhook-tls"
    assert "dradriver-webhook.dradriver.svc" in certificate["spec"]["dnsNames"]
    assert certificate["spec"]["issuerRef"] == {"kind": "Issuer", "name": "dradriver-webhook"}
    assert one(docs, "Issuer")["spec"] == {"selfSigned": {}}
    config = one(docs, "ValidatingWebhookConfiguration")
    assert config["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": "dradriver/dradriver-webhook"
    }
    docs = render(
        helm,
        "--set",
        "webhook.tls.mode=cert-manager",
        "--set",
        "webhook.tls.certManager.issuerRef.kind=ClusterIssuer",
        "--set",
        "webhook.tls.certManager.issuerRef.name=corp-ca",
    )
    assert "Issuer" not in kinds(docs)
    assert one(docs, "Certificate")["spec"]["issuerRef"] == {
        "kind": "ClusterIssuer",
        "name": "corp-ca",
    }


def test_manual_tls(helm: Path) -> None:
    docs = render(helm, *values("manual-tls-values.yaml"))
    assert not {"Secret", "Certificate"} & kinds(docs)
    (hook,) = one(docs, "ValidatingWebhookConfiguration")["webhooks"]
    assert hook["clientConfig"]["caBundle"].startswith("LS0t")
    volumes = one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": "my-webhook-tls"}} in volumes


def test_webhook_matches_what_the_registration_renders(helm: Path) -> None:
    """The chart's rules and matchConditions are dradriver.webhook.registration's."""
    for driver in (DRIVER, "gpu.example.com"):
        docs = render(helm, "--set", f"driverName={driver}")
        (hook,) = one(docs, "ValidatingWebhookConfiguration")["webhooks"]
        assert hook["name"] == f"validate.{driver}"
        assert hook["matchConditions"] == registration.match_conditions(driver)
        assert hook["rules"] == registration.rules(driver)
        classes = {d["metadata"]["name"] for d in docs if d["kind"] == "DeviceClass"}
        assert classes == set(registration.device_classes(driver))


def test_driver_name_reaches_every_part(helm: Path) -> None:
    driver = "gpu.example.com"
    docs = render(helm, "--set", f"driverName={driver}")
    assert driver_config(docs).driver_name == driver
    controller = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert f"--driver-name={driver}" in controller["command"]
    for policy in (d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"):
        drivers = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}["drivers"]
        assert drivers == f'["{driver}"]'
    rules = [r for d in docs if d["kind"] == "ClusterRole" for r in d["rules"]]
    named = [r for r in rules if r.get("resourceNames")]
    assert named and all(r["resourceNames"] == [driver] for r in named)
    # The annotation keys and the extended resource's default name keep the project's
    # domain; the parts that decide who may do what follow the driver.
    for doc in docs:
        if doc["kind"] in (
            "ValidatingAdmissionPolicy",
            "ValidatingWebhookConfiguration",
            "ClusterRole",
        ):
            assert DRIVER not in yaml.safe_dump(doc), doc["metadata"]["name"]
    for device_class in (d for d in docs if d["kind"] == "DeviceClass"):
        assert device_class["metadata"]["name"].startswith(driver)
        for selector in device_class["spec"]["selectors"]:
            assert f'device.driver == "{driver}"' in selector["cel"]["expression"]


def test_shim_values(helm: Path) -> None:
    docs = render(helm, *values("shim-values.yaml"))
    config = driver_config(docs)
    assert config.device_plugin.enabled
    shim_names = {r.resource_name for r in config.device_plugin.resources}
    dra_names = {
        d["spec"]["extendedResourceName"]
        for d in docs
        if d["kind"] == "DeviceClass" and "extendedResourceName" in d["spec"]
    }
    assert shim_names == {"dradriver.dev/mock"}
    assert not shim_names & dra_names, "one name advertised both ways"


def test_network_pool_values(helm: Path) -> None:
    docs = render(helm, *values("network-pools-values.yaml"))
    pool = one(docs, "NetworkDevicePool", "fabric-a")
    assert pool["apiVersion"] == f"{DRIVER}/v1alpha1"
    NetworkDevicePoolSpec.model_validate(pool["spec"])
    assert one(docs, "Deployment")["spec"]["replicas"] == 3
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert {m["metadata"]["name"] for m in monitors} == {
        "dradriver-controller",
        "dradriver-kubeletplugin",
    }
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for monitor in monitors:
        selected = monitor["spec"]["selector"]["matchLabels"]
        (service,) = [
            s for s in services.values() if selected.items() <= s["metadata"]["labels"].items()
        ]
        assert service["spec"]["ports"][0]["targetPort"] == monitor["spec"]["endpoints"][0]["port"]


def test_local_cluster_values(helm: Path, tmp_path: Path) -> None:
    """The values for ``dradriver cluster up``: host network, apiserver at 127.0.0.1, the
    plugin on node-1 only with its probes on a unix socket (no host port for the surge pod
    to collide on), node-1's CDI dir."""
    layout = Layout(state_dir=tmp_path / "cluster", runtime="real")
    values_file = tmp_path / "local.yaml"
    values_file.write_text(yaml.safe_dump(chartvalues.local_cluster_values(layout)))
    docs = render(helm, "--values", str(values_file))
    for kind in ("DaemonSet", "Deployment"):
        pod = one(docs, kind)["spec"]["template"]["spec"]
        assert pod["hostNetwork"] is True
        assert pod["nodeSelector"] == {"kubernetes.io/hostname": "node-1"}
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == (
            "127.0.0.1",
            "6443",
        )
    plugin_pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    plugin = plugin_pod["containers"][0]
    assert "ports" not in plugin, "a host port would keep the surge pod from starting"
    socket = "/run/dradriver-http/http.sock"
    assert f"--http-address=unix:{socket}" in plugin["command"]
    assert f"--cdi-dir={layout.node(1).cdi_dir}" in plugin["command"]
    assert plugin["readinessProbe"]["exec"]["command"] == [
        "python3",
        "-m",
        "dradriver.httpprobe",
        f"unix:{socket}",
        "/readyz",
    ]
    mounts = {m["name"]: m["mountPath"] for m in plugin["volumeMounts"]}
    assert mounts["http-socket"] == "/run/dradriver-http"
    controller = one(docs, "Deployment")
    assert controller["spec"]["replicas"] == 1
    assert controller["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert driver_config(docs).sources[0].static is not None
    (hook,) = one(docs, "ValidatingWebhookConfiguration")["webhooks"]
    assert hook["clientConfig"]["url"] == "https://127.0.0.1:18443/validate"
    assert "service" not in hook["clientConfig"]
    secret = one(docs, "Secret", "dradriver-webhook-tls")
    leaf = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


MAP_API = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"


def test_allocation_finalizer_policy_where_the_cluster_serves_it(helm: Path) -> None:
    assert "MutatingAdmissionPolicy" not in kinds(render(helm))  # helm's defaults: pre-1.36
    docs = render(helm, "--api-versions", MAP_API)
    policy = one(docs, "MutatingAdmissionPolicy")
    binding = one(docs, "MutatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    spec = policy["spec"]
    # Ignore: without the policy the controller adds the finalizer itself.
    assert spec["failurePolicy"] == "Ignore"
    assert spec["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE"]
    conditions = " ".join(c["expression"] for c in spec["matchConditions"])
    assert f"'{ALLOCATION_ANNOTATION}'" in conditions and f"'{IMMEDIATE}'" in conditions
    assert f"'{FINALIZER}'" in spec["mutations"][0]["jsonPatch"]["expression"]
    for setting, api_versions, rendered in [
        ("controller.allocationFinalizerPolicy=false", ("--api-versions", MAP_API), False),
        ("controller.allocationFinalizerPolicy=true", (), True),
        ("controller.enabled=false,webhook.enabled=false", ("--api-versions", MAP_API), False),
    ]:
        found = "MutatingAdmissionPolicy" in kinds(render(helm, "--set", setting, *api_versions))
        assert found == rendered, setting


@pytest.mark.parametrize(
    ("setting", "key"),
    [
        ("controller.replicas=two", "controller/replicas"),
        ("webhook.tls.mode=vault", "webhook/tls/mode"),
        ("driverName=Not_A_DNS_Name", "driverName"),
        ("kubeletPlugin.httpPort=70000", "kubeletPlugin/httpPort"),
        ("image.pullPolicy=Sometimes", "image/pullPolicy"),
        ("controler.replicas=1", "controler"),
        ("deviceClasses.extendedResource.resourceName=mock", "deviceClasses/extendedResource"),
        ("metrics.serviceMonitor.interval=often", "metrics/serviceMonitor/interval"),
        ("kubeletPlugin.config.driverName=other.dev", "kubeletPlugin/config"),
        ("webhook.failurePolicy=Sometimes", "webhook/failurePolicy"),
        ("kubeletPlugin.cdiDir=relative/cdi", "kubeletPlugin/cdiDir"),
        ("controller.allocationFinalizerPolicy=maybe", "controller/allocationFinalizerPolicy"),
    ],
)
def test_schema_rejects_a_wrong_value_naming_its_key(helm: Path, setting: str, key: str) -> None:
    stderr = failure(helm, "--set", setting)
    assert "values don't meet the specifications of the schema" in stderr
    assert key in stderr, stderr


def test_one_name_is_never_advertised_both_ways(helm: Path) -> None:
    stderr = failure(
        helm,
        *values("shim-values.yaml"),
        "--set",
        "kubeletPlugin.config.devicePlugin.resources[0].resourceName=dradriver.dev/mock-dra",
    )
    assert "kubeletPlugin.config.devicePlugin.resources" in stderr
    assert "deviceClasses.extendedResource.resourceName" in stderr


def test_manual_tls_needs_the_ca(helm: Path) -> None:
    assert "webhook.tls.caBundle" in failure(helm, "--set", "webhook.tls.mode=manual")


def test_manifests_are_rendered_from_the_chart(helm: Path) -> None:
    assert manifests.stale(helm) == [], "run python -m devtools.manifests --write"


def test_a_stale_manifest_is_found(helm: Path, tmp_path: Path) -> None:
    target = tmp_path / "manifests"
    assert manifests.main(["--write", "--dir", str(target)]) == 0
    assert manifests.stale(helm, target) == []
    daemonset = target / "kubeletplugin" / "daemonset.yaml"
    daemonset.write_text(daemonset.read_text().replace("maxSurge: 1", "maxSurge: 2"))
    (target / "controller" / "extra.yaml").write_text("kind: ConfigMap\n")
    problems = manifests.stale(helm, target)
    assert problems == [
        f"{daemonset} is out of date",
        f"{target / 'controller' / 'extra.yaml'} is not rendered from the chart "
        "(delete it or add a template)",
    ]


def _devices(config: DriverConfig, mock_dir: Path) -> list[Obj]:
    sources = build_sources(config.with_mock_dir(str(mock_dir)))
    return [d.to_api(config.driver_name) for d in discover_all(sources)]


def _selected(device_class: Obj, devices: list[Obj]) -> set[str]:
    selectors = [
        cel.compile_selector(s["cel"]["expression"]) for s in device_class["spec"]["selectors"]
    ]
    chosen = set()
    for device in devices:
        inp = cel.device_input(DRIVER, device)
        results = [s.evaluate(inp) for s in selectors]
        assert all(r.error is None for r in results), [r.error for r in results]
        if all(r.matched for r in results):
            chosen.add(device["name"])
    return chosen


@pytest.mark.parametrize("values_file", [None, "shim-values.yaml"])
def test_each_class_selects_only_its_devices(
    helm: Path, tmp_path: Path, values_file: str | None
) -> None:
    """The extended-resource class gets the devices set aside for it, the plain class the rest.

    Evaluated with dradriver's CEL (Kubernetes semantics) on the devices the chart's
    driver config makes; a selector that errors would abort the scheduler's allocation,
    so an error fails here too.
    """
    docs = render(helm, *(values(values_file) if values_file else ()))
    config = driver_config(docs)
    devices = _devices(config, tmp_path)
    plain = one(docs, "DeviceClass", DRIVER)
    extended = one(docs, "DeviceClass", f"{DRIVER}-mock-extended-resource")
    assert extended["spec"]["extendedResourceName"] == "dradriver.dev/mock-dra"
    shim_devices = {
        d["name"]
        for d in devices
        if config.device_plugin.enabled and d["name"] in ("dev-2", "dev-3")
    }
    assert _selected(extended, devices) == {"er-0", "er-1"}
    assert _selected(plain, devices) == {"dev-0", "dev-1", "dev-2", "dev-3"}
    assert not shim_devices & _selected(extended, devices)


def test_examples_do_not_advertise_one_name_both_ways() -> None:
    """README, the docs, manifests/ and the demo: no shim resource name is also a DRA class's."""
    shim_names: set[str] = set()
    dra_names: set[str] = set()
    for path in (REPO / "manifests").rglob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "DeviceClass":
                name = doc["spec"].get("extendedResourceName")
                if name:
                    dra_names.add(name)
    texts = [p.read_text() for p in markdown_pages()]
    demo = (REPO / "devtools" / "demo" / "main.py").read_text()
    for text in (*texts, demo):
        for line in text.splitlines():
            if "resourceName:" in line and "dradriver.dev/" in line:
                shim_names.add(line.split("resourceName:")[1].split()[0].strip("'\","))
    from devtools.demo.main import LEGACY_RESOURCE

    shim_names.add(LEGACY_RESOURCE)
    assert dra_names == {"dradriver.dev/mock-dra"}
    assert "dradriver.dev/mock" in shim_names
    assert not shim_names & dra_names
