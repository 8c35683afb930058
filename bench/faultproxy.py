"""A plain-HTTP proxy in front of the real apiserver that fails single-claim GETs on demand.

The fault suite needs "the apiserver answers 503 (or 403) for the claim GET while the plugin
starts", and a real apiserver cannot be made to do that for one kind of request only. This
is the fake part, and it is as thin as it can be: every other request (lists, watches,
slice writes) goes through to the real apiserver with the cluster admin's client
certificate, streamed, so the plugin under test runs against the real server except for
the scripted fault. The plugin is pointed at it with a kubeconfig whose server is
``http://127.0.0.1:<port>`` (the token in it is dropped here).
"""

from __future__ import annotations

import re
import ssl
import threading
from pathlib import Path

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from devtools.cluster.config import write_kubeconfig
from devtools.cluster.wait import wait_until

CLAIM_GET = re.compile(r"/apis/resource\.k8s\.io/v1/namespaces/[^/]+/resourceclaims/[^/]+")
# Hop-by-hop headers, and what the proxy replaces (credentials, the upstream host).
_DROPPED_REQUEST = {"host", "authorization", "connection", "keep-alive", "transfer-encoding"}
_DROPPED_RESPONSE = {"connection", "keep-alive", "transfer-encoding"}
_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


class ClaimFaultProxy:
    """While :attr:`status` is set, a GET of one ResourceClaim is answered with that HTTP
    status (a ``Status`` body, as the apiserver sends) and counted in :attr:`faulted`."""

    def __init__(self, upstream: str, pki_dir: Path, port: int) -> None:
        self.upstream = upstream
        self.port = port
        self.status: int | None = None
        self.faulted = 0
        self._lock = threading.Lock()
        tls = ssl.create_default_context(cafile=str(pki_dir / "ca.crt"))
        tls.load_cert_chain(str(pki_dir / "admin.crt"), str(pki_dir / "admin.key"))
        self._tls = tls
        self._client: httpx.AsyncClient | None = None
        app = Starlette(routes=[Route("/{path:path}", self._forward, methods=_METHODS)])
        config = uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="fault-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, path: Path, ca: Path) -> Path:
        """A kubeconfig that sends the plugin here."""
        write_kubeconfig(path, self.url, ca, "fault-proxy", token="dropped-by-the-proxy")
        return path

    def start(self) -> None:
        self._thread.start()
        wait_until("the fault proxy serving", lambda: self._server.started, 30)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)

    def _fault(self, request: Request) -> int | None:
        if request.method != "GET" or not CLAIM_GET.fullmatch(request.url.path):
            return None
        with self._lock:
            if self.status is None:
                return None
            self.faulted += 1
            return self.status

    async def _forward(self, request: Request) -> Response:
        status = self._fault(request)
        if status is not None:
            return JSONResponse(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "message": f"injected by the fault suite: HTTP {status}",
                    "code": status,
                },
                status_code=status,
            )
        if self._client is None:  # created on the server's own loop
            self._client = httpx.AsyncClient(base_url=self.upstream, verify=self._tls, timeout=None)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _DROPPED_REQUEST]
        upstream = self._client.build_request(
            request.method,
            request.url.path,
            params=request.url.query,
            headers=headers,
            content=await request.body(),
        )
        try:
            reply = await self._client.send(upstream, stream=True)
        except httpx.HTTPError as e:
            return JSONResponse({"kind": "Status", "code": 502, "message": str(e)}, 502)
        return StreamingResponse(
            reply.aiter_raw(),
            status_code=reply.status_code,
            headers={k: v for k, v in reply.headers.items() if k.lower() not in _DROPPED_RESPONSE},
            background=BackgroundTask(reply.aclose),
        )
