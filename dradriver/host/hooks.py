"""Device setup and teardown hooks: a command or a Python entry point, with a deadline.

A hook learns what to do from its environment (``DRADRIVER_*`` variables: the
claim, the device, the merged opaque config) so a shell script and a Python
function see the same facts.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dradriver.log import get_logger

log = get_logger("hooks")


class HookError(RuntimeError):
    """A hook failed or timed out; the message says which and why."""


@dataclass(frozen=True)
class Hook:
    """``command`` (argv) or ``python`` (``module:function``), at most ``timeout`` seconds."""

    name: str
    command: tuple[str, ...] = ()
    python: str = ""
    timeout: float = 30.0

    def __post_init__(self) -> None:
        if bool(self.command) == bool(self.python):
            raise ValueError(f"hook {self.name}: set exactly one of command and python")


def _load_entry_point(spec: str) -> Callable[[dict[str, str]], Any]:
    module_name, sep, attr = spec.partition(":")
    if not sep:
        raise HookError(f"python hook {spec!r} must look like module:function")
    try:
        func = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise HookError(f"python hook {spec!r} cannot be loaded: {e}") from e
    if not callable(func):
        raise HookError(f"python hook {spec!r} is not callable")
    return func  # type: ignore[no-any-return]


async def run_hook(hook: Hook, env: dict[str, str]) -> str:
    """Run the hook; return its output. Raises HookError on failure or timeout."""
    if hook.python:
        func = _load_entry_point(hook.python)
        try:
            async with asyncio.timeout(hook.timeout):
                if inspect.iscoroutinefunction(func):
                    result = await func(dict(env))
                else:
                    result = await asyncio.to_thread(func, dict(env))
        except TimeoutError as e:
            raise HookError(
                f"{hook.name} hook {hook.python} timed out after {hook.timeout}s"
            ) from e
        except Exception as e:
            raise HookError(f"{hook.name} hook {hook.python} failed: {e}") from e
        return "" if result is None else str(result)

    proc = await asyncio.create_subprocess_exec(
        *hook.command,
        env={**os.environ, **env},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        async with asyncio.timeout(hook.timeout):
            out, _ = await proc.communicate()
    except TimeoutError as e:
        # Kill the whole process group: a shell hook may have started children.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        await proc.wait()
        raise HookError(
            f"{hook.name} hook {hook.command[0]} timed out after {hook.timeout}s"
        ) from e
    text = out.decode(errors="replace").strip()
    if proc.returncode != 0:
        tail = text[-500:] if text else "(no output)"
        raise HookError(f"{hook.name} hook {hook.command[0]} exited {proc.returncode}: {tail}")
    log.debug("hook done", hook=hook.name, output=text[-200:])
    return text
