"""The generator's command line keeps stdout empty.

`make -s helm` runs it as a prerequisite, and the documented install command is
``$(make -s helm) install ...``: anything on stdout becomes part of that command.
"""

from __future__ import annotations

import pytest

from dradriver.kubeletapi import generate


def test_up_to_date_run_writes_nothing_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    generate.ensure_generated()
    assert generate.main([]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert "is up to date" in err
