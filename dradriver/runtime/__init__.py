"""The client-go controller pattern for asyncio, shared by the controller and the kubelet plugin.

* :class:`Informer`: list+watch cache of one kind (resourceVersion resume,
  bookmarks, relist on 410 Gone, backoff), with add/update/delete handlers.
* :class:`WorkQueue`: deduplicating, rate-limited queue; a key is never
  processed by two workers at once.
* :class:`Controller`: informers feed keys to a queue, workers call a
  level-based ``reconcile(key)``.
* :class:`LeaderElector`: leader election on a coordination.k8s.io/v1 Lease.
"""

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
