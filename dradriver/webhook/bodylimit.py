"""An ASGI middleware that refuses request bodies over a size limit with a plain 413.

Invariants:

* No more than ``limit`` bytes of a body (plus one chunk the server already read) are ever
  held: a ``Content-Length`` over the limit is answered before any of the body is read,
  and a body without a length (chunked) is counted as the app reads it and cut off at the
  first chunk that crosses the limit.
* The answer is ``413 Payload Too Large`` (text naming the limit). The connection is not
  closed at once (that resets it, and a client still sending loses the answer): the
  server discards, never keeps, what the client still sends until it stops or the
  keep-alive timeout (uvicorn's 5 s) closes the connection.
* Only HTTP requests are looked at; a response the app already started is never
  replaced (the app read the body after answering: the error propagates as usual).

The apiserver caps a stored object at about 1.5 MiB by default, so an AdmissionReview
(object and old object, JSON) that is worth validating fits well under the default
:data:`DEFAULT_MAX_BODY_BYTES`; anything larger is a client the webhook does not serve.
"""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dradriver.webhook.limits import DEFAULT_MAX_BODY_BYTES

__all__ = ["DEFAULT_MAX_BODY_BYTES", "BodyLimit"]


class _BodyTooLarge(Exception):
    """The body being read crossed the limit (raised from ``receive``)."""


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server refuses a malformed length itself
    return None


class BodyLimit:
    """Wraps ``app``: bodies over ``limit`` bytes get a 413 (see the module docstring)."""

    def __init__(self, app: ASGIApp, limit: int = DEFAULT_MAX_BODY_BYTES) -> None:
        if limit <= 0:
            raise ValueError(f"the body limit must be a positive number of bytes, got {limit}")
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _content_length(scope)
        if length is not None and length > self.limit:
            await self._refuse(send)
            return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise _BodyTooLarge(f"request body over {self.limit} bytes")
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _BodyTooLarge:
            if started:
                raise
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        text = (
            f"request body too large: at most {self.limit} bytes are accepted "
            "(an AdmissionReview of any object the apiserver stores fits)\n"
        ).encode()
        headers: list[tuple[bytes, Any]] = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(text)).encode()),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": text})
