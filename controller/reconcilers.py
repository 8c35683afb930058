"""The controller's reconcilers (level-based: each looks at the cache, never at events).

* :class:`ParametersReconciler` keeps the ``Valid`` condition of every
  DeviceClaimParameters object up to date.
* :class:`ClaimReconciler` is a placeholder for the allocation work of a later
  change: it resolves this driver's parameters of a claim and logs the outcome,
  without writing anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

from dradriver import parameters as params
from dradriver.controllerruntime import Informer, split_key
from dradriver.kube.client import KubeAPIError, KubeClient
from dradriver.kube.paths import path_for
from dradriver.log import get_logger

log = get_logger("controller")
Obj = dict[str, Any]


class NotLeader(RuntimeError):
    """A write was about to happen without a fresh lease; the key is retried later."""


class ParametersReconciler:
    def __init__(
        self,
        client: KubeClient,
        driver: str,
        informer: Informer,
        is_leader: Callable[[], bool] = lambda: True,
    ) -> None:
        self.client = client
        self.driver = driver
        self.informer = informer
        self.is_leader = is_leader
        self.api_version = f"{driver}/{params.VERSION}"
        self.status_writes = 0

    async def __call__(self, key: str) -> None:
        obj = self.informer.get(key)
        if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
            return
        meta = obj["metadata"]
        status: Literal["True", "False"]
        try:
            params.spec_of(obj)
        except params.ParametersError as e:
            status, reason, message = "False", "InvalidSpec", str(e)
        else:
            status, reason, message = "True", "Valid", "the spec is valid"
        current = (obj.get("status") or {}).get("conditions") or []
        conditions, changed = params.set_condition(
            current, params.VALID_CONDITION, status, reason, message, meta.get("generation")
        )
        if not changed:
            return
        if not self.is_leader():
            raise NotLeader(f"not writing the status of {key} without a fresh lease")
        namespace, name = split_key(key)
        path = path_for(self.api_version, params.PLURAL, namespace, name) + "/status"
        body = {
            "metadata": {"resourceVersion": meta["resourceVersion"]},
            "status": {"conditions": conditions},
        }
        try:
            await self.client.merge_patch(path, body)
        except KubeAPIError as e:
            if e.status == 404:
                return  # deleted meanwhile
            raise  # 409: the cache is behind; retried with backoff once it catches up
        self.status_writes += 1
        log.info("parameters checked", parameters=key, valid=status, reason=reason)


class ClaimReconciler:
    """Placeholder: resolves a claim's parameters for this driver and logs the result."""

    def __init__(self, driver: str, claims: Informer, parameters: Informer) -> None:
        self.driver = driver
        self.claims = claims
        self.parameters = parameters
        self.seen: dict[str, str] = {}  # key -> resourceVersion last logged

    def _lookup(self, namespace: str, name: str) -> Obj | None:
        return self.parameters.get_by_name(namespace, name)

    async def __call__(self, key: str) -> None:
        claim = self.claims.get(key)
        if claim is None:
            self.seen.pop(key, None)
            return
        namespace, _ = split_key(key)
        try:
            entries = params.claim_parameters(self.driver, claim)
            resolved = [params.resolve(e, namespace or "", self._lookup) for e in entries]
        except params.ParametersError as e:
            self._log_once(key, claim, "claim parameters are invalid", error=str(e))
            return
        if resolved:
            modes = sorted({str(s.allocation_mode) for s in resolved})
            self._log_once(
                key, claim, "claim parameters resolved", entries=len(resolved), modes=modes
            )

    def _log_once(self, key: str, claim: Obj, msg: str, **fields: Any) -> None:
        rv = str((claim.get("metadata") or {}).get("resourceVersion", ""))
        if self.seen.get(key) != rv:
            self.seen[key] = rv
            log.info(msg, claim=key, **fields)


def claims_using(claims: Informer, driver: str) -> Callable[[Obj], Iterable[str]]:
    """Maps a DeviceClaimParameters object to the keys of the claims that reference it."""

    def mapper(obj: Obj) -> Iterable[str]:
        meta = obj.get("metadata") or {}
        namespace, name = meta.get("namespace"), meta.get("name")
        out = []
        for claim in claims.items():
            if (claim.get("metadata") or {}).get("namespace") != namespace:
                continue
            try:
                entries = params.claim_parameters(driver, claim)
            except params.ParametersError:
                continue
            if any(
                isinstance(e.source, params.ParametersReference) and e.source.name == name
                for e in entries
            ):
                out.append(f"{namespace}/{claim['metadata']['name']}")
        return out

    return mapper
