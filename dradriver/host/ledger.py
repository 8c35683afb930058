"""The node ledger: who holds which device on this node, kept in a checkpoint file.

Invariants (everything below serves these):
  * every hold is recorded, and on disk (fsynced file and directory, atomic
    rename), before the device is set up or handed out, so after a crash the
    plugin knows what it had started;
  * no two holds conflict (rules below): a device is never handed out twice;
  * a claim's CDI spec is not a hold: it names the claim UID, so no container can use
    it before the kubelet has the answer. Where no hook runs, a prepare writes the spec
    first and records the claim as prepared in one write (:meth:`Ledger.record_prepared`),
    and an unprepare removes the spec before the entry. A crash between the two leaves
    a spec without an entry (start-up adopts its claim if it is still allocated here,
    else deletes the spec) or a prepared entry without a spec (start-up writes it again
    or tears the claim down), never a hold that is not on disk;
  * a checkpoint that is missing or cannot be trusted is never read as "nothing
    is held": :meth:`Ledger.load` keeps a corrupt file aside and reports
    ``needs_rebuild``, and the caller rebuilds the holds from what survives
    (CDI specs, the API server, the kubelet's pod-resources) before it serves;
  * a checkpoint written by a newer dradriver is refused, never rewritten.

DRA claims and device-plugin containers draw from the same devices, and the
kubelet does not arbitrate between the two APIs: this ledger does.

Entries are two-phase (``preparing`` -> ``prepared`` -> ``unpreparing``;
``allocating`` -> ``allocated``) where a hook changes the node: an entry left in a
first phase means the work may be half done and must be finished or undone at
reconciliation. A claim no hook works on goes straight to ``prepared`` and is
removed straight from it (one durable write each way).

Conflict rules (Kubernetes semantics):
  * admin-access uses never conflict and never block: they do not take the device;
  * an exclusive use conflicts with every other non-admin use by another holder;
  * non-exclusive shared uses (consumable capacity, ``share_id`` set) coexist;
  * a device-plugin hold is always exclusive.

File format, the same envelope in every version:
``{"version": N, "checksum": "sha256:<hex>", "data": {...}}``. From version 2 on
the checksum covers the version too (the SHA-256 of the canonical JSON of
``{"version": N, "data": data}``, sorted keys, compact), so a flipped version
reads as corruption rather than as a file from a newer dradriver; a newer
version is recognised by that same rule. Version 1 (checksum of ``data``
alone) is read and migrated (:data:`_MIGRATIONS`); the next write is version 2.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import stat
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from dradriver.host.atomicfile import atomic_write, fsync_dir
from dradriver.log import get_logger

log = get_logger("ledger")

SUPPORTED_VERSION = 2
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


def envelope_checksum(version: int, data: Any) -> str:
    """The checksum of a version 2 (or later) file: it covers the version as well."""
    return checksum({"version": version, "data": data})


def _stated_checksum(version: int, data: Any) -> str:
    return checksum(data) if version == 1 else envelope_checksum(version, data)


# Version N -> a function turning version N data into version N+1 data. Version 2
# changed only the checksum and added ClaimEntry.recovered (default false).
_MIGRATIONS: dict[int, Callable[[Any], Any]] = {1: lambda data: data}


def _read_checkpoint(path: Path) -> bytes | None:
    """The checkpoint's bytes, or None if there is none.

    Raises LedgerCorruptError for anything at the path that is not a readable
    regular file: a directory, a FIFO (opened non-blocking, so a FIFO without a
    writer never stalls the start), a socket, a dangling symlink or a symlink loop.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        if os.path.lexists(path):
            raise LedgerCorruptError(path, "a symlink to a file that does not exist") from None
        return None
    except OSError as err:
        raise LedgerCorruptError(path, f"cannot be opened: {err.strerror}") from err
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else ""
            raise LedgerCorruptError(path, f"is {kind or 'not a regular file'}")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as err:
        raise LedgerCorruptError(path, f"cannot be read: {err.strerror}") from err
    finally:
        os.close(fd)


def _decode(path: Path, raw: bytes) -> LedgerData:
    try:
        return _decode_document(path, raw)
    except RecursionError as err:
        raise LedgerCorruptError(path, "nested too deeply to be a ledger") from err


def _decode_document(path: Path, raw: bytes) -> LedgerData:
    try:
        doc = json.loads(raw)
    except ValueError as err:
        raise LedgerCorruptError(path, f"not valid JSON ({err})") from err
    if not isinstance(doc, dict):
        raise LedgerCorruptError(path, "top level is not an object")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise LedgerCorruptError(path, f"missing or invalid version {version!r}")
    if set(doc) != {"version", "checksum", "data"}:
        raise LedgerCorruptError(
            path, f"expected keys version, checksum, data; found {', '.join(sorted(doc))}"
        )
    stated = doc["checksum"]
    if not isinstance(stated, str) or not _CHECKSUM_RE.fullmatch(stated):
        raise LedgerCorruptError(path, f"malformed checksum {stated!r}")
    actual = _stated_checksum(version, doc["data"])
    if stated != actual:
        newer = " (it claims a newer version, but its checksum says otherwise)"
        raise LedgerCorruptError(
            path,
            f"checksum mismatch: file says {stated}, data is {actual}"
            + (newer if version > SUPPORTED_VERSION else ""),
        )
    # Checked after the checksum: the envelope is the same in every version, so a
    # genuine newer file passes it and a flipped version number does not.
    if version > SUPPORTED_VERSION:
        raise LedgerVersionError(path, version)
    data = doc["data"]
    for step in range(version, SUPPORTED_VERSION):
        data = _MIGRATIONS[step](data)
    try:
        return LedgerData.model_validate(data, strict=True)
    except ValidationError as err:
        raise LedgerCorruptError(path, f"schema violation: {err}") from err


def _quarantine(path: Path) -> Path:
    """Move a bad checkpoint aside (never delete it: it is evidence, maybe recoverable)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    kept = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 0
    while os.path.lexists(kept):
        n += 1
        kept = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    os.rename(path, kept)
    fsync_dir(path.parent)
    return kept


# --- the ledger --------------------------------------------------------------


_Mode = Literal["exclusive", "shared", "admin"]
_Owner = tuple[str, ...]  # ("claim", uid) or ("plugin", pod uid, container)


def _claim_mode(device: ClaimDevice) -> _Mode:
    if device.admin_access:
        return "admin"
    return "exclusive" if device.exclusive else "shared"


@dataclass(frozen=True)
class _Use:
    mode: _Mode
    holder: Holder


class _Holds:
    """Claims and device-plugin holds, indexed by device.

    The index makes a conflict check cost the uses of the devices asked for, not
    the whole ledger, so a transaction of n changes is O(n), not O(n^2).
    """

    def __init__(self, data: LedgerData) -> None:
        self.claims: dict[str, ClaimEntry] = {}
        self.plugin: dict[tuple[str, str], PluginHold] = {}
        self.by_device: dict[DeviceRef, dict[_Owner, list[_Use]]] = {}
        for c in data.claims:
            self.set_claim(c.uid, c)
        for h in data.plugin_holds:
            self.set_hold(h.key, h)

    def snapshot(self) -> LedgerData:
        return LedgerData(
            claims=[self.claims[k] for k in sorted(self.claims)],
            plugin_holds=[self.plugin[k] for k in sorted(self.plugin)],
        )

    def _unindex(self, owner: _Owner, refs: Iterable[DeviceRef]) -> None:
        for ref in refs:
            owners = self.by_device.get(ref)
            if owners is not None:
                owners.pop(owner, None)
                if not owners:
                    del self.by_device[ref]

    def _index(self, owner: _Owner, ref: DeviceRef, use: _Use) -> None:
        self.by_device.setdefault(ref, {}).setdefault(owner, []).append(use)

    def set_claim(self, uid: str, entry: ClaimEntry | None) -> ClaimEntry | None:
        """Replace (or with None remove) the claim's entry; returns the one it had."""
        owner = ("claim", uid)
        old = self.claims.pop(uid, None)
        if old is not None:
            self._unindex(owner, (d.ref for d in old.devices))
        if entry is not None:
            self.claims[uid] = entry
            for d in entry.devices:
                holder = ClaimHolder(
                    uid=entry.uid,
                    namespace=entry.namespace,
                    name=entry.name,
                    state=entry.state,
                    request_names=tuple(d.request_names),
                    share_id=d.share_id,
                    admin_access=d.admin_access,
                    exclusive=d.exclusive,
                )
                self._index(owner, d.ref, _Use(_claim_mode(d), holder))
        return old

    def set_hold(self, key: tuple[str, str], hold: PluginHold | None) -> PluginHold | None:
        owner = ("plugin", *key)
        old = self.plugin.pop(key, None)
        if old is not None:
            self._unindex(owner, old.devices)
        if hold is not None:
            self.plugin[key] = hold
            holder = PluginHolder(
                resource=hold.resource,
                pod_uid=hold.pod_uid,
                container=hold.container,
                state=hold.state,
            )
            for ref in hold.devices:
                self._index(owner, ref, _Use("exclusive", holder))
        return old

    def conflicts(
        self, wanted: Iterable[tuple[DeviceRef, _Mode]], me: _Owner
    ) -> list[tuple[DeviceRef, list[Holder]]]:
        found: dict[DeviceRef, list[Holder]] = {}
        for ref, mode in wanted:
            if mode == "admin":
                continue
            for owner, uses in self.by_device.get(ref, {}).items():
                if owner == me:
                    continue
                for use in uses:
                    if use.mode == "admin":
                        continue
                    if mode == "exclusive" or use.mode == "exclusive":
                        bucket = found.setdefault(ref, [])
                        if use.holder not in bucket:
                            bucket.append(use.holder)
        return list(found.items())


def _signature(path: Path) -> tuple[int, int, int] | None:
    """Identifies one version of the file (a rename gives a new inode)."""
    try:
        st = os.stat(path)
    except OSError:  # missing, or something load() will refuse (a symlink loop)
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class Ledger:
    """Holds of this driver's devices on this node; every change is on disk before it returns."""

    def __init__(self, path: Path, data: LedgerData | None = None) -> None:
        self.path = Path(path)
        self._state = _Holds(data or LedgerData())
        self._thread_lock = threading.Lock()
        self.recovered_from_corruption: Path | None = None
        # Why load() found nothing to trust ("missing", "corrupt: ..."), or None.
        self.rebuild_reason: str | None = None
        self._seen = _signature(self.path)
        self._txn_thread: int | None = None  # the thread inside transaction(), if any
        self._txn_undo: list[Callable[[], object]] = []

    @property
    def needs_rebuild(self) -> bool:
        """The checkpoint was missing or corrupt at load: holds must be rebuilt before serving."""
        return self.rebuild_reason is not None

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Several changes, one write: the lock is taken once, the methods called inside
        change memory only, and the result is written (and fsynced) once at the end. If
        that write fails, memory is put back and every change of the block is lost
        together (the exception propagates), as if none had been made.
        """
        with self._lock():
            self._txn_thread, self._txn_undo = threading.get_ident(), []
            try:
                yield
                if self._txn_undo:
                    self._write()
            except BaseException:
                for undo in reversed(self._txn_undo):
                    undo()
                raise
            finally:
                self._txn_thread, self._txn_undo = None, []

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
                os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
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
            raw = _read_checkpoint(self.path)
            if raw is None:
                # Deleted under a running plugin: what is in memory is still true, and
                # forgetting it would hand held devices out again. Put it back.
                log.error("ledger file vanished; writing it again from memory", path=str(self.path))
                self._write()
                return
            data = _decode(self.path, raw)
        except LedgerCorruptError as err:
            raise LedgerError(
                f"ledger {self.path} changed on disk and is now unreadable: {err.reason}; "
                "restart the plugin to recover"
            ) from err
        self._state = _Holds(data)
        self._seen = _signature(self.path)

    @classmethod
    def load(cls, path: Path | str) -> Ledger:
        """Read the checkpoint; a corrupt one is kept aside and replaced by an empty ledger.

        An empty ledger from a missing or corrupt checkpoint has ``needs_rebuild``
        set (``recovered_from_corruption`` names the kept copy): the caller must
        rebuild the holds from what survives before it serves.
        """
        path = Path(path)
        try:
            raw = _read_checkpoint(path)
            data = _decode(path, raw) if raw is not None else None
        except LedgerCorruptError as err:
            kept = _quarantine(path)
            log.error(
                "ledger checkpoint is corrupt; kept a copy and starting empty, rebuild needed",
                path=str(path),
                reason=err.reason,
                kept=str(kept),
            )
            ledger = cls(path)
            ledger.recovered_from_corruption = kept
            ledger.rebuild_reason = f"corrupt ({err.reason}); kept at {kept}"
            return ledger
        if data is None:
            ledger = cls(path)
            ledger.rebuild_reason = "missing"
            return ledger
        return cls(path, data)

    # --- persistence -----------------------------------------------------------

    def _changed(self, undo: Callable[[], object]) -> None:
        """Make the change just applied to memory durable; undo it if the write fails.

        Inside :meth:`transaction` only memory changes; the transaction writes once.
        """
        if self._txn_thread == threading.get_ident():
            self._txn_undo.append(undo)
            return
        try:
            self._write()
        except BaseException:
            undo()
            raise

    def _put_claim(self, uid: str, entry: ClaimEntry | None) -> None:
        old = self._state.set_claim(uid, entry)
        self._changed(lambda: self._state.set_claim(uid, old))

    def _put_hold(self, key: tuple[str, str], hold: PluginHold | None) -> None:
        old = self._state.set_hold(key, hold)
        self._changed(lambda: self._state.set_hold(key, old))

    def _write(self) -> None:
        payload = self._state.snapshot().model_dump(mode="json")
        # The data is encoded once, canonically, and those same bytes are both hashed
        # (inside the envelope the checksum covers, see envelope_checksum) and written:
        # the ledger is rewritten on every prepare and unprepare. Compact on purpose: an
        # indented dump takes the slow pure-Python encoder (`jq .` reads it).
        data = json.dumps(payload, sort_keys=True, separators=(",", ":"))
        covered = f'{{"data":{data},"version":{SUPPORTED_VERSION}}}'
        digest = "sha256:" + hashlib.sha256(covered.encode("utf-8")).hexdigest()
        text = f'{{"version":{SUPPORTED_VERSION},"checksum":"{digest}","data":{data}}}'
        directory = self.path.parent
        if not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
            os.chmod(directory, LEDGER_DIR_MODE)
        atomic_write(self.path, (text + "\n").encode(), LEDGER_FILE_MODE)
        self._seen = _signature(self.path)

    def data(self) -> LedgerData:
        with self._lock():
            return self._state.snapshot().model_copy(deep=True)

    # --- conflicts -------------------------------------------------------------

    def holders(self, pool: str, device: str) -> list[Holder]:
        """Every use of the device, admin access included."""
        ref = DeviceRef(pool=pool, device=device)
        with self._lock():
            owners = self._state.by_device.get(ref, {})
            return [use.holder for uses in owners.values() for use in uses]

    def held_devices(self, include_shared: bool = False) -> set[tuple[str, str]]:
        """Devices taken exclusively (plus shared ones if asked): hide these from the other API."""
        wanted: set[_Mode] = {"exclusive", "shared"} if include_shared else {"exclusive"}
        with self._lock():
            return {
                (ref.pool, ref.device)
                for ref, owners in self._state.by_device.items()
                if any(use.mode in wanted for uses in owners.values() for use in uses)
            }

    # --- claims ----------------------------------------------------------------

    def claims(self) -> list[ClaimEntry]:
        with self._lock():
            claims = self._state.claims
            return [claims[k].model_copy(deep=True) for k in sorted(claims)]

    def get_claim(self, uid: str) -> ClaimEntry | None:
        with self._lock():
            entry = self._state.claims.get(uid)
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
        return self._enter_claim(
            uid,
            namespace,
            name,
            devices,
            config_digest,
            "preparing",
            # A repeated call finds nothing to do unless an unprepare is in progress.
            reusable=lambda existing: existing.state != "unpreparing",
        )

    def record_prepared(
        self,
        uid: str,
        namespace: str,
        name: str,
        devices: Sequence[ClaimDevice],
        config_digest: str = "",
    ) -> ClaimEntry:
        """Record a claim as prepared in one step; refuse a device someone else holds.

        For a prepare whose only side effect is its CDI spec (no setup hook): the spec may
        be on disk before this entry, never the other way round (see the invariants). A
        repeated call with the same devices and config returns the entry it finds.
        """
        return self._enter_claim(
            uid,
            namespace,
            name,
            devices,
            config_digest,
            "prepared",
            reusable=lambda existing: existing.state == "prepared",
        )

    def _enter_claim(
        self,
        uid: str,
        namespace: str,
        name: str,
        devices: Sequence[ClaimDevice],
        config_digest: str,
        state: Literal["preparing", "prepared"],
        reusable: Callable[[ClaimEntry], bool],
    ) -> ClaimEntry:
        """Put a claim's entry in ``state``, or return the one found if it is ``reusable``
        with the same config; refuse a device someone else holds."""
        try:
            entry = ClaimEntry(
                uid=uid,
                namespace=namespace,
                name=name,
                state=state,
                devices=list(devices),
                config_digest=config_digest,
            )
        except ValidationError as err:
            raise LedgerValueError(f"invalid claim {namespace}/{name} (uid {uid}): {err}") from err
        with self._lock():
            existing = self._state.claims.get(uid)
            if existing is not None:
                self._check_same_claim(existing, entry)
                if reusable(existing) and existing.config_digest == config_digest:
                    return existing.model_copy(deep=True)
            self._refuse_busy(entry)
            self._put_claim(uid, entry)
            log.debug(  # the node driver logs the outcome, once it is on disk
                f"claim {state}",
                claim=f"{namespace}/{name}",
                uid=uid,
                devices=",".join(str(d.ref) for d in entry.devices),
            )
            return entry.model_copy(deep=True)

    def _refuse_busy(self, entry: ClaimEntry) -> None:
        conflicts = self._state.conflicts(
            ((d.ref, _claim_mode(d)) for d in entry.devices), ("claim", entry.uid)
        )
        if conflicts:
            raise DeviceBusy(entry.describe(), conflicts)

    def adopt_claim(self, entry: ClaimEntry) -> ClaimEntry:
        """Record an entry rebuilt from what survived (a CDI spec, the API server),
        replacing the claim's current one; refuse a device someone else holds."""
        with self._lock():
            self._refuse_busy(entry)
            self._put_claim(entry.uid, entry)
            log.info(
                "claim adopted",
                claim=f"{entry.namespace}/{entry.name}",
                uid=entry.uid,
                state=entry.state,
                recovered=entry.recovered,
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
            entry = self._state.claims.get(uid)
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
            self._put_claim(uid, done)
            log.debug("claim prepared", claim=f"{entry.namespace}/{entry.name}", uid=uid)
            return done.model_copy(deep=True)

    def begin_unprepare(self, uid: str) -> ClaimEntry | None:
        """Mark teardown as started; the devices stay held until :meth:`remove_claim`."""
        with self._lock():
            entry = self._state.claims.get(uid)
            if entry is None:
                return None
            if entry.state != "unpreparing":
                entry = entry.model_copy(update={"state": "unpreparing", "updated": _now()})
                self._put_claim(uid, entry)
                log.debug("claim unpreparing", claim=f"{entry.namespace}/{entry.name}", uid=uid)
            return entry.model_copy(deep=True)

    def remove_claim(self, uid: str) -> None:
        with self._lock():
            entry = self._state.claims.get(uid)
            if entry is None:
                return
            self._put_claim(uid, None)
            log.debug("claim removed", claim=f"{entry.namespace}/{entry.name}", uid=uid)

    # --- device-plugin holds ---------------------------------------------------

    def plugin_holds(self) -> list[PluginHold]:
        with self._lock():
            holds = self._state.plugin
            return [holds[k].model_copy(deep=True) for k in sorted(holds)]

    def get_plugin_hold(self, pod_uid: str, container: str) -> PluginHold | None:
        with self._lock():
            hold = self._state.plugin.get((pod_uid, container))
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
            existing = self._state.plugin.get(hold.key)
            if (
                existing is not None
                and existing.resource == resource
                and set(existing.devices) == set(hold.devices)
            ):
                return existing.model_copy(deep=True)
            conflicts = self._state.conflicts(
                ((ref, "exclusive") for ref in hold.devices), ("plugin", pod_uid, container)
            )
            if conflicts:
                raise DeviceBusy(hold.describe(), conflicts)
            self._put_hold(hold.key, hold)
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
            hold = self._state.plugin.get((pod_uid, container))
            if hold is None:
                raise UnknownPluginHoldError(
                    f"no device-plugin hold for pod {pod_uid} container {container}; "
                    "begin_plugin_hold first"
                )
            if hold.state != "allocated":
                hold = hold.model_copy(update={"state": "allocated", "updated": _now()})
                self._put_hold(hold.key, hold)
                log.info("device-plugin hold allocated", pod=pod_uid, container=container)
            return hold.model_copy(deep=True)

    def release_plugin_hold(self, pod_uid: str, container: str) -> None:
        with self._lock():
            key = (pod_uid, container)
            if key not in self._state.plugin:
                return
            self._put_hold(key, None)
            log.info("device-plugin hold released", pod=pod_uid, container=container)
