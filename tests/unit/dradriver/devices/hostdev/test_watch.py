"""Hot-plug events through inotify, in temporary directories (waits have deadlines)."""

from __future__ import annotations

import asyncio
import os
import stat
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path

from dradriver.devices.hostdev.config import HostSourceConfig
from dradriver.devices.hostdev.source import HostDeviceSource
from dradriver.devices.hostdev.watch import (
    IN_CREATE,
    IN_IGNORED,
    IN_Q_OVERFLOW,
    HotplugWatcher,
    RawEvent,
    directories_to_watch,
    nearest_existing,
    parse_events,
)

HOT_PLUG_DEADLINE = 1.0
"""How soon a create or a delete must reach the owner."""
DEADLINE = 5.0
"""For the other waits, which check what is called, not how soon (the machine may be busy)."""


class Calls:
    """The watcher's callback: records the keys of each call for the test to await."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[frozenset[str]] = asyncio.Queue()

    def __call__(self, keys: frozenset[str]) -> None:
        self.queue.put_nowait(keys)

    async def next(self, deadline: float = DEADLINE) -> frozenset[str]:
        return await asyncio.wait_for(self.queue.get(), deadline)


def _run(test: Callable[[Calls, HotplugWatcher], Awaitable[None]]) -> None:
    async def main() -> None:
        calls = Calls()
        watcher = HotplugWatcher(calls)
        try:
            await test(calls, watcher)
        finally:
            watcher.close()

    asyncio.run(main())


def _node(path: Path) -> None:
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(240, 1))


def test_parse_events_reads_names_padded_with_nuls() -> None:
    buffer = struct.pack("iIII", 1, IN_CREATE, 0, 16) + b"ttyUSB0".ljust(16, b"\0")
    buffer += struct.pack("iIII", -1, IN_Q_OVERFLOW, 0, 0)
    assert parse_events(buffer) == [RawEvent(1, IN_CREATE, "ttyUSB0"), RawEvent(-1, 0x4000, "")]


def test_nearest_existing_is_the_directory_or_its_closest_ancestor(tmp_path: Path) -> None:
    assert nearest_existing(str(tmp_path)) == str(tmp_path)
    assert nearest_existing(str(tmp_path / "a" / "b")) == str(tmp_path)
    (tmp_path / "file").write_text("")
    assert nearest_existing(str(tmp_path / "file")) == str(tmp_path)


def test_a_create_and_a_delete_are_seen_within_a_second(tmp_path: Path) -> None:
    dev, other = tmp_path / "dev", tmp_path / "other"
    dev.mkdir()
    other.mkdir()

    async def test(calls: Calls, watcher: HotplugWatcher) -> None:
        watcher.watch("kvm", [str(dev)])
        watcher.watch("other", [str(other)])
        watcher.start()
        _node(dev / "kvm")
        assert await calls.next(HOT_PLUG_DEADLINE) == {"kvm"}
        (dev / "kvm").unlink()
        assert await calls.next(HOT_PLUG_DEADLINE) == {"kvm"}

    _run(test)


def test_a_burst_of_events_is_one_call(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()

    async def test(calls: Calls, watcher: HotplugWatcher) -> None:
        watcher.watch("a", [str(a)])
        watcher.watch("b", [str(b)])
        watcher.start()
        for i in range(20):
            _node(a / f"loop{i}")
        assert await calls.next() == {"a"}
        (b / "x").write_text("")  # a later event, after the burst's call
        assert await calls.next() == {"b"}
        assert calls.queue.empty()

    _run(test)


def test_a_missing_directory_is_watched_through_its_ancestor_until_it_exists(
    tmp_path: Path,
) -> None:
    by_id = tmp_path / "serial" / "by-id"

    async def test(calls: Calls, watcher: HotplugWatcher) -> None:
        watcher.watch("serial", [str(by_id)])
        watcher.start()
        assert watcher.watched == {str(tmp_path)}
        (tmp_path / "serial").mkdir()
        assert await calls.next() == {"serial"}
        assert watcher.watched == {str(tmp_path / "serial")}
        by_id.mkdir()
        assert await calls.next() == {"serial"}
        assert watcher.watched == {str(by_id)}
        (by_id / "usb-FTDI-if00").symlink_to("../../ttyUSB0")
        assert await calls.next() == {"serial"}

    _run(test)


def test_a_watched_directory_that_goes_away_rescans_everything_and_is_rewatched(
    tmp_path: Path,
) -> None:
    gone, kept = tmp_path / "gone", tmp_path / "kept"
    gone.mkdir()
    kept.mkdir()

    async def test(calls: Calls, watcher: HotplugWatcher) -> None:
        watcher.watch("a", [str(gone)])
        watcher.watch("b", [str(kept)])
        watcher.start()
        gone.rmdir()  # IN_DELETE_SELF, then IN_IGNORED: the kernel dropped the watch
        assert await calls.next() == {"a", "b"}
        assert watcher.watched == {str(tmp_path), str(kept)}
        gone.mkdir()
        assert await calls.next() == {"a"}
        assert watcher.watched == {str(gone), str(kept)}

    _run(test)


def test_a_queue_overflow_rescans_every_profile_once(tmp_path: Path) -> None:
    async def test(calls: Calls, watcher: HotplugWatcher) -> None:
        watcher.watch("a", [str(tmp_path)])
        watcher.watch("b", [str(tmp_path / "missing")])
        watcher.start()
        watcher.handle([RawEvent(-1, IN_Q_OVERFLOW, ""), RawEvent(-1, IN_Q_OVERFLOW, "")])
        assert await calls.next() == {"a", "b"}
        watcher.handle([RawEvent(12345, IN_IGNORED, "")])  # a watch it never had
        assert await calls.next() == {"a", "b"}
        assert calls.queue.empty()

    _run(test)


def test_a_failing_callback_does_not_stop_the_watcher(tmp_path: Path) -> None:
    async def main() -> None:
        seen: asyncio.Queue[frozenset[str]] = asyncio.Queue()

        def callback(keys: frozenset[str]) -> None:
            seen.put_nowait(keys)
            if seen.qsize() == 1:
                raise RuntimeError("rescan failed")

        watcher = HotplugWatcher(callback)
        watcher.watch("p", [str(tmp_path)])
        watcher.start()
        try:
            (tmp_path / "one").write_text("")
            assert await asyncio.wait_for(seen.get(), DEADLINE) == {"p"}
            (tmp_path / "two").write_text("")
            assert await asyncio.wait_for(seen.get(), DEADLINE) == {"p"}
        finally:
            watcher.close()

    asyncio.run(main())


def test_a_hot_plugged_device_is_found_by_the_rescan_the_watcher_asks_for(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    config = HostSourceConfig.model_validate(
        {
            "name": "loop",
            "nodes": [{"path": "/dev/loop*"}],
            "identity": "path",
            "devRoot": str(dev),
            "sysfsRoot": str(tmp_path / "sys"),
        }
    )
    source = HostDeviceSource("sources[0] (host)", config)
    assert source.discover() == []

    async def main() -> None:
        found: asyncio.Queue[list[str]] = asyncio.Queue()

        def rescan(keys: frozenset[str]) -> None:
            assert keys == {source.name}
            found.put_nowait([d.name for d in source.discover() if d.healthy])

        watcher = HotplugWatcher(rescan)
        watcher.watch(source.name, source.watch_dirs())
        watcher.start()
        try:
            _node(dev / "loop0")
            assert len(await asyncio.wait_for(found.get(), HOT_PLUG_DEADLINE)) == 1
            (dev / "loop0").unlink()
            assert await asyncio.wait_for(found.get(), HOT_PLUG_DEADLINE) == []
        finally:
            watcher.close()

    asyncio.run(main())


def test_a_glob_directory_is_watched_in_every_directory_it_matches(tmp_path: Path) -> None:
    usb = tmp_path / "bus" / "usb"
    (usb / "001").mkdir(parents=True)
    targets, standins = directories_to_watch(str(usb / "*"))
    assert (targets, standins) == ({str(usb), str(usb / "001")}, {str(usb)})

    async def test(calls: Calls, watcher: HotplugWatcher) -> None:
        watcher.watch("usb", [str(usb / "*")])
        watcher.start()
        (usb / "002").mkdir()  # a new bus: watched from now on
        assert await calls.next() == {"usb"}
        assert watcher.watched == {str(usb), str(usb / "001"), str(usb / "002")}
        _node(usb / "002" / "003")
        assert await calls.next() == {"usb"}

    _run(test)
