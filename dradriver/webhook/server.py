"""``dradriver-webhook``: the admission webhook served by uvicorn over TLS.

    dradriver-webhook --cert tls.crt --key tls.key [--address :8443]
                      [--driver-name dradriver.dev] [--device-class NAME ...]
                      [--max-body-bytes N] [--max-selectors N] [--max-selector-bytes N]
                      [--small-body-bytes N] [--small-workers N] [--small-queue N]
                      [--large-workers N] [--large-queue N] [--review-timeout SECONDS]

The same port serves ``POST /validate``, ``/healthz``, ``/readyz`` and
``/metrics``. SIGTERM and SIGINT stop it gracefully (in-flight reviews finish).
The certificate and key are re-read when their files change
(:class:`~dradriver.webhook.tls.ReloadingCertificate`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import ssl
import sys
from collections.abc import Sequence
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.httpserver import parse_address
from dradriver.log import configure, get_logger
from dradriver.webhook import limits
from dradriver.webhook.app import build_app
from dradriver.webhook.pool import ValidationPool
from dradriver.webhook.tls import ReloadingCertificate
from dradriver.webhook.validation import Settings

log = get_logger("webhook")


class WebhookServer:
    """Runs ``app`` over TLS until stopped; ``port`` is the bound port (useful with port 0).

    The certificate is re-read on change (:attr:`certificate`); :meth:`stop` also stops the
    app's validation workers (``app.state.pool``, see :func:`~dradriver.webhook.app.
    build_app`)."""

    def __init__(self, app: FastAPI, address: str, cert: Path, key: Path) -> None:
        host, port = parse_address(address)
        for path in (cert, key):
            if not path.is_file():
                raise FileNotFoundError(f"{path} does not exist or is not a file")
        self.app = app
        self.certificate = ReloadingCertificate(cert, key)
        self._server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=host,
                port=port,
                ssl_certfile=str(cert),
                ssl_keyfile=str(key),
                ssl_context_factory=lambda _config, _default: self.certificate.context,
                log_level="warning",
                access_log=False,
                lifespan="off",
            )
        )
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve())
        # uvicorn offers no start-up event: poll its flag (not a test synchronisation).
        while not self._server.started:
            if self._task.done():
                await self._task  # re-raise why it could not start (port taken, bad cert...)
                raise RuntimeError("webhook server stopped during start-up")
            await asyncio.sleep(0.01)

    @property
    def port(self) -> int:
        sockets = self._server.servers[0].sockets if self._server.servers else []
        return int(sockets[0].getsockname()[1]) if sockets else 0

    async def wait(self) -> None:
        if self._task is not None:
            await self._task

    async def stop(self) -> None:
        self._server.should_exit = True
        try:
            await self.wait()
        finally:
            pool = getattr(self.app.state, "pool", None)
            if isinstance(pool, ValidationPool):
                pool.close()


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="dradriver-webhook",
        description="dradriver's validating admission webhook: DeviceClaimParameters, and this "
        "driver's opaque config and CEL selectors in ResourceClaims and ResourceClaimTemplates.",
    )
    parser.add_argument(
        "--address",
        default=env("DRADRIVER_WEBHOOK_ADDRESS", ":8443"),
        help="HOST:PORT to serve HTTPS on (default: $DRADRIVER_WEBHOOK_ADDRESS or %(default)s)",
    )
    parser.add_argument(
        "--cert",
        type=Path,
        default=env("DRADRIVER_WEBHOOK_CERT"),
        help="serving certificate, PEM (default: $DRADRIVER_WEBHOOK_CERT)",
    )
    parser.add_argument(
        "--key",
        type=Path,
        default=env("DRADRIVER_WEBHOOK_KEY"),
        help="its private key, PEM (default: $DRADRIVER_WEBHOOK_KEY)",
    )
    parser.add_argument(
        "--driver-name",
        default=env("DRADRIVER_DRIVER_NAME", DEFAULT_DRIVER_NAME),
        help="DRA driver name, also the API group of the CRDs (default: %(default)s)",
    )
    parser.add_argument(
        "--device-class",
        action="append",
        default=None,
        help="a DeviceClass of this driver: requests for it get their CEL selectors compiled "
        "(repeatable; default: the classes the driver's manifests install, DRIVER and "
        "DRIVER-mock-extended-resource)",
    )
    limits.add_flags(parser)
    parser.add_argument("--log-level", default="info", help="default: %(default)s")
    return parser


def app_from_args(args: argparse.Namespace) -> FastAPI:
    """The app the flags describe; ValueError names a flag out of range."""
    given = limits.from_args(args)
    settings = given.settings(Settings.for_driver(args.driver_name, args.device_class))
    return build_app(settings, max_body_bytes=given.max_body_bytes, pool_limits=given.pool)


async def serve(server: WebhookServer) -> None:
    await server.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("serving", port=server.port)
    waiter = asyncio.create_task(stop.wait())
    serving = asyncio.create_task(server.wait())
    await asyncio.wait({waiter, serving}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    log.info("stopping")
    await server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.cert is None or args.key is None:
        parser.error("--cert and --key are required (the apiserver only calls webhooks over TLS)")
    configure(args.log_level)
    try:
        app = app_from_args(args)
    except ValueError as e:
        parser.error(str(e))
    classes = app.state.pool.settings.device_classes
    try:
        server = WebhookServer(app, args.address, args.cert, args.key)
    except (ValueError, OSError, ssl.SSLError) as e:
        parser.error(f"--cert/--key: {e}")
    log.info(
        "starting",
        address=args.address,
        driver=args.driver_name,
        device_classes=",".join(sorted(classes)),
    )
    try:
        asyncio.run(serve(server))
    except (OSError, SystemExit) as e:
        log.error("webhook server failed", error=str(e))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
