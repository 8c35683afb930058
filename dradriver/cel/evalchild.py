"""The CEL worker's child process (:mod:`dradriver.cel.worker`): evaluates in-process.

Invariant: every request line gets exactly one reply line, an error included, with the
child's callback count so far; nothing else is written to the reply stream.
"""

from __future__ import annotations

import json
import os
from typing import Any

from dradriver.cel import env, library
from dradriver.cel.device import DeviceInput
from dradriver.cel.messages import failure_message
from dradriver.runtime.childworker import JSON_LINES, ChildEnd

__all__ = ["main"]


def main() -> None:
    """Evaluate requests from stdin until it closes."""
    end = ChildEnd(JSON_LINES)
    end.send({"ready": True, "pid": os.getpid()})
    for payload in end.requests():
        try:
            request = json.loads(payload)
            selector = env.compile_selector(str(request["expression"]))
            device = DeviceInput(str(request["driver"]), request["device"])
            result = selector.evaluate_here(device)
            answer: dict[str, Any] = {"matched": result.matched, "error": result.error}
        except env.CompileError as e:
            answer = {"matched": False, "error": str(e)}
        except Exception as e:
            answer = {"matched": False, "error": failure_message(e)}
        answer["callbacks"] = library.CALLBACKS.calls
        end.send(answer)


if __name__ == "__main__":
    main()
