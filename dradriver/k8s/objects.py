"""Kubernetes objects as plain JSON dicts: the one type alias every module uses.

Objects stay dicts end to end so that no field the server returns is dropped.
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]
"""A Kubernetes object (or any JSON object inside one), as decoded from the wire."""
