"""CDI spec files for prepared claims: one file per claim, written where the runtime looks.

The kubelet never reads these files; the container runtime does, when it creates
a container that names one of the returned CDI ids. So everything here is about
what a runtime's CDI library will accept: strict file format, the lowest
``cdiVersion`` that covers the content (older runtimes reject newer versions),
device names unique across the whole directory, and files that appear
atomically because runtimes watch the directory.

Device names on disk are ``<claim uid>-<device name>``: a per-claim file may
only define names no other file of the same kind defines (the runtime treats a
duplicate in one directory as a conflict and refuses both), and a new claim for
the same device must never be served from a stale cached spec.

The runtime also reads the host: a device node's host path must be a character or
block device when a container is created. :func:`check_host_device_nodes` checks that
before a claim's spec is written, so the claim fails instead of its containers.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from dradriver.host.atomicfile import atomic_write, fsync_dir
from dradriver.host.containeredits import ContainerEdits, DeviceNode, Mount
from dradriver.log import get_logger

log = get_logger("cdi")

SPEC_FILE_MODE = 0o644
SPEC_DIR_MODE = 0o755

# cdiVersion rule: start from the oldest version runtimes still accept and bump
# only for features the content actually uses (cdi.md section 4):
#   0.5.0  a device node with hostPath, or a device name starting with a digit
#   0.6.0  a "." in the class name
# Mount "type" (0.4.0), annotations (0.6.0), intelRdt/additionalGids (0.7.0) and
# netDevices (1.1.0) cannot be expressed by ContainerEdits, so they never apply;
# extend minimum_cdi_version() when ContainerEdits grows one of them.
BASELINE_CDI_VERSION = "0.3.0"
KNOWN_CDI_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")

# Naming rules from cdi.md section 3 (ASCII only, like the Go parser).
_VENDOR_OR_CLASS_RE = re.compile(r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?")
_DEVICE_NAME_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?")
# Claim UIDs go into file names and device names. Kubernetes UIDs are UUIDs; no
# "_" so a UID can never swallow the "_claim-" separator of another kind's file.
_CLAIM_UID_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?")
_MAX_CLASS_LEN = 63

_SPEC_KEYS = frozenset({"cdiVersion", "kind", "annotations", "devices", "containerEdits"})
_DEVICE_KEYS = frozenset({"name", "annotations", "containerEdits"})
_EDIT_KEYS = frozenset({"env", "deviceNodes", "mounts"})
_SPEC_SUFFIXES = (".json", ".yaml")


class CDIError(Exception):
    """Base class for CDI spec errors."""


class CDIValueError(CDIError, ValueError):
    """The caller asked for a spec the runtime would reject."""


class InvalidCDINameError(CDIValueError):
    """A vendor, class, device name, claim UID or CDI id breaks the CDI naming rules."""


class UnknownCDIDeviceError(CDIError, LookupError):
    """No spec file of this registry's kind defines the requested device."""


class HostDeviceNodeError(CDIValueError):
    """A device node's host path is no character or block device; the runtime would refuse it."""


class CDIConflictError(CDIError):
    """Two spec files in one directory define the same device; runtimes refuse it."""


class CDISpecError(CDIError):
    """A spec file on disk is unreadable or invalid."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"CDI spec file {path}: {reason}")
        self.path = path
        self.reason = reason


def validate_vendor(vendor: str) -> str:
    if not _VENDOR_OR_CLASS_RE.fullmatch(vendor):
        raise InvalidCDINameError(
            f"invalid CDI vendor {vendor!r}: use letters, digits, '_', '-', '.'; "
            "start with a letter and end with a letter or digit"
        )
    return vendor


def validate_class(cdi_class: str) -> str:
    if not _VENDOR_OR_CLASS_RE.fullmatch(cdi_class) or len(cdi_class) > _MAX_CLASS_LEN:
        raise InvalidCDINameError(
            f"invalid CDI class {cdi_class!r}: at most {_MAX_CLASS_LEN} letters, digits, "
            "'_', '-', '.'; start with a letter and end with a letter or digit"
        )
    return cdi_class


def validate_device_name(name: str) -> str:
    if not _DEVICE_NAME_RE.fullmatch(name):
        raise InvalidCDINameError(
            f"invalid CDI device name {name!r}: use letters, digits, '_', '-', '.', ':'; "
            "start and end with a letter or digit"
        )
    return name


def validate_claim_uid(claim_uid: str) -> str:
    if not _CLAIM_UID_RE.fullmatch(claim_uid):
        raise InvalidCDINameError(
            f"invalid claim UID {claim_uid!r} for a CDI spec: use letters, digits, '-', '.'; "
            "start and end with a letter or digit"
        )
    return claim_uid


def parse_cdi_id(cdi_id: str) -> tuple[str, str, str]:
    """Split ``vendor/class=name`` the way the runtime's parser does, validating each part."""
    kind, sep, name = cdi_id.partition("=")
    vendor, slash, cdi_class = kind.partition("/")
    if not sep or not slash:
        raise InvalidCDINameError(
            f"malformed CDI id {cdi_id!r}: expected <vendor>/<class>=<device name>"
        )
    return validate_vendor(vendor), validate_class(cdi_class), validate_device_name(name)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def minimum_cdi_version(
    cdi_class: str, device_names: Iterable[str], edits: Iterable[ContainerEdits]
) -> str:
    """The oldest cdiVersion that can express this content, so older runtimes load it."""
    version = BASELINE_CDI_VERSION
    if any(name[:1].isdigit() for name in device_names) or any(
        node.host_path for e in edits for node in e.device_nodes
    ):
        version = "0.5.0"
    if "." in cdi_class:
        version = "0.6.0"
    return version


def _check_edits(edits: ContainerEdits, where: str) -> None:
    """Reject edits the runtime's validation would refuse, before they reach a file."""
    for key in edits.env:
        if not key or "=" in key:
            raise CDIValueError(f"{where}: invalid environment variable name {key!r}")
    for node in edits.device_nodes:
        if not node.path:
            raise CDIValueError(f"{where}: device node with an empty path")
    for mount in edits.mounts:
        if not mount.host_path or not mount.container_path:
            raise CDIValueError(f"{where}: mount needs both hostPath and containerPath")


@dataclass(frozen=True)
class CDIDevice:
    """One device of a claim's spec; ``name`` is unique within the claim."""

    name: str
    edits: ContainerEdits

    def __post_init__(self) -> None:
        validate_device_name(self.name)


def host_device_node_problem(host_path: str) -> str | None:
    """Why a runtime would refuse ``host_path`` as a device node's host path, or None.

    The runtime's CDI library (container-device-interface v1.1.1 in containerd 2.4) takes
    the node's type and numbers from ``lstat`` of the host path at container creation and
    fails the container for anything but a device node. ``lstat`` here too: a symlink is
    refused exactly as the runtime refuses it, and a symlink loop is never walked.
    """
    try:
        st = os.lstat(host_path)
    except FileNotFoundError:
        return "does not exist"
    except OSError as e:
        return f"cannot be examined ({e.strerror or e})"
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        return None
    if stat.S_ISLNK(st.st_mode):
        return (
            "is a symbolic link, which container runtimes do not follow for device nodes; "
            "use the path of the device node itself"
        )
    kinds = {
        stat.S_IFREG: "a regular file",
        stat.S_IFDIR: "a directory",
        stat.S_IFIFO: "a FIFO",
        stat.S_IFSOCK: "a socket",
    }
    kind = kinds.get(stat.S_IFMT(st.st_mode), "not a device node")
    return f"is {kind}, not a character or block device"


def check_host_device_nodes(devices: Iterable[CDIDevice]) -> None:
    """Refuse devices whose device nodes a runtime would refuse when creating a container.

    Called before a spec is written for a claim (or a device-plugin allocation): a bad
    node then fails that one claim with a message naming device and path, instead of
    every container that uses it failing later with CreateContainerError.
    """
    problems = []
    for device in devices:
        for node in device.edits.device_nodes:
            host_path = node.host_path or node.path
            problem = host_device_node_problem(host_path)
            if problem is not None:
                problems.append(
                    f"device {device.name}: host path {host_path} of device node "
                    f"{node.path} {problem}"
                )
    if problems:
        refusal = "the container runtime would refuse every container using it"
        raise HostDeviceNodeError("; ".join(problems) + f" ({refusal})")


@dataclass(frozen=True)
class _LoadedSpec:
    path: Path
    raw: dict[str, Any]
    spec_edits: ContainerEdits
    devices: dict[str, ContainerEdits]


def _edits_from_cdi(obj: Any, path: Path, where: str) -> ContainerEdits:
    if not isinstance(obj, dict):
        raise CDISpecError(path, f"{where} is not an object")
    unknown = set(obj) - _EDIT_KEYS
    if unknown:
        names = ", ".join(sorted(map(str, unknown)))
        raise CDISpecError(path, f"{where} has fields dradriver does not write: {names}")
    env: dict[str, str] = {}
    raw_env = obj.get("env", [])
    if not isinstance(raw_env, list):
        raise CDISpecError(path, f"{where}.env is not a list")
    for item in raw_env:
        if not isinstance(item, str) or item.find("=") <= 0:
            raise CDISpecError(path, f"{where}.env entry {item!r} is not NAME=VALUE")
        key, _, value = item.partition("=")
        env[key] = value
    try:
        nodes = tuple(DeviceNode.model_validate(n) for n in _list(obj, "deviceNodes", path, where))
        mounts = tuple(Mount.model_validate(m) for m in _list(obj, "mounts", path, where))
    except ValidationError as err:
        raise CDISpecError(path, f"{where}: {err}") from err
    return ContainerEdits(env=env, device_nodes=nodes, mounts=mounts)


def _list(obj: dict[str, Any], key: str, path: Path, where: str) -> list[Any]:
    value = obj.get(key, [])
    if not isinstance(value, list):
        raise CDISpecError(path, f"{where}.{key} is not a list")
    return value


class CDIRegistry:
    """The CDI spec files of one vendor/class in one directory, one file per claim."""

    def __init__(
        self, cdi_dir: Path, vendor: str, cdi_class: str = "device", durable: bool = True
    ) -> None:
        self.cdi_dir = Path(cdi_dir)
        self.durable = durable
        self.vendor = validate_vendor(vendor)
        self.cdi_class = validate_class(cdi_class)
        self.kind = f"{vendor}/{cdi_class}"
        # Same shape as the CDI library's transient spec names (<vendor>-<class>_<id>).
        self._file_prefix = f"{vendor}-{cdi_class}_claim-"
        self._claim_file_re = re.compile(
            re.escape(self._file_prefix) + f"({_CLAIM_UID_RE.pattern})" + re.escape(".json")
        )

    # --- names -----------------------------------------------------------------

    def spec_path(self, claim_uid: str) -> Path:
        return self.cdi_dir / f"{self._file_prefix}{validate_claim_uid(claim_uid)}.json"

    def device_name(self, claim_uid: str, name: str) -> str:
        """The CDI device name on disk: unique across claims, so files never collide."""
        return validate_device_name(f"{validate_claim_uid(claim_uid)}-{name}")

    def cdi_id(self, claim_uid: str, name: str) -> str:
        return f"{self.kind}={self.device_name(claim_uid, name)}"

    # --- writing ---------------------------------------------------------------

    def render_claim(
        self,
        claim_uid: str,
        devices: Sequence[CDIDevice],
        claim_edits: ContainerEdits | None = None,
    ) -> bytes:
        """The exact bytes :meth:`write_claim` puts on disk (deterministic, for comparison)."""
        validate_claim_uid(claim_uid)
        if not devices:
            raise CDIValueError(f"claim {claim_uid}: a CDI spec needs at least one device")
        seen: set[str] = set()
        for device in devices:
            if device.name in seen:
                raise CDIValueError(f"claim {claim_uid}: duplicate CDI device name {device.name!r}")
            seen.add(device.name)
            if device.edits.is_empty():
                raise CDIValueError(
                    f"claim {claim_uid}: device {device.name!r} has no container edits; "
                    "the CDI spec requires some (an env variable is enough)"
                )
            _check_edits(device.edits, f"claim {claim_uid} device {device.name!r}")
        spec_edits = claim_edits or ContainerEdits()
        _check_edits(spec_edits, f"claim {claim_uid} claim-level edits")

        names = [self.device_name(claim_uid, d.name) for d in devices]
        version = minimum_cdi_version(
            self.cdi_class, names, [spec_edits, *(d.edits for d in devices)]
        )
        spec: dict[str, Any] = {
            "cdiVersion": version,
            "kind": self.kind,
            "devices": [
                {"name": name, "containerEdits": d.edits.to_cdi()}
                for name, d in zip(names, devices, strict=True)
            ],
        }
        if not spec_edits.is_empty():
            spec["containerEdits"] = spec_edits.to_cdi()
        # Compact: an indented dump takes the slow pure-Python encoder, and a spec is
        # written for every prepared claim (`jq .` reads it).
        return (json.dumps(spec, separators=(",", ":")) + "\n").encode("utf-8")

    def write_claim(
        self,
        claim_uid: str,
        devices: Sequence[CDIDevice],
        claim_edits: ContainerEdits | None = None,
    ) -> dict[str, str]:
        """Write the claim's spec file; returns device name -> fully-qualified CDI id.

        Unchanged content leaves the file alone: a rewrite would wake every
        runtime watching the directory for nothing.
        """
        data = self.render_claim(claim_uid, devices, claim_edits)
        ids = {d.name: self.cdi_id(claim_uid, d.name) for d in devices}
        path = self.spec_path(claim_uid)
        self._ensure_dir()
        try:
            current = path.read_bytes()
        except FileNotFoundError:
            current = None
        if current == data:
            if path.stat().st_mode & 0o7777 != SPEC_FILE_MODE:
                os.chmod(path, SPEC_FILE_MODE)
            log.debug("cdi spec unchanged", claim=claim_uid, path=str(path))
            return ids
        atomic_write(path, data, SPEC_FILE_MODE, durable=self.durable)
        log.debug(  # the prepare's own line names the devices
            "cdi spec written",
            claim=claim_uid,
            path=str(path),
            devices=",".join(ids.values()),
        )
        return ids

    def _ensure_dir(self) -> None:
        if self.cdi_dir.is_dir():
            return
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.cdi_dir, SPEC_DIR_MODE)

    def remove_claim(self, claim_uid: str) -> None:
        path = self.spec_path(claim_uid)
        try:
            path.unlink()
        except FileNotFoundError:
            return
        if self.durable:
            fsync_dir(self.cdi_dir)
        log.debug("cdi spec removed", claim=claim_uid, path=str(path))

    # --- reading ---------------------------------------------------------------

    def claim_uids_on_disk(self) -> set[str]:
        """Claims this vendor/class has spec files for (other files are not ours to judge)."""
        try:
            names = os.listdir(self.cdi_dir)
        except FileNotFoundError:
            return set()
        uids = set()
        for name in names:
            match = self._claim_file_re.fullmatch(name)
            if match:
                uids.add(match.group(1))
        return uids

    def read_claim(self, claim_uid: str) -> dict[str, Any] | None:
        """The validated spec of a claim, or None if it has no file."""
        path = self.spec_path(claim_uid)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        spec = self._validate(path, self._decode(path, raw))
        return spec.raw

    def resolve(self, cdi_id: str) -> ContainerEdits:
        """What a container naming ``cdi_id`` gets: spec-level edits, then the device's."""
        return self.resolve_many([cdi_id])

    def resolve_many(self, cdi_ids: Iterable[str]) -> ContainerEdits:
        """Edits for a container naming all ``cdi_ids``, combined like the runtime does.

        Each spec's own edits are applied once, before its first requested device.
        """
        wanted = list(cdi_ids)
        for cdi_id in wanted:
            vendor, cdi_class, _ = parse_cdi_id(cdi_id)
            if f"{vendor}/{cdi_class}" != self.kind:
                raise UnknownCDIDeviceError(
                    f"CDI id {cdi_id!r} is not of kind {self.kind} managed here"
                )
        index = self._index()
        result = ContainerEdits()
        applied: set[Path] = set()
        for cdi_id in wanted:
            name = parse_cdi_id(cdi_id)[2]
            found = index.get(name, [])
            if not found:
                raise UnknownCDIDeviceError(
                    f"CDI device {cdi_id!r} is not defined by any spec file in {self.cdi_dir}"
                )
            if len(found) > 1:
                files = ", ".join(str(s.path) for s in found)
                raise CDIConflictError(
                    f"CDI device {cdi_id!r} is defined by several spec files ({files}); "
                    "runtimes refuse conflicting devices"
                )
            spec = found[0]
            if spec.path not in applied:
                applied.add(spec.path)
                result = result.merged(spec.spec_edits)
            result = result.merged(spec.devices[name])
        return result

    def _index(self) -> dict[str, list[_LoadedSpec]]:
        """Device name -> the specs of this kind that define it, across the directory."""
        index: dict[str, list[_LoadedSpec]] = {}
        try:
            names = sorted(os.listdir(self.cdi_dir))
        except FileNotFoundError:
            return index
        for file_name in names:
            path = self.cdi_dir / file_name
            if not file_name.endswith(_SPEC_SUFFIXES) or not path.is_file():
                continue
            ours_by_name = file_name.startswith(f"{self.vendor}-{self.cdi_class}_")
            try:
                raw = self._decode(path, path.read_bytes())
            except CDISpecError:
                if ours_by_name:
                    raise
                log.warning("skipping unreadable CDI spec of another kind", path=str(path))
                continue
            if raw.get("kind") != self.kind:
                continue
            spec = self._validate(path, raw)
            for device_name in spec.devices:
                index.setdefault(device_name, []).append(spec)
        return index

    @staticmethod
    def _decode(path: Path, raw: bytes) -> dict[str, Any]:
        try:
            obj = yaml.safe_load(raw) if path.suffix == ".yaml" else json.loads(raw)
        except (ValueError, yaml.YAMLError) as err:
            raise CDISpecError(path, f"not valid {path.suffix[1:].upper()}: {err}") from err
        except RecursionError as err:
            raise CDISpecError(path, "nested too deeply to be a CDI spec") from err
        if not isinstance(obj, dict):
            raise CDISpecError(path, "top level is not an object")
        return obj

    def _validate(self, path: Path, raw: dict[str, Any]) -> _LoadedSpec:
        """Check a spec of our kind as strictly as the runtime would, naming what is wrong."""
        unknown = set(raw) - _SPEC_KEYS
        if unknown:
            raise CDISpecError(path, f"unknown fields: {', '.join(sorted(map(str, unknown)))}")
        version = raw.get("cdiVersion")
        if not isinstance(version, str) or version not in KNOWN_CDI_VERSIONS:
            raise CDISpecError(path, f"missing or unknown cdiVersion {version!r}")
        if raw.get("kind") != self.kind:
            raise CDISpecError(path, f"kind is {raw.get('kind')!r}, expected {self.kind!r}")
        devices = raw.get("devices")
        if not isinstance(devices, list) or not devices:
            raise CDISpecError(path, "devices must be a non-empty list")
        spec_edits = ContainerEdits()
        if "containerEdits" in raw:
            spec_edits = _edits_from_cdi(raw["containerEdits"], path, "containerEdits")
        parsed: dict[str, ContainerEdits] = {}
        for i, device in enumerate(devices):
            where = f"devices[{i}]"
            if not isinstance(device, dict):
                raise CDISpecError(path, f"{where} is not an object")
            unknown = set(device) - _DEVICE_KEYS
            if unknown:
                raise CDISpecError(
                    path, f"{where} has unknown fields: {', '.join(sorted(map(str, unknown)))}"
                )
            name = device.get("name")
            if not isinstance(name, str) or not _DEVICE_NAME_RE.fullmatch(name):
                raise CDISpecError(path, f"{where} has a missing or invalid name {name!r}")
            if name in parsed:
                raise CDISpecError(path, f"device name {name!r} appears twice")
            if "containerEdits" not in device:
                raise CDISpecError(path, f"{where} ({name}) has no containerEdits")
            edits = _edits_from_cdi(device["containerEdits"], path, f"{where}.containerEdits")
            if edits.is_empty():
                raise CDISpecError(path, f"{where} ({name}) has empty containerEdits")
            parsed[name] = edits
        needed = minimum_cdi_version(self.cdi_class, parsed, [spec_edits, *parsed.values()])
        if _version_key(version) < _version_key(needed):
            raise CDISpecError(
                path, f"cdiVersion {version} is below {needed}, which its content requires"
            )
        return _LoadedSpec(path=path, raw=raw, spec_edits=spec_edits, devices=parsed)
