"""devtools.shape: the size contract `make lint` checks (modules <= 600 lines, functions <= 80)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools import shape
from devtools.paths import REPO


def _tree(root: Path, files: dict[str, str], exceptions: str = "") -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / "pyproject.toml").write_text(f"[tool.dradriver.shape.exceptions]\n{exceptions}")
    return root


def _function(name: str, body_lines: int, indent: str = "") -> str:
    body = "".join(f"{indent}    x = {i}\n" for i in range(body_lines))
    return f"{indent}def {name}() -> None:\n{body}"


def test_the_repository_keeps_its_shape() -> None:
    over, stale = shape.check(REPO)
    assert over == [], "\n".join(map(str, over))
    assert stale == []


def test_a_long_module_and_long_functions_are_found(tmp_path: Path) -> None:
    long_module = "".join(f"x{i} = {i}\n" for i in range(shape.MODULE_LINES + 1))
    method = "class C:\n" + _function("m", shape.FUNCTION_LINES, indent="    ")
    nested = _function("outer", 2) + _function("inner", shape.FUNCTION_LINES, indent="    ")
    root = _tree(
        tmp_path,
        {
            "dradriver/big.py": long_module,
            "controller/c.py": method,
            "kubeletplugin/k.py": nested,
            "kubeletplugin/ok.py": _function("fits", shape.FUNCTION_LINES - 1),
            "dradriver/kubeletapi/gen/stub.py": long_module,  # generated: not measured
            "devtools/tool.py": long_module,  # not product code
        },
    )
    over, stale = shape.check(root)
    assert {(f.where, f.lines) for f in over} == {
        ("dradriver/big.py", shape.MODULE_LINES + 1),
        ("controller/c.py:C.m", shape.FUNCTION_LINES + 1),
        ("kubeletplugin/k.py:outer", shape.FUNCTION_LINES + 4),
        ("kubeletplugin/k.py:outer.inner", shape.FUNCTION_LINES + 1),
    }
    assert stale == []
    assert shape.main(["--root", str(root)]) == 1


def test_an_exception_with_a_reason_passes_and_a_stale_one_fails(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {"dradriver/m.py": _function("f", shape.FUNCTION_LINES)},
        exceptions='"dradriver/m.py:f" = "one table of cases"\n',
    )
    assert shape.check(root) == ([], [])
    assert shape.main(["--root", str(root)]) == 0
    (root / "dradriver/m.py").write_text(_function("f", 3))
    assert shape.check(root) == ([], ["dradriver/m.py:f"])
    assert shape.main(["--root", str(root)]) == 1


def test_an_exception_needs_a_reason(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"dradriver/m.py": ""}, exceptions='"dradriver/m.py" = " "\n')
    with pytest.raises(ValueError, match="give a reason"):
        shape.check(root)
