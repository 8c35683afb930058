"""The Kubernetes REST client that keeps every field: asyncio and a sync twin.

:class:`KubeClient` (asyncio, over :mod:`dradriver.k8s.http`) serves the components;
:class:`SyncKubeClient` serves synchronous callers (dev tooling, tests, benchmarks): it
runs a KubeClient on an event loop of its own, so a request means the same thing
whichever client sends it. Both are built on one :class:`Connection`. A request without
an answer raises :class:`~dradriver.k8s.http.TransportError` from either.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, TypeVar
from urllib.parse import quote, urlencode

from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.http import ConnectionPool
from dradriver.k8s.jsondecode import decode_list, decode_watch_event
from dradriver.k8s.kubeconfig import read_static_kubeconfig
from dradriver.k8s.objects import Obj
from dradriver.log import get_logger

log = get_logger("kube")
_T = TypeVar("_T")
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class Connection:
    """Where the apiserver is and how to authenticate to it."""

    server: str
    tls: ssl.SSLContext
    token_file: Path | None = None
    token: str | None = None
    # Kubeconfig exec plugins and OIDC providers hand out tokens that expire: this returns
    # the current one, asking the kubeconfig loader for a new one once it has expired.
    token_source: Callable[[], str | None] | None = field(default=None, compare=False, repr=False)

    def bearer(self) -> str | None:
        # Projected service-account tokens rotate; read the file each time.
        if self.token_file is not None:
            return self.token_file.read_text().strip()
        if self.token_source is not None:
            return self.token_source()
        return self.token


def load_connection(kubeconfig: str | None = None) -> Connection:
    """From a kubeconfig file if given (or $KUBECONFIG), else the in-cluster service account.

    The ``kubernetes`` client library (about 40 MiB that a process never gives back) is
    imported only for a kubeconfig that needs its loader: exec plugins, OIDC and the
    rest that :func:`~dradriver.k8s.kubeconfig.read_static_kubeconfig` leaves to it.
    """
    if not kubeconfig and (SA_DIR / "token").exists():
        return _in_cluster_connection()
    static = read_static_kubeconfig(kubeconfig)
    if static is not None:
        return Connection(server=static.server, tls=static.tls, token=static.token)
    return _library_connection(kubeconfig)


def _in_cluster_connection() -> Connection:
    """The pod's service account: the apiserver from the service env, its CA, the token
    file (re-read on every request, since projected tokens rotate)."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port.isdigit():
        raise ValueError(
            "in a pod without KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT; "
            "pass --kubeconfig"
        )
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    tls = ssl.create_default_context(cafile=str(SA_DIR / "ca.crt"))
    return Connection(server=f"https://{host}:{port}", tls=tls, token_file=SA_DIR / "token")


def _library_connection(kubeconfig: str | None) -> Connection:
    """A kubeconfig loaded by the client library's loader, with its token refresh."""
    # Imported lazily: processes that never get here do not carry the library in memory.
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
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

    def configured_token() -> str | None:
        auth = cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken")
        return auth.removeprefix("Bearer ").strip() if auth else None

    token_source: Callable[[], str | None] | None = None
    refresh = cfg.refresh_api_key_hook
    if refresh is not None:
        # The loader's hook re-runs the exec plugin (or refreshes the OIDC token) once the
        # token it holds is expired or about to be (5 min skew), and only copies settings
        # otherwise; the client library calls it before every request, and so do we. The
        # refresh blocks the caller (the plugin runs synchronously), once per token
        # lifetime. The lock keeps two threads from running the plugin at once.
        lock = threading.Lock()

        def token_source() -> str | None:
            with lock:
                refresh(cfg)
                return configured_token()

    return Connection(
        server=cfg.host,
        tls=tls,
        token=configured_token(),
        token_source=token_source,
    )


def connection_from_files(server: str, ca: Path, cert: Path, key: Path) -> Connection:
    """A connection authenticated by a client certificate, from PEM files (no kubeconfig)."""
    tls = ssl.create_default_context(cafile=str(ca))
    tls.load_cert_chain(str(cert), str(key))
    return Connection(server=server, tls=tls)


JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
CONNECT_SECONDS = 30.0
# Reads may be watches, which the server holds open for up to timeoutSeconds (300).
READ_SECONDS = 330.0


def _apply_params(field_manager: str, force: bool) -> dict[str, Any]:
    return {"fieldManager": field_manager, "force": "true" if force else "false"}


class _Codec:
    """Request building and response decoding (apart from the transport)."""

    def __init__(self, conn: Connection, user_agent: str) -> None:
        self._conn = conn
        self._user_agent = user_agent
        self.write_count = 0

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = dict(extra or {})
        token = self._conn.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _encode(
        self,
        method: str,
        body: Obj | list[Obj] | None,
        content_type: str,
        accept: str | None,
    ) -> tuple[dict[str, str], str | None]:
        """The headers and content of a request; counts writes."""
        extra = {"Content-Type": content_type} if body is not None else {}
        if accept is not None:
            extra["Accept"] = accept
        if method != "GET":
            self.write_count += 1
        # Compact, as kubectl and client-go send it: the apiserver keeps a RawExtension
        # (opaque device config) as the bytes it was given, and a later merge patch that
        # re-encodes the object compactly then counts as a change of an immutable spec.
        content = json.dumps(body, separators=(",", ":")) if body is not None else None
        return self._headers(extra), content

    @staticmethod
    def _decode(
        method: str,
        path: str,
        status: int,
        content: bytes,
        started: float,
        decode: Callable[[bytes], Obj] | None = None,
    ) -> Obj:
        """The JSON body of a response, or :class:`KubeAPIError` for a refusal. With
        ``decode``, a 2xx body that it cannot decode raises (``ValueError``) instead of
        coming back as ``{"message": <text>}``."""
        log.debug(
            "api request",
            method=method,
            path=path,
            status=status,
            ms=round((time.monotonic() - started) * 1000, 1),
        )
        try:
            data: Obj = json.loads(content) if decode is None else decode(content)
        except ValueError:
            if decode is not None and status < 300:
                raise
            data = {"message": content.decode("utf-8", errors="replace")}
        if status >= 300:
            raise KubeAPIError(method, path, status, data)
        return data


def _target(path: str, params: dict[str, Any] | None) -> str:
    """``path`` with ``params`` as its query (values as ``str()``, percent-encoded)."""
    if not params:
        return path
    query = urlencode({k: str(v) for k, v in params.items()}, quote_via=quote)
    return f"{path}{'&' if '?' in path else '?'}{query}"


class KubeClient(_Codec):
    """The asyncio client of the controller and the kubelet plugin.

    ``max_connections`` bounds the open connections (watches hold one each); None: 100,
    all kept open when idle."""

    def __init__(
        self, conn: Connection, user_agent: str = "dradriver", max_connections: int | None = None
    ) -> None:
        super().__init__(conn, user_agent)
        # All of them kept open when idle: the next burst of requests finds them open (no
        # TLS handshakes), and more requests than connections wait for one.
        self._pool = ConnectionPool(
            conn.server,
            conn.tls,
            max_connections=max_connections or 100,
            connect_timeout=CONNECT_SECONDS,
            read_timeout=READ_SECONDS,
        )
        self._fixed_headers = {"Accept": "*/*", "User-Agent": user_agent}

    async def aclose(self) -> None:
        await self._pool.aclose()

    def _request_headers(self, extra: dict[str, str]) -> dict[str, str]:
        return {**self._fixed_headers, **extra}

    async def request(
        self,
        method: str,
        path: str,
        body: Obj | list[Obj] | None = None,
        params: dict[str, Any] | None = None,
        content_type: str = JSON,
        accept: str | None = None,
        decode: Callable[[bytes], Obj] | None = None,
    ) -> Obj:
        headers, content = self._encode(method, body, content_type, accept)
        started = time.monotonic()
        resp = await self._pool.request(
            method,
            _target(path, params),
            self._request_headers(headers),
            content.encode() if content is not None else None,
        )
        return self._decode(method, path, resp.status, resp.content, started, decode)

    async def get(self, path: str, **params: Any) -> Obj:
        return await self.request("GET", path, params=params or None)

    async def get_text(self, path: str, **params: Any) -> str:
        """A plain-text answer (a pod's log, ``/metrics``); a refusal raises
        :class:`KubeAPIError` as for any other request."""
        headers, _ = self._encode("GET", None, JSON, None)
        started = time.monotonic()
        resp = await self._pool.request(
            "GET", _target(path, params or None), self._request_headers(headers)
        )
        if resp.status >= 300:
            self._decode("GET", path, resp.status, resp.content, started)  # raises
        return resp.content.decode("utf-8", errors="replace")

    async def get_or_none(self, path: str) -> Obj | None:
        try:
            return await self.get(path)
        except KubeAPIError as e:
            if e.status == 404:
                return None
            raise

    async def list(self, path: str, **params: Any) -> Obj:
        """A collection; an item nested too deep for Python is a ``TooDeepObject``."""
        return await self.request("GET", path, params=params or None, decode=decode_list)

    async def create(self, path: str, body: Obj) -> Obj:
        return await self.request("POST", path, body)

    async def replace(self, path: str, body: Obj) -> Obj:
        return await self.request("PUT", path, body)

    async def merge_patch(self, path: str, body: Obj) -> Obj:
        return await self.request("PATCH", path, body, content_type=MERGE_PATCH)

    async def apply(self, path: str, body: Obj, field_manager: str, force: bool = True) -> Obj:
        """Server-side apply (the body must carry apiVersion, kind and metadata.name)."""
        params = _apply_params(field_manager, force)
        return await self.request("PATCH", path, body, params=params, content_type=APPLY_PATCH)

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
        target = _target(path, query)
        started = time.monotonic()
        async with self._pool.stream("GET", target, self._request_headers(self._headers())) as resp:
            if resp.status >= 300:  # raises KubeAPIError, as for any other refusal
                self._decode("WATCH", path, resp.status, await resp.aread() or b"{}", started)
            # One event per "\n"-terminated line. Not aiter_lines(): it also splits at
            # U+0085, U+2028 and the other str.splitlines() breaks, and the apiserver sends
            # U+0085 unescaped inside strings, which would cut an event in two.
            pending: list[bytes] = []
            async for chunk in resp.aiter_bytes():
                *complete, rest = chunk.split(b"\n")
                for piece in complete:
                    line, pending = b"".join([*pending, piece]), []
                    if line.strip():
                        # An object nested too deep is a TooDeepObject: the stream goes on.
                        yield decode_watch_event(line)
                if rest:
                    pending.append(rest)
            line = b"".join(pending)
            if line.strip():
                yield decode_watch_event(line)


class SyncKubeClient:
    """The blocking twin of :class:`KubeClient`, no watch: the same client, run on a
    private event loop in a thread of its own (so it also works under a running loop).

    Invariants: every call is one :class:`KubeClient` call, so requests, answers and
    errors are KubeClient's; calls from several threads take turns on that loop; after
    :meth:`close` the client is unusable.
    """

    def __init__(
        self, conn: Connection, user_agent: str = "dradriver", max_connections: int | None = None
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="sync-kube-client", daemon=True
        )
        self._thread.start()
        self._client = KubeClient(conn, user_agent, max_connections)

    @property
    def write_count(self) -> int:
        return self._client.write_count

    def _run(self, call: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(call, self._loop).result()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._run(self._client.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        body: Obj | list[Obj] | None = None,
        params: dict[str, Any] | None = None,
        content_type: str = JSON,
        accept: str | None = None,
    ) -> Obj:
        return self._run(
            self._client.request(method, path, body, params, content_type, accept=accept)
        )

    def get(self, path: str, **params: Any) -> Obj:
        return self._run(self._client.get(path, **params))

    def get_text(self, path: str, **params: Any) -> str:
        return self._run(self._client.get_text(path, **params))

    def get_or_none(self, path: str) -> Obj | None:
        return self._run(self._client.get_or_none(path))

    def list(self, path: str, **params: Any) -> Obj:
        return self._run(self._client.list(path, **params))

    def create(self, path: str, body: Obj) -> Obj:
        return self._run(self._client.create(path, body))

    def replace(self, path: str, body: Obj) -> Obj:
        return self._run(self._client.replace(path, body))

    def merge_patch(self, path: str, body: Obj) -> Obj:
        return self._run(self._client.merge_patch(path, body))

    def apply(self, path: str, body: Obj, field_manager: str, force: bool = True) -> Obj:
        """Server-side apply (the body must carry apiVersion, kind and metadata.name)."""
        return self._run(self._client.apply(path, body, field_manager, force))

    def delete(self, path: str, missing_ok: bool = True, **params: Any) -> None:
        self._run(self._client.delete(path, missing_ok, **params))
