"""Hot-plug events from inotify: which profiles to rescan, without polling the tree.

Invariants:

* The owner registers each profile (a key) with the directories whose entries decide its
  devices (glob parents, by-id and by-path directories). A create, delete, move or
  attribute change in one of them calls ``callback`` with the keys to rescan, once per
  burst: the first event starts a short timer (``debounce``, 50 ms) and the events until it
  fires are merged.
* A directory that does not exist yet is watched through its nearest existing ancestor;
  when a component appears the watches move down, and the owner rescans (entries made
  before the new watch existed are found by that rescan). A wanted directory with glob
  components (``/dev/bus/usb/*``) is its literal part plus every directory matching now,
  looked up again after each event in one of the directories above the last component.
* A queue overflow or a watch the kernel dropped (``IN_IGNORED``: the directory went away)
  means events were or may be lost: every key is rescanned once and the watches rebuilt.
* Only the directories are read, never the devices; nothing here opens a device node.

The inotify calls go through ctypes (libc): no third-party dependency.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import glob
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dradriver.log import get_logger

log = get_logger("devices.hostdev")

IN_ATTRIB = 0x00000004
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

WATCH_MASK = (
    IN_CREATE
    | IN_DELETE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_ATTRIB
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
)
DEFAULT_DEBOUNCE_SECONDS = 0.05

_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)
_READ_SIZE = 64 * 1024


@dataclass(frozen=True)
class RawEvent:
    wd: int
    mask: int
    name: str


def parse_events(buffer: bytes) -> list[RawEvent]:
    """The events in a buffer read from an inotify descriptor (names NUL-padded)."""
    events = []
    offset = 0
    while offset + _EVENT.size <= len(buffer):
        wd, mask, _cookie, length = _EVENT.unpack_from(buffer, offset)
        offset += _EVENT.size
        raw = buffer[offset : offset + length]
        offset += length
        events.append(RawEvent(wd, mask, raw.split(b"\0", 1)[0].decode(errors="replace")))
    return events


def nearest_existing(path: str) -> str:
    """``path`` if it is a directory, else its nearest ancestor that is one."""
    current = os.path.abspath(path)
    while not os.path.isdir(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return current


def directories_to_watch(wanted: str) -> tuple[set[str], set[str]]:
    """The directories to watch for ``wanted`` (which may have glob components), and those
    of them that stand in for directories not there yet (an event there means: look again).

    ``/dev/bus/usb/*`` is watched as ``/dev/bus/usb`` (a stand-in: new bus directories
    appear there) and every existing ``/dev/bus/usb/<bus>``.
    """
    wanted = os.path.abspath(wanted)
    if not glob.has_magic(wanted):
        target = nearest_existing(wanted)
        return {target}, ({target} if target != wanted else set())
    parts = wanted.split(os.sep)
    first = next(i for i, part in enumerate(parts) if glob.has_magic(part))
    literal = nearest_existing(os.sep.join(parts[:first]) or os.sep)
    targets, standins = {literal}, {literal}
    for end in range(first + 1, len(parts) + 1):
        matches = {d for d in glob.glob(os.sep.join(parts[:end])) if os.path.isdir(d)}
        targets |= matches
        if end < len(parts):
            standins |= matches
    return targets, standins


class Inotify:
    """A non-blocking inotify descriptor (``inotify_init1``, ``inotify_add_watch``)."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.inotify_init1.argtypes = [ctypes.c_int]
        self._libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        fd = int(self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC))
        if fd < 0:
            self._raise("inotify_init1")
        self.fd = fd

    def _raise(self, call: str, path: str | None = None) -> None:
        code = ctypes.get_errno()
        raise OSError(code, f"{call}: {os.strerror(code)}", path)

    def add_watch(self, path: str, mask: int = WATCH_MASK) -> int:
        wd = int(self._libc.inotify_add_watch(self.fd, os.fsencode(path), mask))
        if wd < 0:
            self._raise("inotify_add_watch", path)
        return wd

    def rm_watch(self, wd: int) -> None:
        self._libc.inotify_rm_watch(self.fd, wd)  # fails only for a watch already gone

    def read(self) -> list[RawEvent]:
        """Every event queued now (none when nothing is)."""
        events: list[RawEvent] = []
        while True:
            try:
                buffer = os.read(self.fd, _READ_SIZE)
            except BlockingIOError:
                return events
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                raise
            if not buffer:
                return events
            events.extend(parse_events(buffer))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class HotplugWatcher:
    """Calls ``callback(keys)`` after changes in the directories registered for ``keys``."""

    def __init__(
        self,
        callback: Callable[[frozenset[str]], None],
        *,
        debounce: float = DEFAULT_DEBOUNCE_SECONDS,
    ) -> None:
        self._callback = callback
        self._debounce = debounce
        self._wanted: dict[str, set[str]] = {}  # key -> directories it wants watched
        self._inotify: Inotify | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wd_of: dict[str, int] = {}  # watched directory -> watch descriptor
        self._dirs_of: dict[int, set[str]] = {}  # watch descriptor -> watched directories
        self._keys_of: dict[str, set[str]] = {}  # watched directory -> keys to rescan
        self._removed: set[int] = set()  # watches removed here: their IN_IGNORED is no loss
        self._standins: set[str] = set()  # watched for a wanted directory missing below it
        self._pending: set[str] = set()
        self._timer: asyncio.TimerHandle | None = None

    def watch(self, key: str, dirs: Iterable[str]) -> None:
        """Register (or replace) the directories of ``key``; applied at once when started."""
        self._wanted[key] = {os.path.abspath(d) for d in dirs}
        if self._inotify is not None:
            self._rebuild()

    @property
    def watched(self) -> set[str]:
        """The directories watched now (wanted ones, or their nearest existing ancestors)."""
        return set(self._wd_of)

    def start(self) -> None:
        """Open the inotify descriptor and read it on the running event loop."""
        if self._inotify is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._inotify = Inotify()
        self._rebuild()
        self._loop.add_reader(self._inotify.fd, self._on_readable)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._inotify is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._inotify.fd)
            self._inotify.close()
            self._inotify = None
        self._wd_of.clear()
        self._dirs_of.clear()
        self._removed.clear()
        self._keys_of.clear()

    def _rebuild(self) -> None:
        """Watch each wanted directory, or its nearest existing ancestor; drop the rest."""
        assert self._inotify is not None
        keys_of: dict[str, set[str]] = {}
        standins: set[str] = set()
        for key, dirs in self._wanted.items():
            for wanted in dirs:
                targets, stand_in = directories_to_watch(wanted)
                for target in targets:
                    keys_of.setdefault(target, set()).add(key)
                standins |= stand_in
        for directory in set(self._wd_of) - set(keys_of):
            self._forget(directory, remove=True)
        for directory in set(keys_of) - set(self._wd_of):
            try:
                wd = self._inotify.add_watch(directory)
            except OSError as e:  # gone since it was checked: the next event rebuilds
                log.warning("cannot watch directory", path=directory, error=str(e))
                keys_of.pop(directory)
                continue
            self._wd_of[directory] = wd
            self._dirs_of.setdefault(wd, set()).add(directory)
        self._keys_of = keys_of
        self._standins = standins

    def _forget(self, directory: str, *, remove: bool) -> None:
        assert self._inotify is not None
        wd = self._wd_of.pop(directory)
        dirs = self._dirs_of.get(wd, set())
        dirs.discard(directory)
        if not dirs:
            self._dirs_of.pop(wd, None)
            if remove:
                self._inotify.rm_watch(wd)
                self._removed.add(wd)

    def _on_readable(self) -> None:
        assert self._inotify is not None
        try:
            events = self._inotify.read()
        except OSError as e:
            log.warning("reading inotify events failed; rescanning everything", error=str(e))
            events = [RawEvent(-1, IN_Q_OVERFLOW, "")]
        self.handle(events)

    def handle(self, events: list[RawEvent]) -> None:
        """Note the keys the events concern and start the debounce timer."""
        rebuild = False
        for event in events:
            if event.mask & IN_IGNORED and event.wd in self._removed:
                self._removed.discard(event.wd)
                continue
            if event.mask & (IN_Q_OVERFLOW | IN_IGNORED):
                if event.mask & IN_IGNORED and event.wd in self._dirs_of:
                    for directory in list(self._dirs_of[event.wd]):
                        self._forget(directory, remove=False)
                log.info("hot-plug events may be lost; rescanning every profile")
                self._pending.update(self._wanted)
                rebuild = True
                continue
            for directory in self._dirs_of.get(event.wd, ()):
                self._pending.update(self._keys_of.get(directory, ()))
                if directory in self._standins:
                    rebuild = True  # a wanted directory below it may exist now
        if rebuild and self._inotify is not None:
            self._rebuild()
        if self._pending and self._timer is None and self._loop is not None:
            self._timer = self._loop.call_later(self._debounce, self._fire)

    def _fire(self) -> None:
        self._timer = None
        keys, self._pending = frozenset(self._pending), set()
        try:
            self._callback(keys)
        except Exception as e:  # the owner's rescan failed: keep watching
            log.error("hot-plug rescan failed", profiles=",".join(sorted(keys)), error=str(e))
