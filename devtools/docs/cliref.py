"""The command-line reference, from each command's ``--help``.

Runs every command's ``main(["...", "--help"])`` from this checkout in a child interpreter
with a fixed terminal width and a minimal environment (no ``DRADRIVER_*`` variables that
change defaults), so the page is the same on every machine.
"""

from __future__ import annotations

import os
import subprocess
import sys

from devtools import paths
from devtools.docs.pages import DOCS, banner

PAGE = DOCS / "reference" / "cli.md"

# (the command as typed, the module whose main() runs it, the arguments before --help)
COMMANDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("dradriver-kubeletplugin", "kubeletplugin.main", ()),
    ("dradriver-kubeletplugin doctor", "kubeletplugin.main", ("doctor",)),
    ("dradriver-controller", "controller.main", ()),
    ("dradriver-webhook", "dradriver.webhook.server", ()),
    ("dradriver", "dradriver.cli.main", ()),
    ("dradriver explain", "dradriver.cli.main", ("explain",)),
    ("dradriver config import", "dradriver.cli.main", ("config", "import")),
    (
        "dradriver config import generic-device-plugin",
        "dradriver.cli.main",
        ("config", "import", "generic-device-plugin"),
    ),
    (
        "dradriver config import smarter-device-manager",
        "dradriver.cli.main",
        ("config", "import", "smarter-device-manager"),
    ),
    ("dradriver cluster up", "dradriver.cli.main", ("cluster", "up")),
    ("dradriver cluster down", "dradriver.cli.main", ("cluster", "down")),
    ("dradriver cluster status", "dradriver.cli.main", ("cluster", "status")),
    ("dradriver cluster build", "dradriver.cli.main", ("cluster", "build")),
    ("dradriver demo", "dradriver.cli.main", ("demo",)),
)

COLUMNS = "100"


def help_text(module: str, args: tuple[str, ...]) -> str:
    """What ``main([*args, "--help"])`` of ``module`` prints."""
    code = f"import sys; from {module} import main; sys.exit(main(sys.argv[1:]))"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "PYTHONPATH": str(paths.REPO),
        "COLUMNS": COLUMNS,
        "LC_ALL": "C.UTF-8",
    }
    done = subprocess.run(
        [sys.executable, "-c", code, *args, "--help"],
        cwd=paths.REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{module} {' '.join(args)} --help: exit {done.returncode}\n{done.stderr}"
        )
    return done.stdout.rstrip()


def anchor(command: str) -> str:
    return command.replace(" ", "-")


def render() -> str:
    out = [
        banner("devtools.docs.cliref, from each command's --help"),
        "# Command-line reference",
        "",
        "The console scripts of the `dradriver` wheel (`dradriver-kubeletplugin`,",
        "`dradriver-controller`, `dradriver-webhook`, `dradriver`) and the subcommands the",
        "dev tools add to `dradriver` (`cluster`, `demo`; installed by `make install`, not in",
        "the image). Each section is the command's own `--help`.",
        "",
    ]
    out += [f"- [`{c}`](#{anchor(c)})" for c, _, _ in COMMANDS]
    out.append("")
    for command, module, args in COMMANDS:
        out += [
            f"## `{command}` {{#{anchor(command)}}}",
            "",
            "```text",
            help_text(module, args),
            "```",
            "",
        ]
    return "\n".join(out)
