"""Python entry points used by the hook tests."""

from __future__ import annotations

import time


def echo_claim(env: dict[str, str]) -> str:
    return f"claim={env['DRADRIVER_CLAIM_UID']}"


def explode(env: dict[str, str]) -> None:
    raise RuntimeError("device is on fire")


def slow(env: dict[str, str]) -> None:
    time.sleep(1)
