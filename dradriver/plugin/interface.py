"""The narrow interface between the plugin framework and a device driver."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it in NodePrepare/NodeUnprepare."""

    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass
class PrepareResult:
    """Devices prepared for one claim, or the error that says why not."""

    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""


@dataclass(frozen=True)
class DeviceHealth:
    pool: str
    device: str
    healthy: bool | None  # None: unknown
    message: str = ""


class DRADriver(Protocol):
    """What a node driver implements; the helper calls it from the gRPC handlers.

    Both calls must be idempotent: the kubelet repeats them after restarts,
    and may unprepare claims that were never prepared or are already gone.
    """

    async def prepare_claims(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        """Prepare each claim; key the result by claim UID. Never raise for one bad claim."""
        ...

    async def unprepare_claims(self, claims: list[ClaimRef]) -> dict[str, str]:
        """Unprepare each claim; map claim UID to an error message ("" for success)."""
        ...

    def handle_error(self, error: BaseException, context: str) -> None:
        """Report an error that happened outside a request (e.g. slice publishing)."""
        ...
