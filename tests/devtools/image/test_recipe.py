"""The Dockerfile and the registry-less image recipe describe one image.

Both are read as written (the Dockerfile by :mod:`devtools.image.dockerfile`,
the recipe's constants as the builder uses them), so changing one without the
other fails here. What the built archive really holds is checked against
the same facts in tests/cluster/test_image.py.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from devtools import paths
from devtools.image import recipe
from devtools.image.contents import normalize
from devtools.image.dockerfile import Dockerfile, DockerfileError, Stage, load, parse

DOCKERFILE = paths.REPO / "Dockerfile"


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return load(DOCKERFILE)


def _installs(stage: Stage) -> set[str]:
    packages: set[str] = set()
    for cmd in stage.shell_commands():
        if cmd[:2] == ["apt-get", "install"]:
            packages |= {word for word in cmd[2:] if not word.startswith("-")}
    return packages


def _pip_installs(stage: Stage) -> list[list[str]]:
    return [c for c in stage.shell_commands() if "pip" in " ".join(c[:3]) and "install" in c]


def test_both_stages_start_from_the_recipes_debian_with_its_python(dockerfile: Dockerfile) -> None:
    for stage in dockerfile.stages:
        assert stage.base == f"debian:{recipe.DEBIAN_SUITE}-slim"
        assert set(recipe.PACKAGES) <= _installs(stage)
    # Debian 12 ships Python 3.11; the venv is made by that interpreter in both recipes.
    assert f"libpython{recipe.PYTHON_MINOR}-stdlib" in recipe.PACKAGES
    venv = [c for c in dockerfile.stage("build").shell_commands() if "venv" in c]
    assert venv == [[f"python{recipe.PYTHON_MINOR}", "-m", "venv", "--without-pip", recipe.VENV]]


def test_the_final_stage_installs_only_the_recipes_packages(dockerfile: Dockerfile) -> None:
    assert _installs(dockerfile.final) == set(recipe.PACKAGES)
    run = " ".join(" ".join(c) for c in dockerfile.final.shell_commands())
    for tool in ("pip", "venv", "gcc", "grpcio-tools", "devtools"):
        assert tool not in run


def test_the_venv_holds_the_distribution_without_extras(dockerfile: Dockerfile) -> None:
    (install,) = _pip_installs(dockerfile.stage("build"))
    assert install[-1] == recipe.DISTRIBUTION  # no "[dev]", no second requirement
    assert "--no-index" in install and "--no-compile" in install
    assert install[install.index("--python") + 1] == f"{recipe.VENV}/bin/python"
    wheel = [c for c in dockerfile.stage("build").shell_commands() if "wheel" in c]
    assert wheel and wheel[0][-1] == "."  # the checkout itself, no extras
    copies = [c.value.split() for c in dockerfile.final.all("COPY")]
    assert copies == [["--from=build", recipe.VENV, recipe.VENV]]


def test_user_env_and_command_match_the_recipe(dockerfile: Dockerfile) -> None:
    final = dockerfile.final
    user = final.last("USER")
    assert user is not None and user.value == recipe.USER
    user_commands = [c for c in final.shell_commands() if c[0] in ("groupadd", "useradd")]
    assert [tuple(c) for c in user_commands] == list(recipe.ADD_USER)
    assert f"{recipe.UID}:{recipe.UID}" == recipe.USER
    assert final.env() == recipe.ENV
    assert final.exec_form("CMD") == recipe.CMD
    assert final.exec_form("ENTRYPOINT") is None


def test_the_images_commands_are_the_projects_console_scripts() -> None:
    with open(paths.REPO / "pyproject.toml", "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert scripts["dradriver-kubeletplugin"] == "kubeletplugin.main:main"
    assert scripts["dradriver-controller"] == "controller.main:main"
    assert set(recipe.COMMANDS) <= set(scripts)
    assert recipe.CMD[0] in recipe.COMMANDS


def test_the_forbidden_set_holds_every_dev_extra() -> None:
    with open(paths.REPO / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    runtime = {normalize(Requirement(r).name) for r in project["dependencies"]}
    for requirement in project["optional-dependencies"]["dev"]:
        name = normalize(Requirement(requirement).name)
        if name not in runtime:
            assert name in recipe.FORBIDDEN, name


def test_the_reader_joins_continuations_and_splits_stages() -> None:
    parsed = parse(
        "# comment\nFROM a:1 AS one\nRUN x \\\n  # inside\n && y z\nFROM b:2\n"
        'ENV A=1 B="two words"\nCMD ["c", "d"]\n'
    )
    assert [s.base for s in parsed.stages] == ["a:1", "b:2"]
    assert parsed.stage("one").shell_commands() == [["x"], ["y", "z"]]
    assert parsed.final.env() == ("A=1", "B=two words")
    assert parsed.final.exec_form("CMD") == ("c", "d")


@pytest.mark.parametrize(
    "text",
    ["RUN x\n", "FROM a b c d\n", "FROM a\nRUN x \\\n", "FROM a\nENV novalue\n"],
)
def test_the_reader_rejects_what_it_does_not_understand(text: str, tmp_path: Path) -> None:
    with pytest.raises(DockerfileError):
        parse(text).final.env()
