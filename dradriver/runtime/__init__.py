"""The client-go controller pattern for asyncio, shared by the controller and the kubelet plugin.

* :class:`Informer`: list+watch cache of one kind (resourceVersion resume,
  bookmarks, relist on 410 Gone, backoff), with add/update/delete handlers.
* :class:`WorkQueue`: deduplicating, rate-limited queue; a key is never
  processed by two workers at once.
* :class:`Controller`: informers feed keys to a queue, workers call a
  level-based ``reconcile(key)``.
* :class:`LeaderElector`: leader election on a coordination.k8s.io/v1 Lease.

The names load on first use (PEP 562): a process that imports one module of the package
(:mod:`dradriver.runtime.childworker` in a CEL worker's child) does not load the rest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dradriver.runtime.controller import Controller, RequeueAfter, own_key
    from dradriver.runtime.informer import (
        Expired,
        Informer,
        ListWatchClient,
        WatchError,
        object_key,
        resource_version,
        split_key,
    )
    from dradriver.runtime.leaderelection import (
        LeaderElectionConfig,
        LeaderElector,
        LeaseClient,
        default_identity,
    )
    from dradriver.runtime.metrics import RuntimeMetrics
    from dradriver.runtime.ratelimit import (
        Backoff,
        BucketRateLimiter,
        ItemExponentialRateLimiter,
        MaxOfRateLimiter,
        RateLimiter,
        default_controller_rate_limiter,
    )
    from dradriver.runtime.workqueue import ShutDown, WorkQueue

_MODULE_OF = {
    "Backoff": "ratelimit",
    "BucketRateLimiter": "ratelimit",
    "Controller": "controller",
    "Expired": "informer",
    "Informer": "informer",
    "ItemExponentialRateLimiter": "ratelimit",
    "LeaderElectionConfig": "leaderelection",
    "LeaderElector": "leaderelection",
    "LeaseClient": "leaderelection",
    "ListWatchClient": "informer",
    "MaxOfRateLimiter": "ratelimit",
    "RateLimiter": "ratelimit",
    "RequeueAfter": "controller",
    "RuntimeMetrics": "metrics",
    "ShutDown": "workqueue",
    "WatchError": "informer",
    "WorkQueue": "workqueue",
    "default_controller_rate_limiter": "ratelimit",
    "default_identity": "leaderelection",
    "object_key": "informer",
    "own_key": "controller",
    "resource_version": "informer",
    "split_key": "informer",
}

__all__ = [
    "Backoff",
    "BucketRateLimiter",
    "Controller",
    "Expired",
    "Informer",
    "ItemExponentialRateLimiter",
    "LeaderElectionConfig",
    "LeaderElector",
    "LeaseClient",
    "ListWatchClient",
    "MaxOfRateLimiter",
    "RateLimiter",
    "RequeueAfter",
    "RuntimeMetrics",
    "ShutDown",
    "WatchError",
    "WorkQueue",
    "default_controller_rate_limiter",
    "default_identity",
    "object_key",
    "own_key",
    "resource_version",
    "split_key",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
