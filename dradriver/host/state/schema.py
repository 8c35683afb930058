"""The ledger's wire schema: entries, holds, holders and the errors of the ledger.

Invariants: every model is frozen and rejects unknown fields (``extra="forbid"``), so
what is read from disk is exactly what was written; a claim or a device-plugin hold
names each device use once; timestamps are ISO 8601 in UTC. The file envelope and its
checksum are :mod:`dradriver.host.state.codec`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

SUPPORTED_VERSION = 2

NonEmptyStr = Annotated[str, Field(min_length=1)]
ClaimState = Literal["preparing", "prepared", "unpreparing"]
HoldState = Literal["allocating", "allocated"]


# --- errors ------------------------------------------------------------------


class LedgerError(Exception):
    """Base class for ledger errors."""


class LedgerValueError(LedgerError, ValueError):
    """A request the ledger cannot record as given (bad input, not a conflict)."""


class LedgerVersionError(LedgerError):
    """The checkpoint was written by a newer dradriver; reading it could lose holds."""

    def __init__(self, path: Path, found: int) -> None:
        super().__init__(
            f"ledger {path} has format version {found}, but this dradriver supports only "
            f"version {SUPPORTED_VERSION}; it was written by a newer dradriver. Run a release "
            f"that understands version {found}, or, to downgrade, stop the plugin and move the "
            "file away so the ledger is rebuilt from the API server and the CDI directory"
        )
        self.path = path
        self.found = found
        self.supported = SUPPORTED_VERSION


class LedgerCorruptError(LedgerError):
    """The checkpoint cannot be trusted (bad JSON, checksum or schema)."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"ledger {path} is corrupt: {reason}")
        self.path = path
        self.reason = reason


class UnknownClaimError(LedgerError):
    """The claim has no ledger entry; the caller skipped begin_prepare or lost a race."""


class UnknownPluginHoldError(LedgerError):
    """The device-plugin container has no hold to complete."""


class ClaimStateError(LedgerError):
    """The claim's entry is in a state that does not allow the requested step."""


class ClaimMismatchError(LedgerError):
    """The claim is already recorded with different devices; it must be unprepared first."""


# --- data model --------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DeviceRef(_Model):
    """A device of this driver on this node; the driver is implicit (one ledger per driver)."""

    pool: NonEmptyStr
    device: NonEmptyStr

    def __str__(self) -> str:
        return f"{self.pool}/{self.device}"


class DeviceKey(NamedTuple):
    """Identifies one use of a device within a claim (shared devices may appear per share)."""

    pool: str
    device: str
    share_id: str | None = None


class ClaimDevice(_Model):
    """One allocated device of a claim and how the claim uses it."""

    pool: NonEmptyStr
    device: NonEmptyStr
    request_names: list[NonEmptyStr] = Field(default_factory=list)
    share_id: NonEmptyStr | None = None
    admin_access: bool = False
    # When omitted it is derived (see _default_exclusive); the default only informs typing.
    exclusive: bool = True
    cdi_ids: list[NonEmptyStr] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _default_exclusive(cls, data: Any) -> Any:
        # Kubernetes semantics: only a plain allocation takes the whole device.
        if isinstance(data, dict) and "exclusive" not in data:
            shared = data.get("share_id") is not None or data.get("admin_access") is True
            data = {**data, "exclusive": not shared}
        return data

    @model_validator(mode="after")
    def _check_exclusive(self) -> ClaimDevice:
        if self.exclusive and self.admin_access:
            raise ValueError("an admin-access use cannot be exclusive: it does not take the device")
        if self.exclusive and self.share_id is not None:
            raise ValueError("a use with a share_id is shared, so it cannot be exclusive")
        return self

    @property
    def ref(self) -> DeviceRef:
        return DeviceRef(pool=self.pool, device=self.device)

    @property
    def key(self) -> DeviceKey:
        return DeviceKey(self.pool, self.device, self.share_id)

    def same_use(self, other: ClaimDevice) -> bool:
        """Same device used the same way; CDI ids are outputs of prepare, not part of it."""
        return (
            self.key == other.key
            and sorted(self.request_names) == sorted(other.request_names)
            and self.admin_access == other.admin_access
            and self.exclusive == other.exclusive
        )


def _check_timestamp(value: str) -> str:
    try:
        datetime.fromisoformat(value)
    except ValueError as err:
        raise ValueError(f"not an ISO 8601 timestamp: {value!r}") from err
    return value


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


IsoTimestamp = Annotated[str, AfterValidator(_check_timestamp)]


class ClaimEntry(_Model):
    uid: NonEmptyStr
    namespace: NonEmptyStr
    name: NonEmptyStr
    state: ClaimState
    devices: list[ClaimDevice] = Field(default_factory=list)
    config_digest: str = ""
    updated: IsoTimestamp = Field(default_factory=now)
    # Rebuilt from a surviving CDI spec after the checkpoint was lost, before the API
    # server confirmed the allocation: the devices are what the spec names (a use of
    # unknown kind counts as exclusive) and config_digest is unknown. The next prepare
    # or start-up check records what the API server says instead.
    recovered: bool = False

    @model_validator(mode="after")
    def _unique_devices(self) -> ClaimEntry:
        keys = [d.key for d in self.devices]
        if len(set(keys)) != len(keys):
            raise ValueError(f"claim {self.uid} lists a device use twice: {keys}")
        return self

    @property
    def cdi_ids(self) -> list[str]:
        """All CDI ids of the claim, in device order, without repeats."""
        return list(dict.fromkeys(i for d in self.devices for i in d.cdi_ids))

    def describe(self) -> str:
        return f"claim {self.namespace}/{self.name} (uid {self.uid})"


class PluginHold(_Model):
    """Devices given to one container through the device-plugin API (always exclusive)."""

    resource: NonEmptyStr
    pod_uid: NonEmptyStr
    container: NonEmptyStr
    devices: list[DeviceRef] = Field(default_factory=list)
    state: HoldState
    updated: IsoTimestamp = Field(default_factory=now)

    @model_validator(mode="after")
    def _unique_devices(self) -> PluginHold:
        if len(set(self.devices)) != len(self.devices):
            raise ValueError(f"hold of pod {self.pod_uid} lists a device twice")
        return self

    @property
    def key(self) -> tuple[str, str]:
        return (self.pod_uid, self.container)

    def describe(self) -> str:
        return (
            f"device-plugin resource {self.resource} for pod {self.pod_uid} "
            f"container {self.container}"
        )


class LedgerData(_Model):
    claims: list[ClaimEntry] = Field(default_factory=list)
    plugin_holds: list[PluginHold] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_keys(self) -> LedgerData:
        uids = [c.uid for c in self.claims]
        if len(set(uids)) != len(uids):
            raise ValueError("a claim uid appears twice")
        holds = [h.key for h in self.plugin_holds]
        if len(set(holds)) != len(holds):
            raise ValueError("a device-plugin hold (pod uid, container) appears twice")
        return self


# --- holders -----------------------------------------------------------------


@dataclass(frozen=True)
class ClaimHolder:
    """One claim's use of a device, as reported by :meth:`Ledger.holders`."""

    uid: str
    namespace: str
    name: str
    state: ClaimState
    request_names: tuple[str, ...]
    share_id: str | None
    admin_access: bool
    exclusive: bool

    def describe(self) -> str:
        how = "admin access" if self.admin_access else "exclusive" if self.exclusive else "shared"
        if self.share_id is not None:
            how += f", share {self.share_id}"
        requests = ",".join(self.request_names) or "-"
        return (
            f"claim {self.namespace}/{self.name} (uid {self.uid}, request {requests}, "
            f"{how}, state {self.state})"
        )


@dataclass(frozen=True)
class PluginHolder:
    """One device-plugin container's hold of a device, as reported by :meth:`Ledger.holders`."""

    resource: str
    pod_uid: str
    container: str
    state: HoldState
    exclusive: bool = True
    admin_access: bool = False

    def describe(self) -> str:
        return (
            f"device-plugin resource {self.resource} for pod {self.pod_uid} "
            f"container {self.container} (exclusive, state {self.state})"
        )


Holder = ClaimHolder | PluginHolder


class DeviceBusy(LedgerError):
    """A requested device is taken; the message says by whom, so the operator can act."""

    def __init__(self, requester: str, conflicts: Sequence[tuple[DeviceRef, list[Holder]]]) -> None:
        parts = [
            f"device {ref} is held by " + "; ".join(h.describe() for h in holders)
            for ref, holders in conflicts
        ]
        super().__init__(f"cannot give devices to {requester}: " + " | ".join(parts))
        self.requester = requester
        self.conflicts = list(conflicts)
        self.device = conflicts[0][0]
        self.holders = conflicts[0][1]


# --- file handling -----------------------------------------------------------
