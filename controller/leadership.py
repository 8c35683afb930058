"""Writes only with a fresh lease: the check every reconciler makes before it writes.

The elector stops the reconcilers when the lease is lost, but a reconcile already past
its last await would still write; checking right before each write keeps two replicas
from acting together.
"""

from __future__ import annotations

from collections.abc import Callable


class NotLeader(RuntimeError):
    """A write was about to happen without a fresh lease; the key is retried later."""


def require_leader(is_leader: Callable[[], bool], what: str) -> None:
    """Raise :class:`NotLeader` unless this replica leads; ``what`` names the write."""
    if not is_leader():
        raise NotLeader(f"not writing {what} without a fresh lease")
