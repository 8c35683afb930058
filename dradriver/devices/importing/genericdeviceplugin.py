"""generic-device-plugin's configuration -> ``host`` profiles.

Invariants:

* Each group of each device becomes one ``host`` profile, named ``<name>`` (``<name>-<i>``
  when the device has several groups) and serving ``extendedResourceName: <domain>/<name>``,
  the resource the device plugin advertised, so pod specs need not change.
* Behaviour that the host source cannot reproduce is a loss naming the input field; nothing
  is dropped silently.

The input is the plugin's config file (``devices:`` plus the flags it may also set there,
``domain`` among them), a list of device specs, or one device spec (the value of one
``--device`` flag). Field by field:

* ``name``: the resource name and the profile name (as a DNS label).
* ``groups[].count``: ``share`` (1 or unset: exclusive devices).
* ``paths[]`` of ``type: Device`` (the default): ``nodes``; ``permissions`` default to
  ``mrw`` there, so every node says ``permissions`` (``rwm``); ``mountPath`` is kept (a
  ``mountPath`` ending in ``/`` is a loss: the host source reads it as a directory).
* ``paths[]`` of ``type: Mount``: ``mounts``. The host source only makes read-only mounts,
  so a writable one is imported read-only, with a loss; a Mount path that is a glob (one
  mount per match) is a loss.
* ``limit``: in generic-device-plugin, a path's matches may be reused ``limit`` times while
  pairing with the other paths of its group (default 1: paired with the first match only).
  The host source joins an exact path to every device of its group, which is what ``limit``
  is used for (``/dev/vfio/vfio`` with a large limit), but without the cap: in a group that
  also has a glob, every exact path is a loss naming the cap. ``limit`` on a glob path in a
  group with other paths cannot be expressed (a loss). In a one-path group it changes nothing.
* ``usb[]``: ``usb`` with hex IDs as ``0x`` and four digits, over the raw USB nodes
  (``/dev/bus/usb/*/*``, which is what generic-device-plugin hands out). It puts all
  USB devices a group matches into one device; the host source makes one device per USB
  device, so a group whose matchers may match more than one device is a loss.
* ``domain`` (file) and the ``domain`` argument (which wins): the resource domain; the
  default is ``devic.es`` (generic-device-plugin 0.2.0 and later; older releases used
  ``squat.ai``).
* ``plugin-directory``, ``log-level``, ``listen``: deployment settings, not configuration of
  devices (notes).
"""

from __future__ import annotations

import glob as globbing
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AliasChoices, BeforeValidator, Field, ValidationError

from dradriver.devices.configfields import validate_extended_resource_name
from dradriver.devices.importing.result import (
    ImportResult,
    InputModel,
    ProfileNames,
    at,
    host_source,
    load_input,
    share_of,
    validation_failure,
)
from dradriver.errors import FieldError, FieldErrors

DEFAULT_DOMAIN = "devic.es"
OLD_DEFAULT_DOMAIN = "squat.ai"
DEFAULT_PERMISSIONS = "rwm"


def _permissions(value: str) -> str:
    if not set(value) <= set("rwm"):
        raise ValueError(f"{value!r} is not one or more of the letters r, w, m")
    return "".join(c for c in "rwm" if c in value)


def _absolute(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"{value!r} is not an absolute path")
    return value


def _absolute_or_unset(value: str) -> str:
    return _absolute(value) if value else value


def _usb_id(value: Any) -> str:
    """A USB vendor or product ID as ``0x`` and four hex digits. An unquoted YAML number is
    read as the hex digits it was written with (``vendor: 1209`` means 0x1209)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f'{value!r} is not a USB ID: write four hex digits, e.g. "1a86"')
    digits = str(value).strip().lower().removeprefix("0x")
    if not 1 <= len(digits) <= 4 or any(c not in "0123456789abcdef" for c in digits):
        raise ValueError(f'{value!r} is not a USB ID: write four hex digits, e.g. "1a86"')
    return "0x" + digits.rjust(4, "0")


def _serial(value: Any) -> Any:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


class GdpPath(InputModel):
    path: Annotated[str, AfterValidator(_absolute)]
    mount_path: Annotated[str, AfterValidator(_absolute_or_unset)] = Field(
        default="", alias="mountPath"
    )
    permissions: Annotated[str, AfterValidator(_permissions)] = ""
    read_only: bool = Field(default=False, alias="readOnly")
    type: Literal["Device", "Mount", ""] = ""
    limit: int = Field(default=0, ge=0)


class GdpUsb(InputModel):
    vendor: Annotated[str, BeforeValidator(_usb_id)]
    product: Annotated[str, BeforeValidator(_usb_id)]
    serial: Annotated[str, BeforeValidator(_serial)] = ""


class GdpGroup(InputModel):
    count: int = Field(default=0, ge=0)
    paths: list[GdpPath] = []
    usb: list[GdpUsb] = []


class GdpDevice(InputModel):
    name: Annotated[str, Field(min_length=1)]
    groups: list[GdpGroup] = []


class GdpConfig(InputModel):
    devices: list[GdpDevice] = Field(default=[], validation_alias=AliasChoices("devices", "device"))
    domain: str | None = None
    plugin_directory: str | None = Field(default=None, alias="plugin-directory")
    log_level: str | None = Field(default=None, alias="log-level")
    listen: str | None = None


def _is_glob(path: str) -> bool:
    return globbing.has_magic(path)


def _read(text: str, file: str) -> tuple[GdpConfig, str | None]:
    """The input as a config and the field path of its device list (None: one device spec)."""
    data = load_input(text, file)
    if isinstance(data, list):
        try:
            return GdpConfig.model_validate({"devices": data}), ""
        except ValidationError as err:
            raise validation_failure(err, GdpConfig, file, wrapper="devices") from err
    if isinstance(data, dict) and "name" in data:
        try:
            return GdpConfig(devices=[GdpDevice.model_validate(data)]), None
        except ValidationError as err:
            raise validation_failure(err, GdpDevice, file) from err
    if isinstance(data, dict):
        try:
            return GdpConfig.model_validate(data), "devices"
        except ValidationError as err:
            raise validation_failure(err, GdpConfig, file) from err
    kind = "nothing" if data is None else type(data).__name__
    raise FieldErrors(
        "expected a mapping with devices: [...], a list of devices or one device "
        f"({{name: ..., groups: [...]}}), not {kind}",
        subject=file,
    )


def import_generic_device_plugin(
    text: str, domain: str | None = None, file: str = "<input>"
) -> ImportResult:
    """generic-device-plugin's configuration as a dradriver configuration of ``host``
    profiles; raises :class:`~dradriver.errors.FieldErrors` naming the field for bad input."""
    config, prefix = _read(text, file)
    result = ImportResult(config={"sources": []})
    resource_domain = _domain(config, domain, result, file)
    names = ProfileNames()
    seen: dict[str, str] = {}
    for index, device in enumerate(config.devices):
        where = "" if prefix is None else at(prefix, index)
        if device.name in seen:
            raise FieldErrors(
                FieldError(at(where, "name"), f"{device.name!r} is also {seen[device.name]}"),
                subject=file,
            )
        seen[device.name] = at(where, "name")
        resource = f"{resource_domain}/{device.name}"
        try:
            validate_extended_resource_name(resource)
        except ValueError as err:
            raise FieldErrors(FieldError(at(where, "name"), str(err)), subject=file) from err
        if not device.groups:
            result.losses.append(f"{at(where, 'groups')}: no groups: the device serves nothing")
        for g_index, group in enumerate(device.groups):
            wanted = device.name if len(device.groups) == 1 else f"{device.name}-{g_index}"
            profile = _profile(group, at(where, "groups", g_index), result, file)
            if profile is not None:
                profile = {"name": names.take(wanted), **profile, "extendedResourceName": resource}
                result.config["sources"].append(host_source(profile))
    _deployment_notes(config, result)
    return result


def _domain(config: GdpConfig, given: str | None, result: ImportResult, file: str) -> str:
    if given:
        return given
    if config.domain:
        return config.domain
    result.notes.append(
        f"domain: not set; resources are named {DEFAULT_DOMAIN}/<name> as in "
        f"generic-device-plugin 0.2.0 and later (releases before 0.2.0 used {OLD_DEFAULT_DOMAIN}: "
        "pass --domain squat.ai)"
    )
    return DEFAULT_DOMAIN


def _deployment_notes(config: GdpConfig, result: ImportResult) -> None:
    for key, value in (
        ("plugin-directory", config.plugin_directory),
        ("log-level", config.log_level),
        ("listen", config.listen),
    ):
        if value is not None:
            result.notes.append(
                f"{key}: {value!r} is a setting of the plugin's deployment, not of its devices; "
                "dradriver's equivalents are flags of dradriver-kubeletplugin and Helm values"
            )


def _profile(group: GdpGroup, where: str, result: ImportResult, file: str) -> dict[str, Any] | None:
    """The host profile fields (all but name and resource) of one group, or None if the group
    yields no device."""
    if group.paths and group.usb:
        raise FieldErrors(
            FieldError(where, "set paths or usb, not both (generic-device-plugin allows one)"),
            subject=file,
        )
    share = share_of(group.count, at(where, "count"), result.losses)
    if group.usb:
        # generic-device-plugin hands out the matched device's /dev/bus/usb/BBB/DDD node; the
        # host source finds it the same way: every USB node, kept when its device matches.
        return {
            "nodes": [{"path": USB_NODES, "permissions": "rwm"}],
            "usb": _usb(group, where, result),
            "share": share,
        }
    nodes, mounts = _paths(group, where, result)
    if not nodes:
        what = "only Mount paths" if group.paths else "no paths and no usb"
        result.losses.append(
            f"{where}: {what}: a host profile needs a device node, so this group is not imported"
        )
        return None
    return {"nodes": nodes, "share": share, "mounts": mounts}


USB_NODES = "/dev/bus/usb/*/*"
"""The raw USB device nodes (usbfs), one per USB device, filtered by the profile's ``usb``."""


def _usb(group: GdpGroup, where: str, result: ImportResult) -> list[dict[str, str]]:
    if len(group.usb) > 1 or any(not m.serial for m in group.usb):
        result.losses.append(
            f"{at(where, 'usb')}: generic-device-plugin puts every USB device these matchers "
            "find into ONE device; the host source makes one device per USB device (give each "
            "matcher a serial, or use one group per device, to keep them apart)"
        )
    return [
        {"vendor": m.vendor, "product": m.product, **({"serial": m.serial} if m.serial else {})}
        for m in group.usb
    ]


def _paths(
    group: GdpGroup, where: str, result: ImportResult
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    nodes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    has_glob = any(_is_glob(p.path) for p in group.paths)
    several = len(group.paths) > 1
    for p_index, path in enumerate(group.paths):
        here = at(where, "paths", p_index)
        _limit(path, here, several=several, has_glob=has_glob, losses=result.losses)
        if path.type == "Mount":
            mount = _mount(path, here, result)
            if mount is not None:
                mounts.append(mount)
            continue
        if path.read_only:
            result.notes.append(
                f"{at(here, 'readOnly')}: dropped; it applies to Mount paths only (in "
                "generic-device-plugin too)"
            )
        node: dict[str, Any] = {"path": path.path}
        if path.mount_path:
            node["mountPath"] = path.mount_path
            if path.mount_path.endswith("/"):
                result.losses.append(
                    f"{at(here, 'mountPath')}: {path.mount_path!r} ends in '/': the host source "
                    "reads it as a directory and mounts each match under its own basename there"
                )
        node["permissions"] = _permissions(path.permissions) or DEFAULT_PERMISSIONS
        nodes.append(node)
    return nodes, mounts


def _limit(path: GdpPath, here: str, *, several: bool, has_glob: bool, losses: list[str]) -> None:
    if not several or not has_glob:
        return  # one path, or only exact paths: limit changes nothing
    cap = max(path.limit, 1)
    if _is_glob(path.path):
        if cap > 1:
            losses.append(
                f"{at(here, 'limit')}: {path.limit}: reusing a glob's matches while pairing "
                "them with the group's other paths cannot be expressed; each match is used once"
            )
        return
    if path.type == "Mount":
        return
    losses.append(
        f"{at(here, 'limit')}: {path.limit or '1 (the default)'}: the exact path {path.path!r} "
        f"joins every device of the group; generic-device-plugin made at most {cap} "
        f"device{'s' if cap > 1 else ''} with it"
    )


def _mount(path: GdpPath, here: str, result: ImportResult) -> dict[str, Any] | None:
    if path.permissions:
        result.notes.append(
            f"{at(here, 'permissions')}: dropped; it applies to Device paths only (in "
            "generic-device-plugin too)"
        )
    if _is_glob(path.path):
        result.losses.append(
            f"{at(here, 'path')}: {path.path!r}: a Mount path that is a glob (one mount per "
            "match) cannot be expressed; the host source's mounts are exact paths, so it is "
            "not imported"
        )
        return None
    if not path.read_only:
        result.losses.append(
            f"{at(here, 'readOnly')}: false: the host source makes read-only mounts only; "
            f"{path.path!r} is imported read-only"
        )
    return {"hostPath": path.path, "containerPath": path.mount_path or path.path, "readOnly": True}
