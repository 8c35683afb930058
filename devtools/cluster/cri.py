"""A small client of the CRI runtime service (``runtime.v1``) over its unix socket.

The local cluster needs three calls of it, at teardown: list the pod sandboxes
the kubelet left running (it does not stop them when it exits), stop and remove
each, so that containerd unwinds them itself (containers, CNI DEL, netns, shm
mounts) before it is stopped; plus ``Status`` to see that the runtime and its
network are ready. Generating stubs from the 2,000-line ``api.proto`` for that
would be most of the code, so the few messages are encoded here by hand, with
the field numbers of ``k8s.io/cri-api`` v0.36.3 ``pkg/apis/runtime/v1/api.proto``
(proto3: unknown fields in answers are skipped, as any protobuf decoder does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import grpc

SERVICE = "/runtime.v1.RuntimeService"
# Wire types (protobuf encoding): varint, 64-bit, length-delimited, 32-bit.
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5

Fields = dict[int, list[int | bytes]]


class CRIError(RuntimeError):
    """A CRI call failed; the message names the call and the runtime's answer."""


# --- protobuf wire format (the subset these messages use) ------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_string(number: int, value: str) -> bytes:
    """One length-delimited field (a string or an embedded message's bytes)."""
    data = value.encode()
    return _varint(number << 3 | _LEN) + _varint(len(data)) + data


def decode(data: bytes) -> Fields:
    """Every field of one message, by number, in order; varints as int, the rest as bytes."""
    fields: Fields = {}
    pos = 0

    def varint() -> int:
        nonlocal pos
        shift = result = 0
        while True:
            if pos >= len(data):
                raise CRIError("truncated varint in a CRI answer")
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7

    while pos < len(data):
        key = varint()
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == _VARINT:
            value = varint()
        elif wire == _LEN:
            size = varint()
            value, pos = data[pos : pos + size], pos + size
        elif wire in (_I64, _I32):
            width = 8 if wire == _I64 else 4
            value, pos = data[pos : pos + width], pos + width
        else:
            raise CRIError(f"unsupported protobuf wire type {wire} in a CRI answer")
        fields.setdefault(number, []).append(value)
    return fields


def _string(fields: Fields, number: int) -> str:
    values = fields.get(number) or [b""]
    value = values[-1]
    return value.decode() if isinstance(value, bytes) else str(value)


def _int(fields: Fields, number: int) -> int:
    values = fields.get(number) or [0]
    value = values[-1]
    return value if isinstance(value, int) else 0


def _messages(fields: Fields, number: int) -> list[Fields]:
    return [decode(v) for v in fields.get(number, []) if isinstance(v, bytes)]


# --- the messages ------------------------------------------------------------------


@dataclass(frozen=True)
class PodSandbox:
    """``runtime.v1.PodSandbox``: id 1, metadata 2 (name 1, uid 2, namespace 3), state 3."""

    id: str
    name: str
    namespace: str
    uid: str
    ready: bool  # state SANDBOX_READY (0) rather than SANDBOX_NOTREADY (1)

    @classmethod
    def decode(cls, fields: Fields) -> PodSandbox:
        metadata = (_messages(fields, 2) or [{}])[0]
        return cls(
            id=_string(fields, 1),
            name=_string(metadata, 1),
            uid=_string(metadata, 2),
            namespace=_string(metadata, 3),
            ready=_int(fields, 3) == 0,
        )


@dataclass(frozen=True)
class RuntimeCondition:
    """``runtime.v1.RuntimeCondition``: type 1, status 2, reason 3, message 4."""

    type: str
    status: bool
    reason: str
    message: str


class CRIClient:
    """Blocking calls of the CRI runtime service on ``socket``."""

    def __init__(self, socket: Path, timeout: float = 30.0) -> None:
        self.socket = socket
        self.timeout = timeout
        self._channel = grpc.insecure_channel(f"unix://{socket}")

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> CRIClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _call(self, method: str, request: bytes) -> Fields:
        identity: Callable[[bytes], bytes] = bytes
        stub = self._channel.unary_unary(
            f"{SERVICE}/{method}", request_serializer=identity, response_deserializer=identity
        )
        try:
            answer: bytes = stub(request, timeout=self.timeout)
        except grpc.RpcError as e:
            code = e.code() if isinstance(e, grpc.Call) else None
            details = e.details() if isinstance(e, grpc.Call) else str(e)
            raise CRIError(f"CRI {method} on {self.socket} failed ({code}): {details}") from e
        return decode(answer)

    def status(self) -> list[RuntimeCondition]:
        """``Status``: the runtime's conditions (RuntimeReady, NetworkReady, ...)."""
        answer = self._call("Status", b"")
        runtime_status = (_messages(answer, 1) or [{}])[0]
        return [
            RuntimeCondition(
                type=_string(c, 1),
                status=bool(_int(c, 2)),
                reason=_string(c, 3),
                message=_string(c, 4),
            )
            for c in _messages(runtime_status, 1)
        ]

    def list_pod_sandboxes(self) -> list[PodSandbox]:
        """``ListPodSandbox`` without a filter: every sandbox, ready or not."""
        return [PodSandbox.decode(item) for item in _messages(self._call("ListPodSandbox", b""), 1)]

    def stop_pod_sandbox(self, sandbox_id: str) -> None:
        """``StopPodSandbox``: kill its containers, tear down its network (CNI DEL)."""
        self._call("StopPodSandbox", encode_string(1, sandbox_id))

    def remove_pod_sandbox(self, sandbox_id: str) -> None:
        """``RemovePodSandbox``: delete its containers and everything kept for it."""
        self._call("RemovePodSandbox", encode_string(1, sandbox_id))

    def remove_all_pod_sandboxes(self) -> list[PodSandbox]:
        """Stop and remove every sandbox (``crictl rmp -af``); returns those removed."""
        sandboxes = self.list_pod_sandboxes()
        for sandbox in sandboxes:
            self.stop_pod_sandbox(sandbox.id)
            self.remove_pod_sandbox(sandbox.id)
        return sandboxes


__all__ = ["CRIClient", "CRIError", "PodSandbox", "RuntimeCondition"]
