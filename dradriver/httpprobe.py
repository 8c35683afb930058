"""An exec probe for an HTTP endpoint on a unix socket: ``python -m dradriver.httpprobe``.

    python -m dradriver.httpprobe unix:/run/dradriver/http.sock /readyz

Exit 0 when the answer is 2xx, 1 otherwise (the body's first line on stderr, which the
kubelet records in the probe's event). The kubelet's httpGet probes need a TCP port; a
pod in the host's network namespace serves its endpoint on a socket instead (see
:class:`dradriver.httpserver.HTTPEndpoint`). Standard library only: it runs every probe
period, so it imports nothing else.
"""

from __future__ import annotations

import http.client
import socket
import sys
from collections.abc import Sequence

TIMEOUT_SECONDS = 5.0
MAX_BODY = 4096


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def probe(address: str, path: str, timeout: float = TIMEOUT_SECONDS) -> tuple[bool, str]:
    """(2xx?, first line of the body or the error)."""
    if not address.startswith("unix:/") or not path.startswith("/"):
        return False, f"usage: unix:/SOCKET /PATH, not {address!r} {path!r}"
    connection = _UnixConnection(address.removeprefix("unix:"), timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read(MAX_BODY).decode(errors="replace")
    except OSError as e:
        return False, f"{address}{path}: {e}"
    finally:
        connection.close()
    first = body.splitlines()[0] if body else ""
    return 200 <= response.status < 300, f"{response.status} {first}"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m dradriver.httpprobe unix:/SOCKET /PATH", file=sys.stderr)
        return 2
    ok, detail = probe(args[0], args[1])
    print(detail, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
