"""Attach backends: how a network device is connected to (and disconnected from) a node.

A backend is the narrow interface a platform team implements for its fabric. Two ship:
``simulated`` (in memory, configurable latency and failure injection; tests and the demo)
and ``exec`` (runs a command, so any fabric CLI can be wired in without Python).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Protocol

from dradriver.api.networkpool import AttachSpec, ExecBackend, SimulatedBackend
from dradriver.host.hooks import Hook, HookError, run_hook


class AttachError(RuntimeError):
    """Attaching or detaching failed; the message is shown to users (claim and pod events)."""


@dataclass(frozen=True)
class AttachRequest:
    pool: str  # NetworkDevicePool name
    device: str
    node: str
    claim: str  # namespace/name
    claim_uid: str


@dataclass(frozen=True)
class AttachResult:
    handle: str = ""  # handed back to detach
    env: dict[str, str] = field(default_factory=dict)  # extra container environment


class AttachBackend(Protocol):
    async def attach(self, request: AttachRequest) -> AttachResult: ...

    async def detach(self, request: AttachRequest, handle: str) -> None: ...


class SimulatedAttach:
    """Keeps attachments in a dict; fails for the configured devices."""

    def __init__(self, settings: SimulatedBackend) -> None:
        self.settings = settings
        self.attached: dict[tuple[str, str], str] = {}  # (pool, device) -> node

    async def attach(self, request: AttachRequest) -> AttachResult:
        await asyncio.sleep(self.settings.latency_seconds)  # simulated fabric latency
        if request.device in self.settings.fail_devices:
            raise AttachError(
                f"simulated attach failure for device {request.device} "
                f"(listed in spec.attach.simulated.failDevices of pool {request.pool})"
            )
        self.attached[(request.pool, request.device)] = request.node
        handle = f"sim:{request.pool}/{request.device}@{request.node}"
        return AttachResult(handle=handle, env={"DRADRIVER_ATTACH_HANDLE": handle})

    async def detach(self, request: AttachRequest, handle: str) -> None:
        await asyncio.sleep(self.settings.latency_seconds)
        self.attached.pop((request.pool, request.device), None)


class ExecAttach:
    """Runs ``command... attach`` / ``command... detach``.

    Environment: DRADRIVER_POOL, DRADRIVER_DEVICE, DRADRIVER_NODE, DRADRIVER_CLAIM,
    DRADRIVER_CLAIM_UID, and DRADRIVER_ATTACH_HANDLE for detach. A non-zero exit fails the
    call with the command's output. On attach, stdout may be a JSON object
    ``{"handle": "...", "env": {"NAME": "value"}}``; anything else is taken as the handle.
    """

    def __init__(self, settings: ExecBackend) -> None:
        self.settings = settings

    def _hook(self, action: str) -> Hook:
        return Hook(
            name=f"network {action}",
            command=(*self.settings.command, action),
            timeout=self.settings.timeout_seconds,
        )

    @staticmethod
    def _env(request: AttachRequest) -> dict[str, str]:
        return {
            "DRADRIVER_POOL": request.pool,
            "DRADRIVER_DEVICE": request.device,
            "DRADRIVER_NODE": request.node,
            "DRADRIVER_CLAIM": request.claim,
            "DRADRIVER_CLAIM_UID": request.claim_uid,
        }

    async def attach(self, request: AttachRequest) -> AttachResult:
        try:
            out = (await run_hook(self._hook("attach"), self._env(request))).strip()
        except HookError as e:
            raise AttachError(str(e)) from e
        return parse_attach_output(out)

    async def detach(self, request: AttachRequest, handle: str) -> None:
        env = {**self._env(request), "DRADRIVER_ATTACH_HANDLE": handle}
        try:
            await run_hook(self._hook("detach"), env)
        except HookError as e:
            raise AttachError(str(e)) from e


def parse_attach_output(out: str) -> AttachResult:
    if not out.startswith("{"):
        return AttachResult(handle=out[:1024])
    try:
        data = json.loads(out)
    except json.JSONDecodeError as e:
        raise AttachError(f"attach command printed invalid JSON: {e}") from e
    env = data.get("env") or {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise AttachError('attach command output: "env" must map strings to strings')
    return AttachResult(handle=str(data.get("handle") or "")[:1024], env=env)


def backend_for(spec: AttachSpec) -> AttachBackend:
    if spec.backend == "exec":
        assert spec.exec_ is not None  # checked by the model
        return ExecAttach(spec.exec_)
    return SimulatedAttach(spec.simulated or SimulatedBackend())
