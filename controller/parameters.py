"""ParametersReconciler: the ``Valid`` condition and the in-use finalizer of every
DeviceClaimParameters object (level-based: it looks at the cache, never at events)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

from controller.leadership import require_leader
from controller.parameters_in_use import claims_keeping, in_use_message, referenced_parameters
from dradriver.api import parameters as params
from dradriver.api.wellknown import IN_USE_FINALIZER
from dradriver.k8s.client import KubeClient
from dradriver.k8s.errors import KubeAPIError, is_not_found
from dradriver.k8s.events import EventRecorder
from dradriver.k8s.objects import Obj, finalizers, meta, uid_of
from dradriver.k8s.paths import path_for
from dradriver.log import get_logger
from dradriver.runtime import Informer, split_key

log = get_logger("controller")


class ParametersReconciler:
    """Keeps the ``Valid`` condition and the in-use finalizer of DeviceClaimParameters.

    With the claims informer, an object referenced by an allocated claim of this driver
    carries :data:`~dradriver.api.wellknown.IN_USE_FINALIZER` until no such claim is left,
    so deleting it waits for its claims (an ``InUse`` event says which, once). The
    controller must also watch the claims with :func:`parameters_used_by`.
    """

    def __init__(
        self,
        client: KubeClient,
        driver: str,
        informer: Informer,
        is_leader: Callable[[], bool] = lambda: True,
        claims: Informer | None = None,
    ) -> None:
        self.client = client
        self.driver = driver
        self.informer = informer
        self.is_leader = is_leader
        self.claims = claims
        self.api_version = f"{driver}/{params.VERSION}"
        self.status_writes = 0
        self.events = EventRecorder(client)
        informer.add_handler(on_delete=lambda obj: self.events.forget(uid_of(obj)))

    async def __call__(self, key: str) -> None:
        obj = self.informer.get(key)
        if obj is None:
            return
        if self.claims is not None:
            obj = await self._protect(key, obj)
            if obj is None:
                return
        if meta(obj).get("deletionTimestamp"):
            return
        await self._validate(key, obj)

    async def _protect(self, key: str, obj: Obj) -> Obj | None:
        """Add or remove the in-use finalizer; returns the object as written (None: gone)."""
        assert self.claims is not None
        namespace, name = split_key(key)
        users = claims_keeping(self.driver, self.claims.items(), namespace or "", name)
        current = finalizers(obj)
        deleting = bool(meta(obj).get("deletionTimestamp"))
        wanted = current
        if users and IN_USE_FINALIZER not in current and not deleting:
            wanted = [*current, IN_USE_FINALIZER]  # none can be added once deleting
        elif not users and IN_USE_FINALIZER in current:
            wanted = [f for f in current if f != IN_USE_FINALIZER]
        if wanted != current:
            require_leader(self.is_leader, f"parameters {key}")
            path = path_for(self.api_version, params.PLURAL, namespace, name)
            body = {
                "metadata": {"resourceVersion": meta(obj)["resourceVersion"], "finalizers": wanted}
            }
            try:
                obj = await self.client.merge_patch(path, body)
            except KubeAPIError as e:
                if is_not_found(e):
                    return None  # deleted meanwhile
                raise  # 409: the cache is behind; retried with backoff once it catches up
            log.info(
                "parameters in use" if users else "parameters no longer in use",
                parameters=key,
                claims=users[:10],
            )
        if deleting and users and IN_USE_FINALIZER in finalizers(obj):
            await self.events.emit(
                {**obj, "apiVersion": self.api_version},
                params.KIND,
                "Warning",
                "InUse",
                f"deletion waits: {in_use_message(users)}",
            )
        return obj

    async def _validate(self, key: str, obj: Obj) -> None:
        metadata = obj["metadata"]
        status: Literal["True", "False"]
        try:
            params.spec_of(obj)
        except params.ParametersError as e:
            status, reason, message = "False", "InvalidSpec", str(e)
        else:
            status, reason, message = "True", "Valid", "the spec is valid"
        current = (obj.get("status") or {}).get("conditions") or []
        conditions, changed = params.set_condition(
            current, params.VALID_CONDITION, status, reason, message, metadata.get("generation")
        )
        if not changed:
            return
        require_leader(self.is_leader, f"the status of {key}")
        namespace, name = split_key(key)
        path = path_for(self.api_version, params.PLURAL, namespace, name) + "/status"
        body = {
            "metadata": {"resourceVersion": metadata["resourceVersion"]},
            "status": {"conditions": conditions},
        }
        try:
            await self.client.merge_patch(path, body)
        except KubeAPIError as e:
            if is_not_found(e):
                return  # deleted meanwhile
            raise  # 409: the cache is behind; retried with backoff once it catches up
        self.status_writes += 1
        log.info("parameters checked", parameters=key, valid=status, reason=reason)


def parameters_used_by(driver: str) -> Callable[[Obj], Iterable[str]]:
    """Maps a claim to the keys of the DeviceClaimParameters objects it references."""

    def mapper(claim: Obj) -> Iterable[str]:
        namespace = meta(claim).get("namespace")
        return [f"{namespace}/{name}" for name in referenced_parameters(driver, claim)]

    return mapper
