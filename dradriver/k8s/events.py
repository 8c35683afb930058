"""core/v1 Events about objects: what ``kubectl describe`` shows users."""

from __future__ import annotations

import uuid

from dradriver.k8s.client import KubeClient
from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.http import TransportError
from dradriver.k8s.objects import Obj, meta, now_rfc3339
from dradriver.k8s.paths import RESOURCE_V1, path_for
from dradriver.log import get_logger

# The logger and the default component keep the names these events and warnings had
# when only the controller posted them (logger names are user contracts).
log = get_logger("controller")


class EventRecorder:
    """Posts core/v1 Events about objects; the same reason and message is posted once.

    Keyed by the object's uid: a new message for the same reason is posted again, and
    :meth:`forget` drops what was said about an object that is gone. An event that
    cannot be posted is logged and dropped: events inform, they never fail a reconcile.
    """

    def __init__(self, client: KubeClient, component: str = "dradriver-controller") -> None:
        self.client = client
        self.component = component
        self._last: dict[tuple[str, str], str] = {}
        self.posted = 0

    async def emit(self, obj: Obj, kind: str, type_: str, reason: str, message: str) -> None:
        m = meta(obj)
        uid = str(m.get("uid", ""))
        if self._last.get((uid, reason)) == message:
            return
        self._last[(uid, reason)] = message
        now = now_rfc3339()
        namespace = str(m.get("namespace") or "default")
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{m.get('name')}.{uuid.uuid4().hex[:16]}",
                "namespace": namespace,
            },
            "involvedObject": {
                # Objects from a list or watch carry no apiVersion; most that events are
                # posted about are ResourceClaims.
                "apiVersion": obj.get("apiVersion", RESOURCE_V1),
                "kind": kind,
                "name": m.get("name"),
                "namespace": namespace,
                "uid": uid,
                "resourceVersion": m.get("resourceVersion"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.client.create(path_for("v1", "events", namespace), body)
            self.posted += 1
        except (KubeAPIError, TransportError) as e:
            log.warning("event not posted", object=f"{namespace}/{m.get('name')}", error=str(e))

    def forget(self, uid: str) -> None:
        """The object is gone: forget what was said about it."""
        for k in [k for k in self._last if k[0] == uid]:
            del self._last[k]
