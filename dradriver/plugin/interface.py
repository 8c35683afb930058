"""The narrow interface between the plugin framework and a device driver."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol

from dradriver.k8s.names import (
    DNS_LABEL_MAX_LENGTH,
    DNS_LABEL_RE,
    DNS_SUBDOMAIN_MAX_LENGTH,
    DNS_SUBDOMAIN_RE,
)
from dradriver.k8s.objects import Obj

# Kubernetes UIDs are UUIDs. A claim UID also names files (CDI specs, lock files):
# letters, digits, '-' and '.', starting and ending with a letter or digit, so it can
# never be a path, start with '.', or swallow a separator.
_CLAIM_UID = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,126}[A-Za-z0-9])?")


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it in NodePrepare/NodeUnprepare."""

    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def claim_uid_problem(uid: str) -> str | None:
    """Why ``uid`` cannot be a claim UID, or None if it can."""
    if not _CLAIM_UID.fullmatch(uid):
        return (
            f"claim uid {uid!r} is not a valid UID (letters, digits, '-' and '.', at most 128, "
            "starting and ending with a letter or digit)"
        )
    return None


def claim_ref_problem(claim: ClaimRef) -> str | None:
    """Why the kubelet's reference cannot name a claim, or None if it can.

    The namespace is a DNS label and the name a DNS subdomain, as the apiserver requires.
    """
    problem = claim_uid_problem(claim.uid)
    if problem:
        return problem
    namespace, name = claim.namespace, claim.name
    if len(namespace) > DNS_LABEL_MAX_LENGTH or not DNS_LABEL_RE.fullmatch(namespace):
        return f"claim namespace {namespace!r} is not a valid namespace name"
    if len(name) > DNS_SUBDOMAIN_MAX_LENGTH or not DNS_SUBDOMAIN_RE.fullmatch(name):
        return f"claim name {name!r} is not a valid object name"
    return None


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


class ClaimDriver(Protocol):
    """What a driver author implements: one claim, already fetched and locked.

    :class:`dradriver.plugin.claims.ClaimRunner` turns it into a :class:`DRADriver`:
    it validates the kubelet's reference, holds the claim's lock, and passes the claim
    as the API server has it under the UID the kubelet named. Both calls must be
    idempotent (the kubelet repeats them, and unprepares claims that are gone).
    """

    async def prepare(self, claim: ClaimRef, obj: Obj) -> PrepareResult:
        """Prepare the claim; a failure is ``PrepareResult(error=...)`` (an exception is
        answered as an internal error)."""
        ...

    async def unprepare(self, claim: ClaimRef) -> str:
        """Unprepare the claim (also one never prepared here); "" or the error."""
        ...

    def handle_error(self, error: BaseException, context: str) -> None:
        """Report an error that happened outside a request (e.g. slice publishing)."""
        ...


class DRADriver(Protocol):
    """What the helper calls from the gRPC handlers: the kubelet's batches of claims.

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
