"""Write or check the plain manifests in ``manifests/``, rendered from the Helm chart.

python -m devtools.manifests --write    # regenerate manifests/ from deployments/helm/dradriver
python -m devtools.manifests --check    # exit 1 if a rendered file is out of date

The chart is the one source: ``helm template`` with ``ci/manifests-values.yaml`` (the
chart's defaults, the namespace as an object, cert-manager TLS so no key material lands
in the repository), one file per template, at the template's path under ``templates/``
(``templates/controller/rbac.yaml`` -> ``manifests/controller/rbac.yaml``); the CRDs of
the chart's ``crds/`` go to ``manifests/controller/`` as they are (the pydantic models
are their source, see :mod:`devtools.crds`). ``manifests/examples/`` is not rendered.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from devtools import paths
from devtools.cluster.helmbin import HelmBuildError, ensure_helm

CHART = paths.REPO / "deployments" / "helm" / "dradriver"
VALUES = CHART / "ci" / "manifests-values.yaml"
RELEASE = "dradriver"
NAMESPACE = "dradriver"
# The directories of manifests/ whose files are all rendered from the chart.
RENDERED_DIRS = (".", "controller", "kubeletplugin")
HEADER = (
    "# Rendered from deployments/helm/dradriver/{source} "
    "(ci/manifests-values.yaml); do not edit.\n"
    "# Regenerate: python -m devtools.manifests --write\n"
)
_SOURCE = re.compile(r"^---\n# Source: [^/\n]+/(templates|crds)/(\S+)\n", re.M)


class RenderError(RuntimeError):
    """helm template failed; the message has its output."""


def helm_template(helm: Path, *args: str, chart: Path = CHART) -> str:
    """Run ``helm template`` of the chart with extra arguments; its stdout."""
    cmd = [str(helm), "template", RELEASE, str(chart), "--namespace", NAMESPACE, *args]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, check=False, timeout=120, stdin=subprocess.DEVNULL
    )
    if proc.returncode != 0:
        raise RenderError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr}")
    return proc.stdout


def split_by_source(rendered: str) -> dict[str, list[str]]:
    """``helm template`` output as {"templates/x.yaml" | "crds/x.yaml": [document, ...]}."""
    out: dict[str, list[str]] = {}
    matches = list(_SOURCE.finditer(rendered))
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(rendered)
        body = rendered[match.end() : end].strip("\n")
        if body.strip():
            out.setdefault(f"{match.group(1)}/{match.group(2)}", []).append(body + "\n")
    return out


def target_path(source: str, manifests: Path) -> Path:
    kind, _, rel = source.partition("/")
    return manifests / "controller" / rel if kind == "crds" else manifests / rel


def render(helm: Path, manifests: Path = paths.MANIFESTS) -> dict[Path, str]:
    """Every file the chart renders into ``manifests``, with its content."""
    rendered = helm_template(helm, "--include-crds", "--values", str(VALUES))
    files: dict[Path, str] = {}
    for source, docs in split_by_source(rendered).items():
        text = "---\n".join(docs)
        if source.startswith("templates/"):
            text = HEADER.format(source=source) + text
        files[target_path(source, manifests)] = text
    return files


def owned_files(manifests: Path = paths.MANIFESTS) -> set[Path]:
    """The files of ``manifests`` that the render owns (every YAML file of RENDERED_DIRS)."""
    return {p for d in RENDERED_DIRS for p in (manifests / d).glob("*.yaml")}


def stale(helm: Path, manifests: Path = paths.MANIFESTS) -> list[str]:
    """What differs between the render and ``manifests``: one line per file."""
    files = render(helm, manifests)
    problems = [
        f"{path} is out of date"
        for path, text in sorted(files.items())
        if not path.exists() or path.read_text() != text
    ]
    problems += [
        f"{path} is not rendered from the chart (delete it or add a template)"
        for path in sorted(owned_files(manifests) - set(files))
    ]
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.manifests", description=__doc__)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="write the rendered files")
    action.add_argument("--check", action="store_true", help="fail if a file is out of date")
    parser.add_argument("--dir", type=Path, default=paths.MANIFESTS, help="default: %(default)s")
    args = parser.parse_args(argv)
    try:
        helm = ensure_helm()
        if args.check:
            problems = stale(helm, args.dir)
            for line in problems:
                print(f"{line}; run python -m devtools.manifests --write")
            return 1 if problems else 0
        files = render(helm, args.dir)
    except (HelmBuildError, RenderError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for path in sorted(owned_files(args.dir) - set(files)):
        path.unlink()
        print(f"removed {path}")
    for path, text in sorted(files.items()):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
