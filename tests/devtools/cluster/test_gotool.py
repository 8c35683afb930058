"""The shared cache logic of the Go tools built here (helm, kwok)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.cluster import gotool


class Broken(RuntimeError):
    pass


def test_an_override_that_is_not_executable_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("X_TOOL", str(tmp_path / "missing"))
    with pytest.raises(Broken, match=r"X_TOOL=.* is not an executable file"):
        gotool.ensure("X_TOOL", tmp_path / "entry", "tool", lambda t: None, Broken)
    assert gotool.cached("X_TOOL", tmp_path / "entry", "tool") is None


def test_a_build_runs_once_and_its_record_makes_the_entry_a_cache_hit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("X_TOOL", raising=False)
    target = tmp_path / "entry"
    builds: list[Path] = []

    def build(t: Path) -> None:
        with gotool.build_lock(t) as to_build:
            assert to_build
            builds.append(t)
            gotool.record_complete(t, 1.23, "v1")

    assert gotool.cached("X_TOOL", target, "tool") is None
    assert gotool.ensure("X_TOOL", target, "tool", build, Broken) == target / "tool"
    assert gotool.ensure("X_TOOL", target, "tool", build, Broken) == target / "tool"
    assert builds == [target]
    assert gotool.cached("X_TOOL", target, "tool") == target / "tool"
    with gotool.build_lock(target) as to_build:
        assert not to_build
