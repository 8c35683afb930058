"""Progress lines for long builds: what they say, how often, and a real ``go build -v`` counted."""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import pytest

from devtools.cluster.progress import (
    Progress,
    count_go_packages,
    format_elapsed,
    is_package_line,
    run_go_build,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_lines_name_the_component_the_count_and_the_elapsed_time() -> None:
    out, clock = io.StringIO(), Clock()
    progress = Progress("kube binaries", 200, "packages", stream=out, interval=10, clock=clock)
    progress.start()
    clock.now += 65
    progress.advance(3, detail="k8s.io/api/core/v1")
    progress.finish()
    assert out.getvalue().splitlines() == [
        "kube binaries: 0/200 packages, 0s",
        "kube binaries: 3/200 packages (k8s.io/api/core/v1), 1m05s",
        "kube binaries: done, 3 packages in 1m05s",
    ]


def test_advancing_prints_at_most_once_per_interval() -> None:
    out, clock = io.StringIO(), Clock()
    progress = Progress("runtime", None, "packages", stream=out, interval=10, clock=clock)
    progress.start()
    for _ in range(50):
        clock.now += 1
        progress.advance()
    # start, then one line per 10 clock seconds: 50 steps over 50 s.
    assert len(out.getvalue().splitlines()) == 1 + 5
    assert out.getvalue().splitlines()[-1] == "runtime: 50 packages, 50s"


def test_elapsed_and_package_lines() -> None:
    assert [format_elapsed(s) for s in (0, 59.9, 60, 605)] == ["0s", "59s", "1m00s", "10m05s"]
    assert is_package_line("k8s.io/kubernetes/pkg/kubelet\n")
    assert not is_package_line("# k8s.io/foo")
    assert not is_package_line("./main.go:3:1: syntax error")
    assert not is_package_line("\n")


GO = shutil.which("go")


def _module(root: Path, body: str) -> Path:
    (root / "go.mod").write_text("module example.test/progress\n\ngo 1.21\n")
    (root / "hello").mkdir()
    (root / "hello" / "main.go").write_text(body)
    return root


def _env() -> dict[str, str]:
    # No network: the module has no dependencies beyond the standard library.
    return dict(os.environ, GOFLAGS="-mod=mod", GOPROXY="off", CGO_ENABLED="0")


@pytest.mark.skipif(GO is None, reason="no Go toolchain")
def test_a_real_go_build_advances_for_the_packages_it_compiles(tmp_path: Path) -> None:
    assert GO is not None
    src = 'package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("hi") }\n'
    (tmp_path / "m").mkdir()
    module = _module(tmp_path / "m", src)
    env = _env()
    total = count_go_packages(GO, ["./hello"], module, env)
    assert total is not None and total > 1  # fmt and its standard-library dependencies
    out, log = io.StringIO(), io.StringIO()
    progress = Progress("probe", total, "packages", stream=out, interval=0)
    cmd = [GO, "build", "-v", "-o", str(tmp_path / "hello-bin"), "./hello"]
    assert run_go_build(cmd, cwd=module, env=env, log=log, progress=progress) == 0
    # A package of a fresh module is compiled (a cache hit would leave it out of -v).
    assert "example.test/progress/hello" in log.getvalue()
    assert 1 <= progress.done <= total
    assert out.getvalue().splitlines()[-1].startswith("probe: done, ")
    assert (tmp_path / "hello-bin").exists()


@pytest.mark.skipif(GO is None, reason="no Go toolchain")
def test_a_failing_go_build_returns_its_exit_code_and_logs_the_error(tmp_path: Path) -> None:
    assert GO is not None
    (tmp_path / "m").mkdir()
    module = _module(tmp_path / "m", "package main\n\nfunc main() { undefined() }\n")
    out, log = io.StringIO(), io.StringIO()
    progress = Progress("broken", None, "packages", stream=out, interval=0)
    cmd = [GO, "build", "-v", "-o", str(tmp_path / "x"), "./hello"]
    code = run_go_build(cmd, cwd=module, env=_env(), log=log, progress=progress)
    assert code != 0
    assert "undefined" in log.getvalue()
    assert "done" not in out.getvalue()
