"""The node ledger: who holds which device on this node, kept in a checkpoint file.

DRA claims and device-plugin containers draw from the same devices, and the
kubelet does not arbitrate between the two APIs. The ledger does: every hold
is recorded (and on disk) before the device is set up, so a device is never
handed out twice, and after a crash the plugin knows what it had started.

Entries are two-phase (``preparing`` -> ``prepared`` -> ``unpreparing``;
``allocating`` -> ``allocated``): an entry left in a first phase means the
work may be half done and must be finished or undone at reconciliation.

Conflict rules (Kubernetes semantics):
  * admin-access uses never conflict and never block: they do not take the device;
  * an exclusive use conflicts with every other non-admin use by another holder;
  * non-exclusive shared uses (consumable capacity, ``share_id`` set) coexist;
  * a device-plugin hold is always exclusive.

File format: ``{"version": 1, "checksum": "sha256:<hex>", "data": {...}}`` where
the checksum covers the canonical JSON of ``data`` (sorted keys, compact).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from dradriver.host.atomicfile import atomic_write, fsync_dir
from dradriver.log import get_logger

log = get_logger("ledger")

SUPPORTED_VERSION = 1
LEDGER_FILE_MODE = 0o600
LEDGER_DIR_MODE = 0o700

_CHECKSUM_RE = re.compile(r"sha256:[0-9a-f]{64}")

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


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


IsoTimestamp = Annotated[str, AfterValidator(_check_timestamp)]


class ClaimEntry(_Model):
    uid: NonEmptyStr
    namespace: NonEmptyStr
    name: NonEmptyStr
    state: ClaimState
    devices: list[ClaimDevice] = Field(default_factory=list)
    config_digest: str = ""
    updated: IsoTimestamp = Field(default_factory=_now)

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
    updated: IsoTimestamp = Field(default_factory=_now)

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


def checksum(data: Any) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _decode(path: Path, raw: bytes) -> LedgerData:
    try:
        doc = json.loads(raw)
    except ValueError as err:
        raise LedgerCorruptError(path, f"not valid JSON ({err})") from err
    if not isinstance(doc, dict):
        raise LedgerCorruptError(path, "top level is not an object")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise LedgerCorruptError(path, f"missing or invalid version {version!r}")
    # Checked before anything else: a newer format may lay out or hash data differently.
    if version > SUPPORTED_VERSION:
        raise LedgerVersionError(path, version)
    if set(doc) != {"version", "checksum", "data"}:
        raise LedgerCorruptError(
            path, f"expected keys version, checksum, data; found {', '.join(sorted(doc))}"
        )
    stated = doc["checksum"]
    if not isinstance(stated, str) or not _CHECKSUM_RE.fullmatch(stated):
        raise LedgerCorruptError(path, f"malformed checksum {stated!r}")
    actual = checksum(doc["data"])
    if stated != actual:
        raise LedgerCorruptError(path, f"checksum mismatch: file says {stated}, data is {actual}")
    try:
        return LedgerData.model_validate(doc["data"], strict=True)
    except ValidationError as err:
        raise LedgerCorruptError(path, f"schema violation: {err}") from err


def _quarantine(path: Path) -> Path:
    """Move a corrupt checkpoint aside (never delete it: it is evidence, maybe recoverable)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    kept = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 0
    while kept.exists():
        n += 1
        kept = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    os.rename(path, kept)
    fsync_dir(path.parent)
    return kept


# --- the ledger --------------------------------------------------------------


_Mode = Literal["exclusive", "shared", "admin"]


def _claim_mode(device: ClaimDevice) -> _Mode:
    if device.admin_access:
        return "admin"
    return "exclusive" if device.exclusive else "shared"


def _signature(path: Path) -> tuple[int, int, int] | None:
    """Identifies one version of the file (a rename gives a new inode)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class Ledger:
    """Holds of this driver's devices on this node; every change is on disk before it returns."""

    def __init__(self, path: Path, data: LedgerData | None = None) -> None:
        self.path = Path(path)
        data = data or LedgerData()
        self._claims: dict[str, ClaimEntry] = {c.uid: c for c in data.claims}
        self._holds: dict[tuple[str, str], PluginHold] = {h.key: h for h in data.plugin_holds}
        self._thread_lock = threading.Lock()
        self.recovered_from_corruption: Path | None = None
        self._seen = _signature(self.path)
        self._txn_thread: int | None = None  # the thread inside transaction(), if any
        self._txn_dirty = False

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Several changes, one write: the lock is taken once, the methods called inside
        change memory only, and the result is written (and fsynced) once at the end. If
        that write fails, memory is put back and every change of the block is lost
        together (the exception propagates), as if none had been made.
        """
        with self._lock():
            before = (self._claims, self._holds)
            self._txn_thread, self._txn_dirty = threading.get_ident(), False
            try:
                yield
                if self._txn_dirty:
                    self._write(self._claims, self._holds)
            except BaseException:
                self._claims, self._holds = before
                raise
            finally:
                self._txn_thread, self._txn_dirty = None, False

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """Exclusive access across threads and processes, with the latest state loaded.

        During a rolling update two plugin processes share this ledger: an flock
        on a side file serialises them, and a changed file is re-read first.
        """
        if self._txn_thread == threading.get_ident():
            yield  # inside transaction(): already locked and loaded
            return
        with self._thread_lock:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=LEDGER_DIR_MODE)
            fd = os.open(
                self.path.with_name(self.path.name + ".lock"),
                os.O_RDWR | os.O_CREAT,
                LEDGER_FILE_MODE,
            )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                current = _signature(self.path)
                if current != self._seen:
                    self._reload()
                yield
            finally:
                os.close(fd)

    def _reload(self) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            self._claims, self._holds = {}, {}
        else:
            try:
                data = _decode(self.path, raw)
            except LedgerCorruptError as err:
                raise LedgerError(
                    f"ledger {self.path} changed on disk and is now unreadable: {err.reason}; "
                    "restart the plugin to recover"
                ) from err
            self._claims = {c.uid: c for c in data.claims}
            self._holds = {h.key: h for h in data.plugin_holds}
        self._seen = _signature(self.path)

    @classmethod
    def load(cls, path: Path | str) -> Ledger:
        """Read the checkpoint; a corrupt one is kept aside and replaced by an empty ledger.

        After a corruption the caller must reconcile (API server, pod-resources,
        CDI dir): ``recovered_from_corruption`` then names the kept copy.
        """
        path = Path(path)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return cls(path)
        try:
            data = _decode(path, raw)
        except LedgerCorruptError as err:
            kept = _quarantine(path)
            log.error(
                "ledger checkpoint is corrupt; kept a copy and starting empty, reconcile needed",
                path=str(path),
                reason=err.reason,
                kept=str(kept),
            )
            ledger = cls(path)
            ledger.recovered_from_corruption = kept
            return ledger
        return cls(path, data)

    # --- persistence -----------------------------------------------------------

    def _snapshot(
        self, claims: Mapping[str, ClaimEntry], holds: Mapping[tuple[str, str], PluginHold]
    ) -> LedgerData:
        return LedgerData(
            claims=[claims[k] for k in sorted(claims)],
            plugin_holds=[holds[k] for k in sorted(holds)],
        )

    def _commit(
        self, claims: dict[str, ClaimEntry], holds: dict[tuple[str, str], PluginHold]
    ) -> None:
        """Write first, then switch memory: a failed write leaves both as they were.

        Inside :meth:`transaction` only memory changes; the transaction writes once.
        """
        if self._txn_thread == threading.get_ident():
            self._claims, self._holds = claims, holds
            self._txn_dirty = True
            return
        self._write(claims, holds)

    def _write(
        self, claims: dict[str, ClaimEntry], holds: dict[tuple[str, str], PluginHold]
    ) -> None:
        payload = self._snapshot(claims, holds).model_dump(mode="json")
        doc = {"version": SUPPORTED_VERSION, "checksum": checksum(payload), "data": payload}
        directory = self.path.parent
        if not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
            os.chmod(directory, LEDGER_DIR_MODE)
        # Compact on purpose: an indented dump takes the slow pure-Python encoder, and
        # the ledger is rewritten on every prepare and unprepare (`jq .` reads it).
        text = json.dumps(doc, separators=(",", ":"))
        atomic_write(self.path, (text + "\n").encode(), LEDGER_FILE_MODE)
        self._claims, self._holds = claims, holds
        self._seen = _signature(self.path)

    def data(self) -> LedgerData:
        with self._lock():
            return self._snapshot(self._claims, self._holds).model_copy(deep=True)

    # --- conflicts -------------------------------------------------------------

    def _uses(self) -> Iterable[tuple[DeviceRef, _Mode, tuple[str, ...], Holder]]:
        for c in self._claims.values():
            for d in c.devices:
                holder = ClaimHolder(
                    uid=c.uid,
                    namespace=c.namespace,
                    name=c.name,
                    state=c.state,
                    request_names=tuple(d.request_names),
                    share_id=d.share_id,
                    admin_access=d.admin_access,
                    exclusive=d.exclusive,
                )
                yield d.ref, _claim_mode(d), ("claim", c.uid), holder
        for h in self._holds.values():
            plugin = PluginHolder(
                resource=h.resource, pod_uid=h.pod_uid, container=h.container, state=h.state
            )
            for ref in h.devices:
                yield ref, "exclusive", ("plugin", h.pod_uid, h.container), plugin

    def _conflicts(
        self, wanted: Iterable[tuple[DeviceRef, _Mode]], me: tuple[str, ...]
    ) -> list[tuple[DeviceRef, list[Holder]]]:
        uses = list(self._uses())
        found: dict[DeviceRef, list[Holder]] = {}
        for ref, mode in wanted:
            if mode == "admin":
                continue
            for other_ref, other_mode, owner, holder in uses:
                if other_ref != ref or owner == me or other_mode == "admin":
                    continue
                if mode == "exclusive" or other_mode == "exclusive":
                    bucket = found.setdefault(ref, [])
                    if holder not in bucket:
                        bucket.append(holder)
        return list(found.items())

    def holders(self, pool: str, device: str) -> list[Holder]:
        """Every use of the device, admin access included."""
        ref = DeviceRef(pool=pool, device=device)
        with self._lock():
            return [h for r, _, _, h in self._uses() if r == ref]

    def held_devices(self, include_shared: bool = False) -> set[tuple[str, str]]:
        """Devices taken exclusively (plus shared ones if asked): hide these from the other API."""
        wanted: set[_Mode] = {"exclusive", "shared"} if include_shared else {"exclusive"}
        with self._lock():
            return {(r.pool, r.device) for r, mode, _, _ in self._uses() if mode in wanted}

    # --- claims ----------------------------------------------------------------

    def claims(self) -> list[ClaimEntry]:
        with self._lock():
            return [self._claims[k].model_copy(deep=True) for k in sorted(self._claims)]

    def get_claim(self, uid: str) -> ClaimEntry | None:
        with self._lock():
            entry = self._claims.get(uid)
            return entry.model_copy(deep=True) if entry else None

    def begin_prepare(
        self,
        uid: str,
        namespace: str,
        name: str,
        devices: Sequence[ClaimDevice],
        config_digest: str = "",
    ) -> ClaimEntry:
        """Record that the claim's devices are being set up; refuse a device someone else holds.

        Returns the entry: state ``prepared`` means nothing is left to do (a
        repeated call), ``preparing`` means set the devices up, then call
        :meth:`complete_prepare`.
        """
        try:
            entry = ClaimEntry(
                uid=uid,
                namespace=namespace,
                name=name,
                state="preparing",
                devices=list(devices),
                config_digest=config_digest,
            )
        except ValidationError as err:
            raise LedgerValueError(f"invalid claim {namespace}/{name} (uid {uid}): {err}") from err
        with self._lock():
            existing = self._claims.get(uid)
            if existing is not None:
                self._check_same_claim(existing, entry)
                if existing.state != "unpreparing" and existing.config_digest == config_digest:
                    return existing.model_copy(deep=True)
            conflicts = self._conflicts(
                ((d.ref, _claim_mode(d)) for d in entry.devices), ("claim", uid)
            )
            if conflicts:
                raise DeviceBusy(entry.describe(), conflicts)
            self._commit({**self._claims, uid: entry}, self._holds)
            log.info(
                "claim preparing",
                claim=f"{namespace}/{name}",
                uid=uid,
                devices=",".join(str(d.ref) for d in entry.devices),
            )
            return entry.model_copy(deep=True)

    @staticmethod
    def _check_same_claim(existing: ClaimEntry, new: ClaimEntry) -> None:
        same_devices = len(existing.devices) == len(new.devices) and all(
            any(a.same_use(b) for b in existing.devices) for a in new.devices
        )
        if (existing.namespace, existing.name) != (new.namespace, new.name) or not same_devices:
            had = ", ".join(f"{d.ref}" for d in existing.devices) or "none"
            wants = ", ".join(f"{d.ref}" for d in new.devices) or "none"
            raise ClaimMismatchError(
                f"{existing.describe()} is already recorded (state {existing.state}) with "
                f"devices [{had}]; asked for {new.namespace}/{new.name} with [{wants}]. "
                "Unprepare it before preparing a different allocation"
            )

    def complete_prepare(
        self, uid: str, cdi_ids: Mapping[DeviceKey, Sequence[str]] | None = None
    ) -> ClaimEntry:
        """Mark the claim prepared, recording the CDI ids returned for each device use.

        Keys are ``DeviceKey(pool, device, share_id)`` (``ClaimDevice.key``);
        devices not in ``cdi_ids`` keep what they had.
        """
        cdi_ids = cdi_ids or {}
        with self._lock():
            entry = self._claims.get(uid)
            if entry is None:
                raise UnknownClaimError(
                    f"claim uid {uid} is not in the ledger; begin_prepare first"
                )
            if entry.state == "unpreparing":
                raise ClaimStateError(
                    f"{entry.describe()} is being unprepared; it cannot complete a prepare"
                )
            keys = {DeviceKey(*k) for k in cdi_ids}
            unknown = keys - {d.key for d in entry.devices}
            if unknown:
                raise LedgerValueError(
                    f"{entry.describe()} has no device use {sorted(unknown, key=str)}"
                )
            try:
                devices = [
                    ClaimDevice(**{**d.model_dump(), "cdi_ids": list(cdi_ids[d.key])})
                    if d.key in cdi_ids
                    else d
                    for d in entry.devices
                ]
            except ValidationError as err:
                raise LedgerValueError(f"invalid CDI ids for {entry.describe()}: {err}") from err
            done = entry.model_copy(
                update={"state": "prepared", "devices": devices, "updated": _now()}
            )
            self._commit({**self._claims, uid: done}, self._holds)
            log.info("claim prepared", claim=f"{entry.namespace}/{entry.name}", uid=uid)
            return done.model_copy(deep=True)

    def begin_unprepare(self, uid: str) -> ClaimEntry | None:
        """Mark teardown as started; the devices stay held until :meth:`remove_claim`."""
        with self._lock():
            entry = self._claims.get(uid)
            if entry is None:
                return None
            if entry.state != "unpreparing":
                entry = entry.model_copy(update={"state": "unpreparing", "updated": _now()})
                self._commit({**self._claims, uid: entry}, self._holds)
                log.info("claim unpreparing", claim=f"{entry.namespace}/{entry.name}", uid=uid)
            return entry.model_copy(deep=True)

    def remove_claim(self, uid: str) -> None:
        with self._lock():
            entry = self._claims.get(uid)
            if entry is None:
                return
            self._commit({k: v for k, v in self._claims.items() if k != uid}, self._holds)
            log.info("claim removed", claim=f"{entry.namespace}/{entry.name}", uid=uid)

    # --- device-plugin holds ---------------------------------------------------

    def plugin_holds(self) -> list[PluginHold]:
        with self._lock():
            return [self._holds[k].model_copy(deep=True) for k in sorted(self._holds)]

    def get_plugin_hold(self, pod_uid: str, container: str) -> PluginHold | None:
        with self._lock():
            hold = self._holds.get((pod_uid, container))
            return hold.model_copy(deep=True) if hold else None

    def begin_plugin_hold(
        self, resource: str, pod_uid: str, container: str, devices: Sequence[DeviceRef]
    ) -> PluginHold:
        """Record a device-plugin allocation before answering the kubelet.

        A repeat with the same devices returns the existing hold; different
        devices replace it (the device-plugin API has no release, so the latest
        allocation for a container is the one that counts).
        """
        try:
            hold = PluginHold(
                resource=resource,
                pod_uid=pod_uid,
                container=container,
                devices=list(devices),
                state="allocating",
            )
        except ValidationError as err:
            raise LedgerValueError(
                f"invalid device-plugin hold for pod {pod_uid} container {container}: {err}"
            ) from err
        with self._lock():
            existing = self._holds.get(hold.key)
            if (
                existing is not None
                and existing.resource == resource
                and set(existing.devices) == set(hold.devices)
            ):
                return existing.model_copy(deep=True)
            conflicts = self._conflicts(
                ((ref, "exclusive") for ref in hold.devices), ("plugin", pod_uid, container)
            )
            if conflicts:
                raise DeviceBusy(hold.describe(), conflicts)
            self._commit(self._claims, {**self._holds, hold.key: hold})
            log.info(
                "device-plugin hold allocating",
                resource=resource,
                pod=pod_uid,
                container=container,
                devices=",".join(str(r) for r in hold.devices),
            )
            return hold.model_copy(deep=True)

    def complete_plugin_hold(self, pod_uid: str, container: str) -> PluginHold:
        with self._lock():
            hold = self._holds.get((pod_uid, container))
            if hold is None:
                raise UnknownPluginHoldError(
                    f"no device-plugin hold for pod {pod_uid} container {container}; "
                    "begin_plugin_hold first"
                )
            if hold.state != "allocated":
                hold = hold.model_copy(update={"state": "allocated", "updated": _now()})
                self._commit(self._claims, {**self._holds, hold.key: hold})
                log.info("device-plugin hold allocated", pod=pod_uid, container=container)
            return hold.model_copy(deep=True)

    def release_plugin_hold(self, pod_uid: str, container: str) -> None:
        with self._lock():
            key = (pod_uid, container)
            if key not in self._holds:
                return
            self._commit(self._claims, {k: v for k, v in self._holds.items() if k != key})
            log.info("device-plugin hold released", pod=pod_uid, container=container)
