"""The node ledger: who holds which device on this node, kept in a checkpoint file.

Invariants (everything below serves these):
  * every hold is recorded, and on disk (fsynced file and directory, atomic
    rename), before the device is set up or handed out, so after a crash the
    plugin knows what it had started;
  * no two holds conflict (rules in :mod:`dradriver.host.state.holds`): a device
    is never handed out twice;
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
removed straight from it (one durable write each way). The file format is
:mod:`dradriver.host.state.codec`'s.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from dradriver.host.atomicfile import atomic_write
from dradriver.host.state.codec import decode, quarantine, read_checkpoint
from dradriver.host.state.holds import Holds, Mode, claim_mode
from dradriver.host.state.schema import (
    SUPPORTED_VERSION,
    ClaimDevice,
    ClaimEntry,
    ClaimMismatchError,
    ClaimStateError,
    DeviceBusy,
    DeviceKey,
    DeviceRef,
    Holder,
    LedgerCorruptError,
    LedgerData,
    LedgerError,
    LedgerValueError,
    PluginHold,
    UnknownClaimError,
    UnknownPluginHoldError,
    now,
)
from dradriver.log import get_logger

log = get_logger("ledger")

LEDGER_FILE_MODE = 0o600
LEDGER_DIR_MODE = 0o700


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
        self._state = Holds(data or LedgerData())
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
            raw = read_checkpoint(self.path)
            if raw is None:
                # Deleted under a running plugin: what is in memory is still true, and
                # forgetting it would hand held devices out again. Put it back.
                log.error("ledger file vanished; writing it again from memory", path=str(self.path))
                self._write()
                return
            data = decode(self.path, raw)
        except LedgerCorruptError as err:
            raise LedgerError(
                f"ledger {self.path} changed on disk and is now unreadable: {err.reason}; "
                "restart the plugin to recover"
            ) from err
        self._state = Holds(data)
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
            raw = read_checkpoint(path)
            data = decode(path, raw) if raw is not None else None
        except LedgerCorruptError as err:
            kept = quarantine(path)
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
        wanted: set[Mode] = {"exclusive", "shared"} if include_shared else {"exclusive"}
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
            ((d.ref, claim_mode(d)) for d in entry.devices), ("claim", entry.uid)
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
                update={"state": "prepared", "devices": devices, "updated": now()}
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
                entry = entry.model_copy(update={"state": "unpreparing", "updated": now()})
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
                hold = hold.model_copy(update={"state": "allocated", "updated": now()})
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
