"""Names dradriver puts on Kubernetes objects, and metric names, that more than one
component reads (the controller, the node plugin, the chart, devtools and bench): one
definition each."""

from __future__ import annotations

CONFLICT_ANNOTATION = "dradriver.dev/allocation-conflict"
"""On a claim the controller allocated that turned out to share a device with another claim
(the scheduler allocated it in the same instant): the claim is held, unusable, until the
device is free, then allocated again. The node plugin refuses to prepare it."""

ALLOCATION_ANNOTATION = "dradriver.dev/allocation"
"""``dradriver.dev/allocation: Immediate`` on a claim asks the controller to allocate it."""
IMMEDIATE = "Immediate"
"""The value of :data:`ALLOCATION_ANNOTATION` that asks for immediate allocation (the
``Immediate`` of ``DeviceClaimParameters.spec.allocationMode``)."""
STATUS_ANNOTATION = "dradriver.dev/allocation-status"
"""Why the controller could not allocate the claim (ResourceClaimStatus has no conditions)."""
FINALIZER = "dradriver.dev/allocation"
"""The controller's own finalizer on claims it allocated (flows.md §b)."""
IN_USE_FINALIZER = "dradriver.dev/in-use"
"""On a DeviceClaimParameters object while an allocated claim references it."""

CLAIM_STAGE_METRIC = "dradriver_controller_claim_stage_seconds"
"""The controller's histogram of an immediate claim's allocation, stage by stage (label
``stage``, one of :data:`CLAIM_STAGES`); the benchmark reads it from ``/metrics``."""
CLAIM_STAGES = ("queued", "finalizer_write", "turn", "search", "status_write", "event", "total")
"""The ``stage`` label values of :data:`CLAIM_STAGE_METRIC`, in the order a claim goes through."""
