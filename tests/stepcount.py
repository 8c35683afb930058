"""A step counter for complexity tests: Python function calls, not wall time.

A test that compares the steps for n and 4n items shows linear or quadratic work on
any machine, loaded or not; comprehensions and generator resumptions count too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType


def python_calls(work: Callable[[], object]) -> int:
    """Python function calls made (in this thread) while ``work`` runs."""
    calls = 0

    def count(frame: FrameType, event: str, arg: object) -> None:
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(count)
    try:
        work()
    finally:
        sys.setprofile(None)
    return calls
