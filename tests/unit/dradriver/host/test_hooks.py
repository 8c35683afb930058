"""Setup/teardown hooks: real subprocesses and Python entry points, deadlines, errors."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from dradriver.host.hooks import Hook, HookError, run_hook


def test_command_hook_sees_env(tmp_path: Path) -> None:
    out = tmp_path / "out"
    hook = Hook("setup", command=("sh", "-c", f'echo "$DRADRIVER_DEVICE" > {out}; echo done'))
    assert asyncio.run(run_hook(hook, {"DRADRIVER_DEVICE": "dev-3"})) == "done"
    assert out.read_text().strip() == "dev-3"


def test_command_failure_reports_exit_code_and_output() -> None:
    hook = Hook("setup", command=("sh", "-c", "echo no such device >&2; exit 4"))
    with pytest.raises(HookError, match="setup hook sh exited 4: no such device"):
        asyncio.run(run_hook(hook, {}))


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


def test_command_timeout_kills_the_process_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = f"echo $$ > {pids}; sleep 30 & echo $! >> {pids}; wait"
    hook = Hook("setup", command=("sh", "-c", script), timeout=0.5)
    started = time.monotonic()
    with pytest.raises(HookError, match=r"timed out after 0\.5s"):
        asyncio.run(run_hook(hook, {}))
    assert time.monotonic() - started < 10
    shell, child = (int(p) for p in pids.read_text().split())
    assert _gone(shell)
    # SIGKILL reached the whole group; the orphaned child dies (and its new parent reaps
    # it) a moment later on a loaded machine, so wait for that, with a deadline.
    deadline = time.monotonic() + 10
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _gone(child), "the hook's background child survived the timeout"


def test_python_hook_runs_with_env() -> None:
    hook = Hook("setup", python="tests.unit.hooktargets.sample:echo_claim")
    assert asyncio.run(run_hook(hook, {"DRADRIVER_CLAIM_UID": "u-1"})) == "claim=u-1"


def test_python_hook_failure_is_wrapped() -> None:
    hook = Hook("teardown", python="tests.unit.hooktargets.sample:explode")
    with pytest.raises(HookError, match=r"teardown hook .* failed: device is on fire"):
        asyncio.run(run_hook(hook, {}))


def test_python_hook_timeout() -> None:
    hook = Hook("setup", python="tests.unit.hooktargets.sample:slow", timeout=0.2)
    with pytest.raises(HookError, match="timed out"):
        asyncio.run(run_hook(hook, {}))


@pytest.mark.parametrize("spec", ["no_colon", "tests.unit.hooktargets.sample:missing"])
def test_bad_python_spec(spec: str) -> None:
    with pytest.raises(HookError, match="python hook"):
        asyncio.run(run_hook(Hook("setup", python=spec), {}))


def test_hook_needs_exactly_one_kind() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        Hook("setup")
