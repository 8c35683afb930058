"""Device metadata for containers (KEP-5304, beta in Kubernetes 1.37).

What the 1.37 kubelet-plugin helper (k8s.io/dynamic-resource-allocation v0.37.2,
``EnableDeviceMetadata``) gives workloads, written the same way so that its consumers
(``devicemetadata.DecodeMetadataFromStream`` and anything reading the documented path)
read ours unchanged:

* per claim and request, a file on the host under the plugin's data dir,
  ``<kubelet-root>/plugins/<driver>/dra-device-metadata/<namespace>_<claim>/<request>/metadata.json``;
* a CDI device (kind ``<driver>/metadata``, one spec per claim) that bind-mounts it
  read-only into the container at
  ``/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json``,
  or ``.../resourceclaimtemplates/<pod claim name>/<request>/...`` for a claim made from a
  template (the pod's name for it, from the ``resource.kubernetes.io/pod-claim-name``
  annotation, since the generated claim name is not known when the pod is written);
* the CDI ID added to the first device of each request in the NodePrepareResources answer.

The file is a JSON stream: the same ``DeviceMetadata`` object once per API version, newest
first (``metadata.resource.k8s.io/v1beta1``, then ``v1alpha1``, which has the same fields),
so an older consumer skips what it does not know. Each object names the claim (name,
namespace, uid, generation 1), ``podClaimName`` and one request with its devices: driver,
pool, name and the attributes as the ResourceSlice publishes them. The format has no
place for opaque config; that still reaches containers as ``DRADRIVER_*`` env.

Every path component taken from a claim or its pod is checked against the Kubernetes name
rules before it becomes part of a path (:func:`check_components`): the namespace, the pod's
claim name and the request name are DNS labels, the claim name a DNS subdomain. None of
them can then hold ``/``, ``..``, ``_``, NUL or a newline, so a file never lands outside its
claim's directory and ``<namespace>_<claim>`` names one claim only. A claim with a bad
value is prepared without metadata, the reason (which field, which rule) logged.

Like the helper, a metadata write that fails is logged and the claim is prepared without
it: the file is information, not a device. The file system work stays off the event loop:
rendered there (:meth:`DeviceMetadataWriter.plan`), written (:meth:`DeviceMetadataWriter.write`)
in the worker thread that records a new claim in the ledger, or in a thread of its own.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dradriver.host.atomicfile import atomic_write
from dradriver.host.cdi import CDIDevice, CDIError, CDIRegistry
from dradriver.host.containeredits import ContainerEdits, Mount
from dradriver.k8s.names import validate_dns_label, validate_dns_subdomain
from dradriver.k8s.objects import Obj, allocation_of
from dradriver.log import get_logger
from dradriver.plugin.interface import ClaimRef, PreparedDevice

log = get_logger("kubeletplugin.devicemetadata")

GROUP = "metadata.resource.k8s.io"
VERSIONS = ("v1beta1", "v1alpha1")  # newest first, as the helper writes them
KIND = "DeviceMetadata"
CDI_CLASS = "metadata"
HOST_SUBDIR = "dra-device-metadata"
HOST_FILE = "metadata.json"
CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
CLAIMS_SUBDIR = "resourceclaims"
TEMPLATES_SUBDIR = "resourceclaimtemplates"
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
FILE_MODE = 0o644  # read by the container's user, whoever that is
DIR_MODE = 0o755


def check_components(
    *,
    namespace: str | None = None,
    claim: str | None = None,
    pod_claim_name: str | None = None,
    request: str | None = None,
) -> None:
    """Raises ``ValueError`` naming the field and its rule unless each given value may be a
    path component: a DNS label (namespace, pod claim name, request) or a DNS subdomain
    (claim name), as the apiserver requires of them."""
    if namespace is not None:
        validate_dns_label(namespace, "claim namespace")
    if claim is not None:
        validate_dns_subdomain(claim, "claim name")
    if pod_claim_name is not None:
        validate_dns_label(
            pod_claim_name,
            f"annotation {POD_CLAIM_NAME_ANNOTATION} (the pod's spec.resourceClaims[].name)",
        )
    if request is not None:
        validate_dns_label(request, "request name")


def container_path(driver: str, claim: str, pod_claim_name: str | None, request: str) -> str:
    """Where a container finds the file (the helper's documented layout); ``ValueError``
    if a component is not a valid name (:func:`check_components`)."""
    check_components(claim=claim, pod_claim_name=pod_claim_name or None, request=request)
    if pod_claim_name:
        return (
            f"{CONTAINER_DIR}/{TEMPLATES_SUBDIR}/{pod_claim_name}/{request}/{driver}-metadata.json"
        )
    return f"{CONTAINER_DIR}/{CLAIMS_SUBDIR}/{claim}/{request}/{driver}-metadata.json"


def render(
    driver: str,
    claim: ClaimRef,
    pod_claim_name: str | None,
    request: str,
    devices: Sequence[tuple[str, str, Mapping[str, Any]]],
) -> bytes:
    """The file's bytes: one object per version, newest first, each on its own lines."""
    body: Obj = {
        "metadata": {
            "name": claim.name,
            "namespace": claim.namespace,
            "uid": claim.uid,
            "generation": 1,
        },
    }
    if pod_claim_name:
        body["podClaimName"] = pod_claim_name
    entries = []
    for pool, name, attributes in devices:
        entry: Obj = {"driver": driver, "pool": pool, "name": name}
        if attributes:
            entry["attributes"] = dict(attributes)
        entries.append(entry)
    body["requests"] = [{"name": request, "devices": entries}]
    parts = [
        json.dumps({"kind": KIND, "apiVersion": f"{GROUP}/{version}", **body}, indent=2) + "\n"
        for version in VERSIONS
    ]
    return "".join(parts).encode("utf-8")


@dataclass(frozen=True)
class MetadataFiles:
    """One claim's metadata, rendered: the files and the CDI devices that mount them."""

    claim: ClaimRef
    files: tuple[tuple[Path, bytes], ...]  # host path, content
    cdi_devices: tuple[CDIDevice, ...]
    ids: Mapping[str, str]  # request -> the metadata CDI ID


class DeviceMetadataWriter:
    """Writes and removes the metadata files and their CDI spec, claim by claim."""

    def __init__(
        self,
        driver: str,
        data_dir: Path,
        cdi_dir: Path,
        attributes_of: Callable[[str], Mapping[str, Any]],
    ) -> None:
        self.driver = driver
        self.root = Path(data_dir) / HOST_SUBDIR
        self.cdi = CDIRegistry(Path(cdi_dir), driver, CDI_CLASS, durable=False)
        # device name -> its attributes as published in the slice ({} if unknown)
        self._attributes_of = attributes_of

    def claim_dir(self, claim: ClaimRef) -> Path:
        """``<root>/<namespace>_<claim>``; ``ValueError`` if either is not a valid name."""
        check_components(namespace=claim.namespace, claim=claim.name)
        return self.root / f"{claim.namespace}_{claim.name}"

    def host_path(self, claim: ClaimRef, request: str) -> Path:
        """The claim's file for ``request``; ``ValueError`` if a component is not a valid name."""
        check_components(request=request)
        return self.claim_dir(claim) / request / HOST_FILE

    def plan(
        self, claim: ClaimRef, obj: Obj, devices: list[PreparedDevice]
    ) -> MetadataFiles | None:
        """What :meth:`write` puts on disk for the claim (no file system access, so it runs
        on the event loop); ``None`` if there is nothing to write or it cannot be rendered,
        e.g. because a name that would be a path component is not a valid name (logged)."""
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        pod_claim_name = annotations.get(POD_CLAIM_NAME_ANNOTATION)
        if not isinstance(pod_claim_name, str) or not pod_claim_name:
            pod_claim_name = None
        # The file is named by the request, its content by the subrequest that was chosen
        # ("gpu/large"), as the allocation results say.
        results = ((allocation_of(obj) or {}).get("devices") or {}).get("results") or []
        chosen = {
            str(r.get("request", "")).split("/")[0]: str(r.get("request"))
            for r in results
            if r.get("driver") == self.driver
        }
        by_request: dict[str, list[PreparedDevice]] = {}
        for d in devices:
            for request in d.request_names:
                by_request.setdefault(request, []).append(d)
        if not by_request:
            return None
        try:
            files, cdi_devices = [], []
            for request, members in sorted(by_request.items()):
                data = render(
                    self.driver,
                    claim,
                    pod_claim_name,
                    chosen.get(request, request),
                    [(d.pool, d.device, self._attributes_of(d.device)) for d in members],
                )
                path = self.host_path(claim, request)
                files.append((path, data))
                mount = Mount.model_validate(
                    {
                        "hostPath": str(path),
                        "containerPath": container_path(
                            self.driver, claim.name, pod_claim_name, request
                        ),
                        "options": ("ro", "bind"),
                    }
                )
                cdi_devices.append(CDIDevice(request, ContainerEdits(mounts=(mount,))))
            ids = {d.name: self.cdi.cdi_id(claim.uid, d.name) for d in cdi_devices}
        except (CDIError, ValueError) as e:
            log.error("device metadata not written", claim=str(claim), error=str(e))
            return None
        return MetadataFiles(claim, tuple(files), tuple(cdi_devices), ids)

    def write(self, files: MetadataFiles) -> bool:
        """Write the files and their CDI spec (blocking: called in a worker thread); False,
        logged, if that failed: the claim is then prepared without them. Never raises for
        a file system or spec error."""
        try:
            for path, data in files.files:
                _mkdirs(path.parent, self.root.parent)
                atomic_write(path, data, FILE_MODE, durable=False)
            self.cdi.write_claim(files.claim.uid, files.cdi_devices)
        except (OSError, CDIError, ValueError) as e:
            log.error("device metadata not written", claim=str(files.claim), error=str(e))
            return False
        return True

    def written(self, files: MetadataFiles, devices: list[PreparedDevice]) -> list[PreparedDevice]:
        """:meth:`write` (blocking), then ``devices`` with the metadata CDI IDs if it
        succeeded, or as they are if it did not."""
        return self.with_ids(devices, files) if self.write(files) else devices

    @staticmethod
    def with_ids(devices: list[PreparedDevice], files: MetadataFiles) -> list[PreparedDevice]:
        """``devices`` with the metadata CDI ID added to each request's first device."""
        out = []
        done: set[str] = set()
        for d in devices:
            extra = tuple(files.ids[r] for r in d.request_names if r not in done)
            done.update(d.request_names)
            out.append(
                PreparedDevice(d.request_names, d.pool, d.device, d.cdi_ids + extra, d.share_id)
            )
        return out

    def restore(self, prepared: set[str]) -> int:
        """After a start: write the CDI specs again for the metadata files of claims still
        prepared (``/var/run/cdi`` is tmpfs, the files live in the plugin dir and survive a
        reboot), and remove the files and specs of claims that are not; the number of specs
        written. A container started later still finds every CDI ID the kubelet kept."""
        by_claim: dict[str, list[tuple[str, str, str | None, str]]] = {}
        try:
            claim_dirs = sorted(self.root.iterdir()) if self.root.is_dir() else []
        except OSError as e:
            log.error("device metadata dir unreadable", dir=str(self.root), error=str(e))
            return 0
        for claim_dir in claim_dirs:
            kept = False
            for path in sorted(claim_dir.glob(f"*/{HOST_FILE}")):
                try:
                    first = json.JSONDecoder().raw_decode(path.read_text(encoding="utf-8"))[0]
                    meta = first["metadata"]
                    uid, name, namespace = (
                        str(meta["uid"]),
                        str(meta["name"]),
                        str(meta["namespace"]),
                    )
                    pod_claim_name = first.get("podClaimName")
                    check_components(
                        namespace=namespace,
                        claim=name,
                        pod_claim_name=pod_claim_name or None,
                        request=path.parent.name,
                    )
                except (OSError, ValueError, KeyError, TypeError) as e:
                    log.warning("device metadata file unreadable", path=str(path), error=str(e))
                    continue
                if uid in prepared and claim_dir.name == f"{namespace}_{name}":
                    entry = (path.parent.name, name, pod_claim_name, str(path))
                    by_claim.setdefault(uid, []).append(entry)
                    kept = True
            if not kept:
                shutil.rmtree(claim_dir, ignore_errors=True)
        for uid in self.cdi.claim_uids_on_disk() - set(by_claim):
            self.cdi.remove_claim(uid)
        for uid, entries in by_claim.items():
            devices = [
                CDIDevice(
                    request,
                    ContainerEdits(
                        mounts=(
                            Mount.model_validate(
                                {
                                    "hostPath": host,
                                    "containerPath": container_path(
                                        self.driver, name, pod_claim_name, request
                                    ),
                                    "options": ("ro", "bind"),
                                }
                            ),
                        )
                    ),
                )
                for request, name, pod_claim_name, host in entries
            ]
            try:
                self.cdi.write_claim(uid, devices)
            except (OSError, CDIError, ValueError) as e:
                log.error("device metadata spec not restored", uid=uid, error=str(e))
        return len(by_claim)

    def unprepared(self, claim: ClaimRef) -> None:
        """Remove the claim's spec and files; a claim whose names are not valid never had
        files (:meth:`plan` refuses it), so nothing outside the root is touched."""
        try:
            self.cdi.remove_claim(claim.uid)
            shutil.rmtree(self.claim_dir(claim), ignore_errors=True)
        except (OSError, CDIError, ValueError) as e:
            log.error("device metadata not removed", claim=str(claim), error=str(e))


def _mkdirs(directory: Path, top: Path) -> None:
    """``directory`` and its missing parents below ``top``, each new one DIR_MODE whatever
    the umask; existing ones are left alone (a prepare costs no chmod of the shared root)."""
    missing = []
    for d in (directory, *directory.parents):
        if d == top or top not in d.parents or d.is_dir():
            break
        missing.append(d)
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            continue  # made meanwhile (another claim of the batch, a second process)
        os.chmod(d, DIR_MODE)
