"""The version matrix's recorder: compat-marked tests write what they found per release.

A test marked ``@pytest.mark.compat("<feature>")`` (features:
``devtools.matrix.FEATURES``) is part of the compatibility subset that
``make test`` runs on every supported release besides the primary one. Its
outcome is recorded for the release the cluster reports (``/version``): a pass
is "works" (with what the test noted through the ``matrix`` fixture, e.g. the
service version the kubelet called), a skip is "not available" with the skip's
reason, a failure or error is "fails". At the end of the session the cells go
into ``tests/cluster/matrix/<version>.json``, merged with the features this
run did not touch; ``python -m devtools.matrix`` renders the README table.

Set ``DRADRIVER_MATRIX_RECORD=0`` to run compat tests without recording.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field

import pytest

from devtools import matrix
from devtools.cluster.local import LocalCluster


@dataclass
class Recorder:
    version: str = ""
    passed: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    skipped: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    failed: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    notes: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def note(self, feature: str, text: str) -> None:
        """Something a passing test found out (shown next to "works")."""
        if feature not in matrix.FEATURES:
            raise ValueError(f"unknown matrix feature {feature!r}")
        if text not in self.notes[feature]:
            self.notes[feature].append(text)

    def cells(self) -> dict[str, matrix.Cell]:
        out: dict[str, matrix.Cell] = {}
        for feature in set(self.passed) | set(self.skipped) | set(self.failed):
            if self.failed.get(feature):
                out[feature] = matrix.Cell("fails", ", ".join(sorted(self.failed[feature])))
            elif self.passed.get(feature):
                out[feature] = matrix.Cell("works", "; ".join(self.notes.get(feature, [])))
            else:
                reasons = list(dict.fromkeys(self.skipped[feature]))
                out[feature] = matrix.Cell("not available", "; ".join(reasons))
        return out


RECORDER = Recorder()


def _feature(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("compat")
    if marker is None:
        return None
    feature = str(marker.args[0]) if marker.args else ""
    if feature not in matrix.FEATURES:
        raise pytest.UsageError(
            f"{item.nodeid}: compat feature {feature!r} is not one of {sorted(matrix.FEATURES)}"
        )
    return feature


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    feature = _feature(item)
    if feature is None:
        return
    name = item.name
    if report.failed:
        RECORDER.failed[feature].append(name)
    elif report.skipped and report.when in ("setup", "call"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        RECORDER.skipped[feature].append(reason.removeprefix("Skipped: "))
    elif report.passed and report.when == "call":
        RECORDER.passed[feature].append(name)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("DRADRIVER_MATRIX_RECORD", "1") == "0" or not RECORDER.version:
        return
    cells = RECORDER.cells()
    if cells:
        matrix.save(RECORDER.version, cells)


@pytest.fixture(scope="session", autouse=True)
def cluster_release(local_cluster: LocalCluster) -> str:
    """The release the apiserver reports; the recorder files results under it."""
    with local_cluster.api() as api:
        version = str(api.get("/version")["gitVersion"])
    RECORDER.version = version
    return version


@pytest.fixture
def matrix_notes() -> Iterator[Recorder]:
    yield RECORDER
