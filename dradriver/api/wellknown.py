"""Annotations dradriver puts on ResourceClaims that more than one component reads."""

from __future__ import annotations

CONFLICT_ANNOTATION = "dradriver.dev/allocation-conflict"
"""On a claim the controller allocated that turned out to share a device with another claim
(the scheduler allocated it in the same instant): the claim is held, unusable, until the
device is free, then allocated again. The node plugin refuses to prepare it."""
