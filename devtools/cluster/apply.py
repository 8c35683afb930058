"""Applying objects and manifests: the one way dev tooling writes what it owns.

Server-side apply through the client, with one field manager: applying again updates
what dev tooling set and leaves fields other writers own alone. The REST path of each
object comes from the apiserver's discovery (as kubectl finds it), so any kind the
cluster serves can be applied, CRDs' kinds included.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import yaml

from devtools import paths
from dradriver.k8s.client import SyncKubeClient
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import path_for

FIELD_MANAGER = "dradriver-devtools"


class _Resources:
    """Kind -> REST resource of each apiVersion, looked up once per apply call."""

    def __init__(self, api: SyncKubeClient) -> None:
        self._api = api
        self._kinds: dict[str, dict[str, Obj]] = {}

    def _discover(self, api_version: str) -> dict[str, Obj]:
        listing = self._api.get("/api/v1" if api_version == "v1" else f"/apis/{api_version}")
        # Subresources ("pods/status") share their parent's kind.
        resources = [r for r in listing.get("resources", []) if "/" not in r["name"]]
        self._kinds[api_version] = {r["kind"]: r for r in resources}
        return self._kinds[api_version]

    def path_of(self, doc: Obj) -> str:
        api_version, kind, meta = doc["apiVersion"], doc["kind"], doc["metadata"]
        resource = self._kinds.get(api_version, {}).get(kind)
        if resource is None:  # not looked up yet, or a kind new since (a CRD's)
            resource = self._discover(api_version).get(kind)
        if resource is None:
            raise ValueError(f"the apiserver serves no kind {kind} in {api_version}")
        # Like kubectl, a namespaced object without a namespace goes to "default".
        namespace = (meta.get("namespace") or "default") if resource["namespaced"] else None
        return path_for(api_version, resource["name"], namespace, meta["name"])


def _documents(path: Path) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _apply_all(api: SyncKubeClient, docs: Iterable[Obj]) -> list[Obj]:
    resources = _Resources(api)
    return [api.apply(resources.path_of(doc), doc, FIELD_MANAGER) for doc in docs]


def apply(api: SyncKubeClient, doc: Obj) -> Obj:
    """Server-side apply one object (it carries apiVersion, kind and metadata.name)."""
    [applied] = _apply_all(api, [doc])
    return applied


def apply_file(api: SyncKubeClient, path: Path) -> list[Obj]:
    """Apply every document of a YAML file, in order."""
    return _apply_all(api, _documents(path))


def apply_manifests(api: SyncKubeClient, *names: str) -> list[Obj]:
    """Apply files of the checkout's ``manifests/``, e.g. ``"controller/rbac.yaml"``."""
    return _apply_all(api, [doc for name in names for doc in _documents(paths.MANIFESTS / name)])
