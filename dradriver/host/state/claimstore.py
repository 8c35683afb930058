"""One claim's preparation on this node as one transaction over the ledger.

Invariants:
  * the caller holds the claim's lock: one prepare or unprepare of a claim runs at a time;
  * a claim's devices are on disk in the ledger before a setup hook touches them, and
    its CDI spec, ledger entry and side files (device metadata) go into one change of
    the group committer (one fsynced write, shared with the claims of the same batch);
  * hook phases run only when hooks are configured: without a setup hook a prepare is
    that one change, without a teardown hook an unprepare is one change;
  * whatever fails once a prepare has changed anything, it is rolled back the one way
    (:meth:`ClaimStore._roll_back`): a claim never stays ``preparing`` holding devices,
    and a spec is never left behind for a claim that was not recorded;
  * every hook sees one environment (:func:`hook_env`): setup, rollback and teardown.

What a prepare finds in the ledger decides what it does, in one place
(:meth:`ClaimStore._enter`): a prepared claim with the same config is a repeat (its
spec is written again); a claim rebuilt from its CDI spec alone (``recovered``) with
the same devices is adopted; any other entry is half done or stale and is torn down
before the claim is prepared again. Nothing here knows Kubernetes objects: the caller
plans the devices (:class:`ClaimPlan`) and turns errors into answers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from dradriver.host.cdi import CDIDevice, CDIRegistry, check_host_device_nodes
from dradriver.host.hooks import Hook, run_hook
from dradriver.host.state.commits import GroupCommitter
from dradriver.host.state.ledger import Ledger
from dradriver.host.state.schema import (
    ClaimDevice,
    ClaimEntry,
    ClaimMismatchError,
    ClaimStateError,
    DeviceKey,
)
from dradriver.log import StructLogger, get_logger


@dataclass(frozen=True)
class DevicePlan:
    """One device use of a claim: its ledger record, its CDI device, its hook variables."""

    use: ClaimDevice  # without CDI IDs: the store records those
    cdi: CDIDevice
    # Variables setup (and rollback) hooks get besides hook_env's (e.g. the merged config).
    hook_env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SideFiles:
    """Files a prepared claim has besides its CDI spec (device metadata, KEP-5304).

    ``write`` runs in the claim's commit, after its entry; it is blocking, never raises
    for a file it cannot write and returns False then (the claim is prepared without
    them). ``remove`` logs its own failure.
    """

    write: Callable[[], bool]
    remove: Callable[[], None]


@dataclass(frozen=True)
class ClaimPlan:
    """What one claim needs on this node."""

    uid: str
    namespace: str
    name: str
    devices: tuple[DevicePlan, ...]
    digest: str  # of the allocation and config: a different one is a different prepare
    side_files: SideFiles | None = None
    # Raised instead of taking the devices (a repeat of a prepared claim still succeeds).
    refused: Exception | None = None

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def keys(self) -> set[DeviceKey]:
        return {d.use.key for d in self.devices}


@dataclass(frozen=True)
class Prepared:
    """A prepared claim: the CDI IDs of its devices (by CDI device name)."""

    ids: dict[str, str]
    side_files: bool  # they were written
    fresh: bool  # the claim was not prepared before this call


@dataclass
class _Attempt:
    """What a prepare has changed so far (what a rollback undoes)."""

    spec: bool = False  # wrote the spec of a claim that was not prepared
    side_files: bool = False
    began: bool = False  # "preparing" is on disk


def hook_env(
    driver: str, claim: ClaimEntry | ClaimPlan, use: ClaimDevice, extra: Mapping[str, str]
) -> dict[str, str]:
    """The one environment of every hook: the claim, the device use, and ``extra``."""
    return {
        "DRADRIVER_DRIVER": driver,
        "DRADRIVER_CLAIM_NAMESPACE": claim.namespace,
        "DRADRIVER_CLAIM_NAME": claim.name,
        "DRADRIVER_CLAIM_UID": claim.uid,
        "DRADRIVER_REQUEST": ",".join(use.request_names),
        "DRADRIVER_POOL": use.pool,
        "DRADRIVER_DEVICE": use.device,
        "DRADRIVER_SHARE_ID": use.share_id or "",
        **extra,
    }


def setup_env(
    admin_access: bool, profile: str | None, setup_args: Iterable[str], config: str
) -> dict[str, str]:
    """The variables only setup and rollback hooks get (the merged opaque config)."""
    return {
        "DRADRIVER_ADMIN_ACCESS": "true" if admin_access else "false",
        "DRADRIVER_PROFILE": profile or "",
        "DRADRIVER_SETUP_ARGS": json.dumps(list(setup_args)),
        "DRADRIVER_CONFIG": config,
    }


def same_devices(entry: ClaimEntry, keys: set[DeviceKey]) -> bool:
    """The entry holds exactly these device uses."""
    return len(keys) == len(entry.devices) and keys == {d.key for d in entry.devices}


class ClaimStore:
    """Prepares and unprepares claims: hooks, CDI specs, ledger entries, side files."""

    def __init__(
        self,
        *,
        driver_name: str,
        ledger: Ledger,
        cdi: CDIRegistry,
        setup: Hook | None = None,
        teardown: Hook | None = None,
        logger: StructLogger | None = None,  # default: the ledger's
    ) -> None:
        self.driver_name = driver_name
        self.ledger = ledger
        self.cdi = cdi
        self.setup = setup
        self.teardown = teardown
        self.log = logger or get_logger("ledger")
        self.commits = GroupCommitter(ledger)
        # Prepared claims the API server could not confirm or deny at start.
        self.unconfirmed: set[str] = set()

    def ids(self, plan: ClaimPlan) -> dict[str, str]:
        """The CDI IDs the claim's devices get (by CDI device name)."""
        return {d.cdi.name: self.cdi.cdi_id(plan.uid, d.cdi.name) for d in plan.devices}

    # ----- prepare -----------------------------------------------------------

    async def prepare(self, plan: ClaimPlan) -> Prepared:
        """Prepare the claim, or raise (and leave nothing of this attempt behind)."""
        attempt = _Attempt()
        try:
            outcome = await self.commits.run(lambda: self._enter(plan, attempt))
            if isinstance(outcome, ClaimEntry):
                # A half-done attempt (crash or failure) or a stale recovered entry.
                await self.unprepare(outcome.uid)
                outcome = await self.commits.run(lambda: self._enter(plan, attempt))
            if isinstance(outcome, ClaimEntry):
                raise ClaimStateError(f"{outcome.describe()} came back while it was torn down")
            if outcome is None:  # recorded "preparing": the setup hooks' turn
                attempt.began = True
                for d in plan.devices:
                    await self._run_setup(plan, d)
                outcome = await self.commits.run(lambda: self._complete(plan, attempt))
        except BaseException:
            await self._roll_back(plan, attempt)
            raise
        self.unconfirmed.discard(plan.uid)
        if outcome.fresh:
            devices = ",".join(d.cdi.name for d in plan.devices)
            self.log.info("prepared", claim=str(plan), uid=plan.uid, devices=devices)
        return outcome

    async def _run_setup(self, plan: ClaimPlan, d: DevicePlan) -> None:
        assert self.setup is not None
        await run_hook(self.setup, hook_env(self.driver_name, plan, d.use, d.hook_env))

    def _enter(self, plan: ClaimPlan, attempt: _Attempt) -> Prepared | ClaimEntry | None:
        """One change: a repeat, an adoption, a claim prepared in one write, or "preparing"
        recorded (None, hooks to run); an entry in the way is returned untouched."""
        existing = self.ledger.get_claim(plan.uid)
        if existing is not None and existing.state == "prepared":
            if existing.recovered and same_devices(existing, plan.keys):
                return self._adopt(plan)  # rebuilt from its spec: set up already
            if existing.config_digest == plan.digest:
                return self._written(plan)  # a repeated call
            if not existing.recovered:
                raise ClaimMismatchError(
                    f"ResourceClaim {plan} is already prepared with a different allocation "
                    "or config; unprepare it first"
                )
        if plan.refused is not None:
            raise plan.refused
        if existing is not None:
            return existing
        if self.setup is not None:
            uses = [d.use for d in plan.devices]
            self.ledger.begin_prepare(plan.uid, plan.namespace, plan.name, uses, plan.digest)
            return None
        ids = self.ids(plan)
        check_host_device_nodes(d.cdi for d in plan.devices)
        attempt.spec = True
        self.cdi.write_claim(plan.uid, [d.cdi for d in plan.devices])
        uses = [d.use.model_copy(update={"cdi_ids": [ids[d.cdi.name]]}) for d in plan.devices]
        self.ledger.record_prepared(plan.uid, plan.namespace, plan.name, uses, plan.digest)
        return Prepared(ids, self._write_side_files(plan, attempt), fresh=True)

    def _complete(self, plan: ClaimPlan, attempt: _Attempt) -> Prepared:
        """After the setup hooks (they may create device nodes): spec, entry, side files."""
        ids = self.ids(plan)
        check_host_device_nodes(d.cdi for d in plan.devices)
        attempt.spec = True
        self.cdi.write_claim(plan.uid, [d.cdi for d in plan.devices])
        recorded = {d.use.key: [ids[d.cdi.name]] for d in plan.devices}
        self.ledger.complete_prepare(plan.uid, recorded)
        return Prepared(ids, self._write_side_files(plan, attempt), fresh=True)

    def _adopt(self, plan: ClaimPlan) -> Prepared:
        """Record a claim whose devices are set up already (its spec survived a lost
        ledger) as the plan says; its spec is written as prepare would."""
        ids = self.ids(plan)
        entry = ClaimEntry(
            uid=plan.uid,
            namespace=plan.namespace,
            name=plan.name,
            state="prepared",
            devices=[d.use.model_copy(update={"cdi_ids": [ids[d.cdi.name]]}) for d in plan.devices],
            config_digest=plan.digest,
        )
        self.ledger.adopt_claim(entry)
        return self._written(plan)

    def _written(self, plan: ClaimPlan) -> Prepared:
        """A claim prepared before: its spec and side files again (a failure to write
        them later in the batch removes neither: the claim stays prepared)."""
        ids = self.cdi.write_claim(plan.uid, [d.cdi for d in plan.devices])
        return Prepared(ids, self._write_side_files(plan, None), fresh=False)

    def _write_side_files(self, plan: ClaimPlan, attempt: _Attempt | None) -> bool:
        if plan.side_files is None:
            return False
        if attempt is not None:
            attempt.side_files = True
        try:
            return plan.side_files.write()
        except Exception as e:  # the claim is recorded: only its side files are lost
            self.log.exception("device metadata not written", claim=str(plan), error=str(e))
            return False

    async def adopt(self, plan: ClaimPlan) -> Prepared:
        """Start-up adoption: record a claim the API server says is prepared here."""
        return await self.commits.run(lambda: self._adopt(plan))

    async def _roll_back(self, plan: ClaimPlan, attempt: _Attempt) -> None:
        """Undo a failed prepare, best effort: each step is tried even if one before failed."""
        if attempt.began and self.teardown is not None:
            for d in plan.devices:
                try:
                    await run_hook(
                        self.teardown, hook_env(self.driver_name, plan, d.use, d.hook_env)
                    )
                except Exception as e:
                    self.log.error("teardown during rollback failed", claim=str(plan), error=str(e))
        if attempt.spec or attempt.began:
            try:
                self.cdi.remove_claim(plan.uid)
            except OSError as e:
                self.log.error(
                    "removing the CDI spec during rollback failed"
                    if attempt.began
                    else "removing the CDI spec of a failed prepare failed",
                    claim=str(plan),
                    error=str(e),
                )
        if attempt.side_files and plan.side_files is not None:
            plan.side_files.remove()
        if attempt.began:
            await self.commits.run(lambda: self.ledger.remove_claim(plan.uid))

    # ----- unprepare ---------------------------------------------------------

    async def unprepare(
        self, uid: str, remove_side_files: Callable[[], None] | None = None
    ) -> ClaimEntry | None:
        """Undo a claim's preparation (also a half-done one, or a spec the ledger does not
        know); the entry it had, or None. ``remove_side_files`` runs with the spec's removal.

        With a teardown hook the entry is marked ``unpreparing`` first (the devices stay
        held while the hook runs). Then spec, side files and entry go in one change: the
        spec before the write that removes the entry, so a crash leaves a prepared entry
        without a spec (start-up writes it again or tears the claim down), never a spec
        without its hold.
        """
        if self.teardown is not None:
            entry = await self.commits.run(lambda: self.ledger.begin_unprepare(uid))
            for d in [] if entry is None else entry.devices:
                assert entry is not None
                await run_hook(self.teardown, hook_env(self.driver_name, entry, d, {}))
        removed = await self.commits.run(lambda: self._remove(uid, remove_side_files))
        self.unconfirmed.discard(uid)
        if removed is not None:
            self.log.info("unprepared", claim=f"{removed.namespace}/{removed.name}", uid=uid)
        return removed

    def _remove(self, uid: str, remove_side_files: Callable[[], None] | None) -> ClaimEntry | None:
        entry = self.ledger.get_claim(uid)
        self.cdi.remove_claim(uid)
        if entry is not None:
            self.ledger.remove_claim(uid)
        if remove_side_files is not None:
            try:
                remove_side_files()  # logs its own failure
            except Exception as e:  # the entry is removed: only files are left behind
                where = f"{entry.namespace}/{entry.name}" if entry is not None else uid
                self.log.exception("device metadata not removed", claim=where, error=str(e))
        return entry
