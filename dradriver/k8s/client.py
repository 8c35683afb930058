"""An asyncio Kubernetes REST client over httpx that keeps every field."""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.objects import Obj
from dradriver.log import get_logger

log = get_logger("kube")
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class Connection:
    """Where the apiserver is and how to authenticate to it."""

    server: str
    tls: ssl.SSLContext
    token_file: Path | None = None
    token: str | None = None

    def bearer(self) -> str | None:
        # Projected service-account tokens rotate; read the file each time.
        if self.token_file is not None:
            return self.token_file.read_text().strip()
        return self.token


def load_connection(kubeconfig: str | None = None) -> Connection:
    """From a kubeconfig file if given (or $KUBECONFIG), else the in-cluster service account."""
    from kubernetes import client, config

    cfg = client.Configuration()
    if kubeconfig or not (SA_DIR / "token").exists():
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        token_file = None
    else:
        config.load_incluster_config(client_configuration=cfg)
        token_file = SA_DIR / "token"
    tls = (
        ssl.create_default_context(cafile=cfg.ssl_ca_cert)
        if cfg.ssl_ca_cert
        else (ssl.create_default_context())
    )
    if not cfg.verify_ssl:
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
    if cfg.cert_file and cfg.key_file:
        tls.load_cert_chain(cfg.cert_file, cfg.key_file)
    auth = cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken")
    token = auth.removeprefix("Bearer ").strip() if auth else None
    return Connection(server=cfg.host, tls=tls, token_file=token_file, token=token)


class KubeClient:
    def __init__(self, conn: Connection, user_agent: str = "dradriver") -> None:
        self._conn = conn
        self._http = httpx.AsyncClient(
            base_url=conn.server,
            verify=conn.tls,
            timeout=httpx.Timeout(30, read=330),
            headers={"User-Agent": user_agent},
        )
        self.write_count = 0

    async def aclose(self) -> None:
        await self._http.aclose()

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = dict(extra or {})
        token = self._conn.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    async def request(
        self,
        method: str,
        path: str,
        body: Obj | list[Obj] | None = None,
        params: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        headers = self._headers({"Content-Type": content_type} if body is not None else None)
        content = json.dumps(body) if body is not None else None
        if method != "GET":
            self.write_count += 1
        started = time.monotonic()
        resp = await self._http.request(
            method, path, content=content, params=params, headers=headers
        )
        log.debug(
            "api request",
            method=method,
            path=path,
            status=resp.status_code,
            ms=round((time.monotonic() - started) * 1000, 1),
        )
        try:
            data: Obj = resp.json()
        except ValueError:
            data = {"message": resp.text}
        if resp.status_code >= 300:
            raise KubeAPIError(method, path, resp.status_code, data)
        return data

    async def get(self, path: str, **params: Any) -> Obj:
        return await self.request("GET", path, params=params or None)

    async def get_or_none(self, path: str) -> Obj | None:
        try:
            return await self.get(path)
        except KubeAPIError as e:
            if e.status == 404:
                return None
            raise

    async def list(self, path: str, **params: Any) -> Obj:
        return await self.get(path, **params)

    async def create(self, path: str, body: Obj) -> Obj:
        return await self.request("POST", path, body)

    async def replace(self, path: str, body: Obj) -> Obj:
        return await self.request("PUT", path, body)

    async def merge_patch(self, path: str, body: Obj) -> Obj:
        return await self.request("PATCH", path, body, content_type="application/merge-patch+json")

    async def apply(self, path: str, body: Obj, field_manager: str, force: bool = True) -> Obj:
        """Server-side apply (the body must carry apiVersion, kind and metadata.name)."""
        params = {"fieldManager": field_manager, "force": "true" if force else "false"}
        return await self.request(
            "PATCH", path, body, params=params, content_type="application/apply-patch+yaml"
        )

    async def delete(self, path: str, missing_ok: bool = True, **params: Any) -> None:
        try:
            await self.request("DELETE", path, params=params or None)
        except KubeAPIError as e:
            if not (missing_ok and e.status == 404):
                raise

    async def watch(self, path: str, resource_version: str, **params: Any) -> AsyncIterator[Obj]:
        """Watch events from ``resource_version`` (bookmarks on); ends when the server closes."""
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "300",
            **params,
        }
        async with self._http.stream("GET", path, params=query, headers=self._headers()) as resp:
            if resp.status_code >= 300:
                body = json.loads(await resp.aread() or b"{}")
                raise KubeAPIError("WATCH", path, resp.status_code, body)
            async for line in resp.aiter_lines():
                if line.strip():
                    event: Obj = json.loads(line)
                    yield event
