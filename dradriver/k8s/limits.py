"""Limits of the ``resource.k8s.io/v1`` API that our objects must stay within.

The apiserver rejects a ResourceSlice beyond these (Kubernetes 1.35+ validation,
/work/shared/reference/resource-v1.md §5.1 and §5.5); the slice builders split devices and
counter sets to fit.
"""

from __future__ import annotations

MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS = 64
"""A slice with any device that has taints or consumes counters holds at most this many."""
MAX_COUNTER_SETS_PER_SLICE = 8
