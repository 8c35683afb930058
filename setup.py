"""Build step: generate the kubelet gRPC stubs, so that a wheel built from a fresh clone
(``pip install .``) carries ``dradriver.kubeletapi.gen``.

The stubs are generated, never committed (``make protos`` writes them in a checkout).
grpcio-tools is a build requirement (pyproject.toml), not a runtime one. Everything
else about the package is in pyproject.toml.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from setuptools import setup
from setuptools.command.build_py import build_py

GEN_PACKAGE = "dradriver.kubeletapi.gen"
GENERATOR = Path(__file__).resolve().parent / "dradriver" / "kubeletapi" / "generate.py"


def _generator() -> ModuleType:
    # Loaded from its file: importing the dradriver package would need its runtime
    # dependencies, which the build environment does not have.
    spec = importlib.util.spec_from_file_location("_dradriver_kubeletapi_generate", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithStubs(build_py):
    def run(self) -> None:
        _generator().ensure_generated()
        # The package list was found before gen/ existed in a fresh clone.
        if GEN_PACKAGE not in self.packages:
            self.packages.append(GEN_PACKAGE)
        super().run()


setup(cmdclass={"build_py": BuildPyWithStubs})
