"""What a device adds to a container: environment, device nodes, mounts.

The one description of container edits in dradriver: device sources fill it,
configuration may extend it, and the CDI writer turns it into a spec.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class DeviceNode(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    path: str = Field(description="path of the device node inside the container")
    host_path: str | None = Field(default=None, alias="hostPath")
    permissions: str | None = Field(default=None, pattern="^[rwm]{1,3}$")

    def to_cdi(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        if self.host_path:
            out["hostPath"] = self.host_path
        if self.permissions:
            out["permissions"] = self.permissions
        return out


class Mount(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    host_path: str = Field(alias="hostPath")
    container_path: str = Field(alias="containerPath")
    options: tuple[str, ...] = ()

    def to_cdi(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hostPath": self.host_path, "containerPath": self.container_path}
        if self.options:
            out["options"] = list(self.options)
        return out


class ContainerEdits(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    env: dict[str, str] = Field(default_factory=dict)
    device_nodes: tuple[DeviceNode, ...] = Field(default=(), alias="deviceNodes")
    mounts: tuple[Mount, ...] = ()

    def merged(self, other: ContainerEdits) -> ContainerEdits:
        """These edits followed by ``other``'s (``other`` wins on an env name clash)."""
        return ContainerEdits(
            env={**self.env, **other.env},
            device_nodes=self.device_nodes + other.device_nodes,
            mounts=self.mounts + other.mounts,
        )

    def is_empty(self) -> bool:
        return not (self.env or self.device_nodes or self.mounts)

    def to_cdi(self) -> dict[str, Any]:
        """The CDI ``containerEdits`` object (only the keys that are set)."""
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = [f"{k}={v}" for k, v in sorted(self.env.items())]
        if self.device_nodes:
            out["deviceNodes"] = [d.to_cdi() for d in self.device_nodes]
        if self.mounts:
            out["mounts"] = [m.to_cdi() for m in self.mounts]
        return out
