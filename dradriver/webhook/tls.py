"""The webhook's TLS settings, and a serving certificate re-read when its files change.

Invariants:

* TLS 1.2 and 1.3 only; TLS 1.2 with ECDHE key exchange and AEAD ciphers only (AES-GCM,
  ChaCha20-Poly1305: no CBC, RC4 or 3DES); no TLS compression (:func:`server_context`).
* Every new handshake checks the certificate and key files (``os.stat``: device, inode,
  size, modification time, symlinks followed, so a Kubernetes secret volume's ``..data``
  swap and cert-manager's renewal both count as a change) and, when they changed, is
  served from a context loaded from the new files. Connections already established keep
  theirs: nothing is dropped.
* A new pair that cannot be loaded (unreadable, half written, a key that does not match
  the certificate) is logged once per change and the previous pair stays in use; the
  files are tried again when they change again.
"""

from __future__ import annotations

import os
import ssl
import threading
from pathlib import Path

from dradriver.log import get_logger

__all__ = ["CIPHERS", "ReloadingCertificate", "server_context"]

log = get_logger("webhook")

CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
"""OpenSSL cipher list for TLS 1.2 (TLS 1.3 suites are all AEAD)."""

Stamp = tuple[tuple[int, int, int, int], ...]


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context serving ``cert`` and ``key``; raises ``OSError``/``ssl.SSLError``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    context.set_alpn_protocols(["http/1.1"])
    context.load_cert_chain(str(cert), str(key))
    return context


def _stamp(paths: tuple[Path, ...]) -> Stamp:
    stamps = []
    for path in paths:
        st = os.stat(path)
        stamps.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(stamps)


class ReloadingCertificate:
    """:attr:`context` is the listening socket's context: its ``sni_callback`` (called for
    every handshake, with or without SNI) hands the handshake the newest loaded context.
    Loading raises at construction, so a server never starts without a certificate."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert, self.key = cert, key
        self._lock = threading.Lock()
        self._stamp = _stamp((cert, key))
        self._current = server_context(cert, key)
        self._failed: Stamp | None = None
        self._unreadable = False  # the last stat failed (logged once)
        self.reloads = 0
        self.context = server_context(cert, key)
        self.context.sni_callback = self._on_handshake

    def current(self) -> ssl.SSLContext:
        """The context for a new connection, reloaded first if the files changed."""
        try:
            stamp = _stamp((self.cert, self.key))
        except OSError as e:  # mid-swap, or gone: keep serving the previous pair
            if not self._unreadable:
                self._unreadable = True
                self._log_failure(e)
            return self._current
        self._unreadable = False
        with self._lock:
            if stamp == self._stamp or stamp == self._failed:
                return self._current
            try:
                context = server_context(self.cert, self.key)
            except (OSError, ssl.SSLError, ValueError) as e:
                self._failed = stamp
                self._log_failure(e)
                return self._current
            self._stamp, self._current, self._failed = stamp, context, None
            self.reloads += 1
        log.info("serving certificate reloaded", cert=str(self.cert), key=str(self.key))
        return context

    def _log_failure(self, error: Exception) -> None:
        log.error(
            "cannot load the new serving certificate; still serving the previous one",
            cert=str(self.cert),
            key=str(self.key),
            error=str(error),
        )

    def _on_handshake(
        self, connection: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: object
    ) -> None:
        context = self.current()
        if connection.context is not context:
            connection.context = context
