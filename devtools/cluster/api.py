"""A small admin REST client for the local cluster (tests, demo, probes).

It reads and writes plain JSON dicts so nothing the server returns is dropped
(the generated Python client drops fields it does not know).
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import path_for

__all__ = ["APIError", "AdminAPI", "path_for", "wait_until"]

T = TypeVar("T")


class APIError(RuntimeError):
    def __init__(self, method: str, path: str, resp: httpx.Response) -> None:
        self.status = resp.status_code
        try:
            self.body: Obj = resp.json()
        except ValueError:
            self.body = {"message": resp.text}
        super().__init__(f"{method} {path}: {self.status} {self.body.get('message', '')}")


class AdminAPI:
    def __init__(self, server: str, pki_dir: Path) -> None:
        tls = ssl.create_default_context(cafile=str(pki_dir / "ca.crt"))
        tls.load_cert_chain(str(pki_dir / "admin.crt"), str(pki_dir / "admin.key"))
        self._http = httpx.Client(base_url=server, verify=tls, timeout=30)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> AdminAPI:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Obj:
        resp = self._http.request(method, path, **kwargs)
        if resp.status_code >= 300:
            raise APIError(method, path, resp)
        result: Obj = resp.json()
        return result

    def status_of(self, path: str) -> int:
        """The HTTP status of a GET, for readiness probes."""
        return self._http.get(path).status_code

    def get(self, path: str, **params: Any) -> Obj:
        return self.request("GET", path, params=params or None)

    def get_or_none(self, path: str) -> Obj | None:
        try:
            return self.get(path)
        except APIError as e:
            if e.status == 404:
                return None
            raise

    def create(self, path: str, body: Obj) -> Obj:
        return self.request("POST", path, json=body)

    def delete(self, path: str, missing_ok: bool = True) -> None:
        try:
            self.request("DELETE", path)
        except APIError as e:
            if not (missing_ok and e.status == 404):
                raise

    def items(self, path: str, **params: Any) -> list[Obj]:
        items: list[Obj] = self.get(path, **params).get("items", [])
        return items

    def delete_namespace(self, name: str, timeout: float = 120) -> None:
        """Delete a namespace (if it exists) and wait until it is gone, its pods too."""
        path = path_for("v1", "namespaces", name=name)
        self.delete(path)
        wait_until(f"namespace {name} deleted", lambda: self.get_or_none(path) is None, timeout)

    def create_namespace(self, name: str, timeout: float = 60) -> None:
        """Create a namespace and wait for its default ServiceAccount (pods need it)."""
        self.create("/api/v1/namespaces", {"metadata": {"name": name}})
        wait_until(
            f"ServiceAccount {name}/default",
            lambda: self.get_or_none(path_for("v1", "serviceaccounts", name, "default")),
            timeout,
        )


def wait_until(
    what: str, probe: Callable[[], T | None], timeout: float, interval: float = 0.1
) -> T:
    """Poll ``probe`` until it returns something truthy, which is returned."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
