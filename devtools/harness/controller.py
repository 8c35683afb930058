"""Run dradriver-controller against the local cluster as its Deployment would (tests, demo).

The controller runs as a host process, but with the identity of a real
deployment: the ``dradriver-controller`` ServiceAccount and the manifests'
RBAC, so a missing permission fails here as it would in a cluster.
"""

from __future__ import annotations

import contextlib
import shutil
import ssl
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from devtools.cluster.api import AdminAPI
from devtools.cluster.apply import apply, apply_manifests
from devtools.cluster.local import LocalCluster
from devtools.cluster.process import ManagedProcess
from devtools.cluster.wait import wait_until
from devtools.harness.nodeplugin import free_port, service_account_kubeconfig
from devtools.harness.webhook import (
    CLUSTER_WEBHOOK_NAME,
    WEBHOOK_NAME,
    issue_serving_cert,
    webhook_configuration,
)
from dradriver import DEFAULT_DRIVER_NAME
from dradriver.api import networkpool as net
from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.paths import path_for

NAMESPACE = "dradriver"
SERVICE_ACCOUNT = "dradriver-controller"
CRD_NAME = "deviceclaimparameters.dradriver.dev"
CRD_NAMES = (CRD_NAME, "networkdevicepools.dradriver.dev")
TEST_DRIVERS = (f"*.{DEFAULT_DRIVER_NAME}",)
"""Drivers whose claims a harness controller allocates besides its own (unless its
``extra_args`` name others): tests and benches give each run a driver of its own under
this domain (``ca-<id>.test.dradriver.dev``), so that they never share devices. Another
vendor's driver in a test is named outside it."""
WEBHOOK_CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


def install_crds(api: AdminAPI) -> None:
    """Apply the controller's CRDs and wait until the apiserver serves them."""
    for crd_name in CRD_NAMES:
        apply_manifests(api, f"controller/crd-{crd_name.split('.')[0]}.yaml")

        def established(name: str = crd_name) -> bool:
            crd = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conditions = (crd.get("status") or {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        wait_until(f"CRD {crd_name} established", established, 30)


def controller_kubeconfig(api: AdminAPI, cluster: LocalCluster, workdir: Path) -> Path:
    """RBAC from the manifests and a kubeconfig with a token for the controller's account."""
    apply_manifests(api, "namespace.yaml", "controller/rbac.yaml")
    install_crds(api)
    wait_until(
        "controller ServiceAccount",
        lambda: api.get_or_none(path_for("v1", "serviceaccounts", NAMESPACE, SERVICE_ACCOUNT)),
        30,
    )
    return service_account_kubeconfig(
        api, cluster, NAMESPACE, SERVICE_ACCOUNT, workdir / "controller.kubeconfig"
    )


@dataclass(frozen=True)
class WebhookTLS:
    """A serving certificate for 127.0.0.1 and the CA that signed it (the cluster's)."""

    cert: Path
    key: Path
    ca: Path


def webhook_tls(cluster: LocalCluster, workdir: Path) -> WebhookTLS:
    """Issue the webhook's serving certificate for 127.0.0.1 from the cluster CA, into
    ``workdir`` (reused if already there); pass it as ``ControllerProcess(webhook=...)``."""
    pki = cluster.layout.pki
    pair = issue_serving_cert(pki, workdir)
    return WebhookTLS(pair.cert, pair.key, pki / "ca.crt")


@dataclass
class ControllerProcess:
    """One dradriver-controller replica."""

    name: str
    kubeconfig: Path
    workdir: Path
    lease_name: str = "dradriver-controller"
    extra_args: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    process: ManagedProcess | None = None
    # With a certificate, the process also serves the admission webhook on webhook_port.
    webhook: WebhookTLS | None = None
    webhook_port: int = field(default_factory=free_port)

    @property
    def log_path(self) -> Path:
        return self.workdir / f"controller-{self.name}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        argv = [
            sys.executable,
            "-m",
            "controller.main",
            f"--kubeconfig={self.kubeconfig}",
            f"--lease-namespace={NAMESPACE}",
            f"--lease-name={self.lease_name}",
            f"--identity={self.name}",
            f"--http-address=127.0.0.1:{self.port}",
            *self.extra_args,
        ]
        if not any(a.startswith("--allocation-driver") for a in self.extra_args):
            argv += [f"--allocation-driver={d}" for d in TEST_DRIVERS]
        if self.webhook is not None:
            argv += [
                f"--webhook-address=127.0.0.1:{self.webhook_port}",
                f"--webhook-cert={self.webhook.cert}",
                f"--webhook-key={self.webhook.key}",
            ]
        self.process = ManagedProcess.start(
            f"dradriver-controller {self.name}",
            argv,
            log_path=self.log_path,
            cwd=self.workdir / f"controller-{self.name}.cwd",
        )

    def check(self) -> None:
        """Raise :class:`ProcessDied` (with the end of its log) if the process exited."""
        if self.process is not None:
            self.process.check()

    def get(self, path: str) -> httpx.Response | None:
        self.check()
        try:
            return httpx.get(self.url + path, timeout=2)
        except httpx.HTTPError:
            return None

    @property
    def webhook_url(self) -> str:
        """The webhook's base URL (POST /validate); the process needs ``webhook``."""
        if self.webhook is None:
            raise RuntimeError(f"dradriver-controller {self.name} serves no webhook")
        return f"https://127.0.0.1:{self.webhook_port}"

    def webhook_get(self, path: str) -> httpx.Response | None:
        """GET on the webhook port over TLS (verified against the cluster CA)."""
        self.check()
        assert self.webhook is not None, "no webhook"
        tls = ssl.create_default_context(cafile=str(self.webhook.ca))
        try:
            return httpx.get(self.webhook_url + path, timeout=2, verify=tls)
        except httpx.HTTPError:
            return None

    def ready(self) -> bool:
        resp = self.get("/readyz")
        return resp is not None and resp.status_code == 200

    def wait_ready(self, timeout: float = 60) -> None:
        if self.process is None:
            raise RuntimeError(f"dradriver-controller {self.name} is not started")
        self.process.wait_ready(f"dradriver-controller {self.name} ready", self.ready, timeout)

    def metric(self, name: str) -> float | None:
        """The first sample of ``name`` (prefix match on the sample line) on /metrics."""
        resp = self.get("/metrics")
        if resp is None:
            return None
        for line in resp.text.splitlines():
            if line.startswith(name):
                return float(line.rsplit(" ", 1)[1])
        return None

    def terminate(self, timeout: float = 30) -> int | None:
        """SIGTERM and wait; returns the exit code."""
        assert self.process is not None, "not started"
        code = self.process.terminate(timeout)
        self.process = None
        return code

    def kill(self) -> None:
        """SIGKILL: a crash, the Lease is not released."""
        if self.process is not None:
            self.process.kill()
        self.process = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=30)
        self.process = None


def _probe_pool(driver: str, labels: dict[str, str] | None) -> dict[str, Any]:
    """A NetworkDevicePool the schema accepts and the webhook denies (exec, no command)."""
    return {
        "apiVersion": f"{driver}/{net.VERSION}",
        "kind": net.KIND,
        "metadata": {"name": "dradriver-webhook-probe", "labels": dict(labels or {})},
        "spec": {"attach": {"backend": "exec"}, "devices": [{"name": "probe"}]},
    }


def register_webhook(
    api: AdminAPI,
    controller: ControllerProcess,
    name: str = "dradriver-webhook",
    *,
    namespace_labels: dict[str, str] | None = None,
    failure_policy: str = "Fail",
    driver: str = DEFAULT_DRIVER_NAME,
    timeout: float = 30,
) -> dict[str, Any]:
    """Register the webhook a running ``controller`` serves (``webhook=webhook_tls(...)``)
    by URL on 127.0.0.1, as ValidatingWebhookConfiguration ``name`` (server-side applied,
    so an existing one is updated), and return once the apiserver calls it.

    Without ``namespace_labels`` it validates every namespace and every
    NetworkDevicePool; with ``failure_policy="Fail"`` nothing it matches can be created
    while that controller is down, so :func:`unregister_webhook` when done. The CRDs
    must be installed (:func:`controller_kubeconfig` does it).
    """
    assert controller.webhook is not None, "start the ControllerProcess with webhook=..."

    def serving() -> bool:
        resp = controller.webhook_get("/healthz")
        return resp is not None and resp.status_code == 200

    wait_until(f"webhook of dradriver-controller {controller.name} serving", serving, timeout)
    config = webhook_configuration(
        name,
        f"{controller.webhook_url}/validate",
        controller.webhook.ca.read_bytes(),
        namespace_labels=namespace_labels,
        driver=driver,
        failure_policy=failure_policy,
    )
    applied = apply(api, config)
    # The apiserver picks configurations up through a watch: probe with a dry run.
    probe = _probe_pool(driver, namespace_labels)
    pools = path_for(f"{driver}/{net.VERSION}", net.PLURAL)
    ours = tuple(f'admission webhook "{n}" denied' for n in (WEBHOOK_NAME, CLUSTER_WEBHOOK_NAME))

    def active() -> bool:
        controller.check()
        try:
            api.create(pools + "?dryRun=All", probe)
        except KubeAPIError as e:
            if any(text in str(e.body.get("message", "")) for text in ours):
                return True
            raise
        return False

    wait_until(f"webhook configuration {name} active", active, timeout)
    return applied


def unregister_webhook(api: AdminAPI, name: str = "dradriver-webhook") -> None:
    """Delete the ValidatingWebhookConfiguration :func:`register_webhook` made."""
    api.delete(f"{WEBHOOK_CONFIGURATIONS}/{name}")


@contextlib.contextmanager
def namespaced_controller(
    api: AdminAPI,
    cluster: LocalCluster,
    namespace: str,
    name: str = "test",
    timeout: float = 60,
) -> Iterator[ControllerProcess]:
    """One ready controller (no leader election) acting only on claims in ``namespace``,
    with the manifests' RBAC; stopped and its work dir removed on exit."""
    workdir = Path(tempfile.mkdtemp(prefix=f"dradriver-{name}-"))
    proc = ControllerProcess(
        f"{name}-{namespace}",
        controller_kubeconfig(api, cluster, workdir),
        workdir,
        extra_args=["--no-leader-elect", f"--allocation-namespace={namespace}"],
    )
    proc.start()
    try:
        proc.wait_ready(timeout)
        yield proc
    finally:
        proc.stop()
        shutil.rmtree(workdir, ignore_errors=True)
