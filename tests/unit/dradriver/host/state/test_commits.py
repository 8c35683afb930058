"""Group commit: concurrent ledger changes share one fsynced write, each keeps its outcome."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from dradriver.host.state.commits import GroupCommitter
from dradriver.host.state.ledger import Ledger
from dradriver.host.state.schema import ClaimDevice, ClaimEntry, DeviceBusy


def excl(device: str) -> ClaimDevice:
    return ClaimDevice(pool="p", device=device, request_names=["r"])


def test_concurrent_changes_share_writes_and_keep_their_own_outcome(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.json")
    commits = GroupCommitter(ledger)

    async def scenario() -> list[object]:
        def prepare(i: int) -> Callable[[], ClaimEntry]:
            return lambda: ledger.begin_prepare(f"u{i}", "ns", f"c{i}", [excl(f"d{i}")])

        changes = [commits.run(prepare(i)) for i in range(20)]
        # Wants d0 as well: refused, and only this caller sees the error.
        changes.append(commits.run(lambda: ledger.begin_prepare("x", "ns", "x", [excl("d0")])))
        return await asyncio.gather(*changes, return_exceptions=True)

    outcomes = asyncio.run(scenario())
    assert isinstance(outcomes[-1], DeviceBusy)
    assert all(not isinstance(o, BaseException) for o in outcomes[:-1])
    assert commits.changes == 21 and commits.writes < 21  # shared writes
    on_disk = Ledger.load(ledger.path)  # everything reported done is on disk
    assert {c.uid for c in on_disk.claims()} == {f"u{i}" for i in range(20)}


def test_a_failed_write_fails_the_whole_batch_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger(tmp_path / "ledger.json")
    commits = GroupCommitter(ledger)
    asyncio.run(commits.run(lambda: ledger.begin_prepare("u0", "ns", "c0", [excl("d0")])))

    def broken(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(ledger, "_write", broken)

    async def scenario() -> list[object]:
        return list(
            await asyncio.gather(
                commits.run(lambda: ledger.begin_prepare("u1", "ns", "c1", [excl("d1")])),
                commits.run(lambda: ledger.remove_claim("u0")),
                return_exceptions=True,
            )
        )

    outcomes = asyncio.run(scenario())
    assert all(isinstance(o, OSError) for o in outcomes)
    monkeypatch.undo()
    assert [c.uid for c in ledger.claims()] == ["u0"]  # memory put back
    assert [c.uid for c in Ledger.load(ledger.path).claims()] == ["u0"]
