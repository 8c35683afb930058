"""Unix-socket gRPC serving for the kubelet-facing APIs (DRA, registration, device plugin).

Shared by the kubelet-plugin and the device-plugin frameworks: both serve sockets
only root may open, and both must never take over a socket a live process serves.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import grpc


def _remove_stale(path: Path) -> None:
    if not path.exists() and not path.is_symlink():
        return
    if not path.is_socket():
        raise RuntimeError(f"{path} exists and is not a socket; refusing to replace it")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1)
        try:
            probe.connect(str(path))
        except OSError:
            pass  # nobody listens: a leftover of a crashed plugin
        else:
            raise RuntimeError(
                f"another process serves {path}; give each plugin instance its own socket "
                "names with --instance (the DaemonSet passes the pod UID)"
            )
    path.unlink()


async def serve_unix(server: grpc.aio.Server, path: Path) -> None:
    """Serve on a unix socket readable only by root, replacing a dead leftover socket."""
    _remove_stale(path)
    # The kubelet runs as root; nobody else needs these sockets.
    old = os.umask(0o077)
    try:
        server.add_insecure_port(f"unix://{path}")
        await server.start()
    finally:
        os.umask(old)
