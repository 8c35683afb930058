"""Where the checkout's files are: dev tools run from a checkout, never from the wheel."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = REPO / "manifests"
