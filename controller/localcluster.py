"""Run dradriver-controller against the local cluster as its Deployment would (tests, demo).

The controller runs as a host process, but with the identity of a real
deployment: the ``dradriver-controller`` ServiceAccount and the manifests'
RBAC, so a missing permission fails here as it would in a cluster.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from dradriver.cluster.api import AdminAPI, path_for, wait_until
from dradriver.cluster.local import LocalCluster
from dradriver.cluster.nodeplugin import apply_file, free_port, service_account_kubeconfig
from dradriver.cluster.process import log_tail

NAMESPACE = "dradriver"
SERVICE_ACCOUNT = "dradriver-controller"
MANIFESTS = Path(__file__).resolve().parents[1] / "manifests" / "controller"
CRD_NAME = "deviceclaimparameters.dradriver.dev"


def install_crds(api: AdminAPI) -> None:
    """Apply the parameters CRD and wait until the apiserver serves it."""
    apply_file(api, MANIFESTS / "crd-deviceclaimparameters.yaml")

    def established() -> bool:
        crd = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}")
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_until(f"CRD {CRD_NAME} established", established, 30)


def controller_kubeconfig(api: AdminAPI, cluster: LocalCluster, workdir: Path) -> Path:
    """RBAC from the manifests and a kubeconfig with a token for the controller's account."""
    apply_file(api, MANIFESTS / "rbac.yaml")
    install_crds(api)
    wait_until(
        "controller ServiceAccount",
        lambda: api.get_or_none(path_for("v1", "serviceaccounts", NAMESPACE, SERVICE_ACCOUNT)),
        30,
    )
    return service_account_kubeconfig(
        api, cluster, NAMESPACE, SERVICE_ACCOUNT, workdir / "controller.kubeconfig"
    )


@dataclass
class ControllerProcess:
    """One dradriver-controller replica."""

    name: str
    kubeconfig: Path
    workdir: Path
    lease_name: str = "dradriver-controller"
    extra_args: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

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
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
        self.proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir, start_new_session=True
        )
        log.close()

    def check(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(
                f"dradriver-controller {self.name} exited {self.proc.returncode}:\n"
                f"{log_tail(self.log_path)}"
            )

    def get(self, path: str) -> httpx.Response | None:
        self.check()
        try:
            return httpx.get(self.url + path, timeout=2)
        except httpx.HTTPError:
            return None

    def ready(self) -> bool:
        resp = self.get("/readyz")
        return resp is not None and resp.status_code == 200

    def metric(self, name: str) -> float | None:
        """The first sample of ``name`` (prefix match on the sample line) on /metrics."""
        resp = self.get("/metrics")
        if resp is None:
            return None
        for line in resp.text.splitlines():
            if line.startswith(name):
                return float(line.rsplit(" ", 1)[1])
        return None

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        self.proc.terminate()
        code = self.proc.wait(timeout=timeout)
        self.proc = None
        return code

    def kill(self) -> None:
        """SIGKILL: a crash, the Lease is not released."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
