"""What the repository's Dockerfile declares, read without a container engine.

Enough of the Dockerfile syntax for the file this project ships: comments,
line continuations, stages (``FROM ... AS name``), and the instructions
whose values describe the image (``FROM``, ``RUN``, ``COPY``, ``ENV``,
``USER``, ``CMD``, ``ENTRYPOINT``). The test that keeps the Dockerfile and
:mod:`devtools.image.recipe` in agreement compares these facts.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path


class DockerfileError(ValueError):
    """The Dockerfile uses something this reader does not understand; the message says what."""


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case
    value: str  # the rest of the (joined) line
    line: int  # where it starts, 1-based


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None

    def shell_commands(self) -> list[list[str]]:
        """Every command of every ``RUN``, split at ``&&`` into argument lists."""
        commands: list[list[str]] = []
        for run in self.all("RUN"):
            current: list[str] = []
            for token in shlex.split(run.value, comments=False):
                if token == "&&":
                    commands.append(current)
                    current = []
                else:
                    current.append(token)
            commands.append(current)
        return [c for c in commands if c]

    def env(self) -> tuple[str, ...]:
        """``ENV`` values as ``KEY=value`` strings, in order."""
        pairs: list[str] = []
        for env in self.all("ENV"):
            for token in shlex.split(env.value):
                if "=" not in token:
                    raise DockerfileError(f"line {env.line}: ENV without '=' ({token!r})")
                pairs.append(token)
        return tuple(pairs)

    def exec_form(self, keyword: str) -> tuple[str, ...] | None:
        """``CMD``/``ENTRYPOINT`` in JSON (exec) form; shell form is an error."""
        found = self.last(keyword)
        if found is None:
            return None
        try:
            value = json.loads(found.value)
        except ValueError as err:
            raise DockerfileError(f"line {found.line}: {keyword} is not in exec form") from err
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise DockerfileError(f"line {found.line}: {keyword} is not a list of strings")
        return tuple(value)


@dataclass(frozen=True)
class Dockerfile:
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise DockerfileError(f"no stage named {name!r}")


def _logical_lines(text: str) -> list[tuple[int, str]]:
    lines: list[tuple[int, str]] = []
    current = ""
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not current:
            start = number
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        lines.append((start, current))
        current = ""
    if current:
        raise DockerfileError(f"line {start}: the file ends inside a continued instruction")
    return lines


def parse(text: str) -> Dockerfile:
    stages: list[Stage] = []
    for number, line in _logical_lines(text):
        keyword, _, value = line.partition(" ")
        keyword = keyword.upper()
        value = value.strip()
        if keyword == "FROM":
            words = value.split()
            if len(words) == 3 and words[1].upper() == "AS":
                stages.append(Stage(words[0], words[2]))
            elif len(words) == 1:
                stages.append(Stage(words[0], str(len(stages))))
            else:
                raise DockerfileError(f"line {number}: FROM {value!r} is not 'IMAGE [AS NAME]'")
            continue
        if not stages:
            raise DockerfileError(f"line {number}: {keyword} before the first FROM")
        stages[-1].instructions.append(Instruction(keyword, value, number))
    if not stages:
        raise DockerfileError("no FROM")
    return Dockerfile(stages)


def load(path: Path) -> Dockerfile:
    return parse(path.read_text())
