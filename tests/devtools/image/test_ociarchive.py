"""The image archive writer and reader, and the image cache's key, on real files.

The full image is built and read back in tests/cluster/test_image.py; these
cover the parts on small trees: layers from directories (deterministic,
symlinks kept, nothing but files, dirs and links), multi-layer OCI archives
read back by :mod:`devtools.image.contents`, and which inputs change the key.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import pytest

from devtools.cluster.images import ImageError
from devtools.image import build, recipe
from devtools.image.contents import read
from devtools.image.ociarchive import ContainerConfig, write_archive, write_directory_layer


def _tree(root: Path) -> Path:
    venv = root / "opt" / "app"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "tool").write_text("#!/opt/app/bin/python\n")
    (venv / "bin" / "tool").chmod(0o755)
    (venv / "bin" / "python").symlink_to("/usr/bin/python3.11")
    (venv / "lib").mkdir()
    (venv / "lib64").symlink_to("lib")  # a symlinked dir is kept as a link, not walked
    (venv / "pyvenv.cfg").write_text("version = 3.11.2\n")
    return root


def test_a_directory_layer_is_deterministic_and_keeps_links(tmp_path: Path) -> None:
    root = _tree(tmp_path / "root")
    first, second = tmp_path / "a.tar", tmp_path / "b.tar"
    write_directory_layer(root, "/opt/app", first)
    os.utime(root / "opt" / "app" / "pyvenv.cfg", (1, 1))  # mtimes do not matter
    write_directory_layer(root, "/opt/app", second)
    assert first.read_bytes() == second.read_bytes()

    base_dir = tmp_path / "base"
    (base_dir / "etc").mkdir(parents=True)
    (base_dir / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    base = tmp_path / "base.tar"
    write_directory_layer(base_dir, "/etc", base)
    config = ContainerConfig(env=("PATH=/opt/app/bin",), cmd=("tool", "--help"), user="7:7")
    archive = tmp_path / "image.tar"
    written = write_archive(
        archive, "example.test/app:1", [base, first], config, "amd64", ["a", "b"]
    )
    assert written.size == archive.stat().st_size
    contents = read(archive)
    assert contents.layers == 2
    assert contents.config == {
        "Env": ["PATH=/opt/app/bin"],
        "Cmd": ["tool", "--help"],
        "User": "7:7",
        "WorkingDir": "/",
    }
    assert contents.links["opt/app/bin/python"] == "/usr/bin/python3.11"
    assert contents.links["opt/app/lib64"] == "lib"
    assert contents.files["opt/app/lib"] == "5"
    assert contents.modes["opt/app/bin/tool"] == 0o755
    assert set(contents.uids.values()) == {0}
    assert contents.text("etc/passwd").startswith("root:")
    assert contents.text("opt/app/pyvenv.cfg") == "version = 3.11.2\n"
    again = write_archive(
        tmp_path / "again.tar", "example.test/app:1", [base, first], config, "amd64", ["a", "b"]
    )
    assert again.manifest_digest == written.manifest_digest
    assert (tmp_path / "again.tar").read_bytes() == archive.read_bytes()


def test_a_layer_refuses_what_is_not_a_file_dir_or_link(tmp_path: Path) -> None:
    root = _tree(tmp_path / "root")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(root / "opt" / "app" / "s"))
        with pytest.raises(ImageError, match="neither a file"):
            write_directory_layer(root, "/opt/app", tmp_path / "x.tar")
    finally:
        sock.close()


def test_an_archive_needs_a_tag_and_one_history_line_per_layer(tmp_path: Path) -> None:
    layer = tmp_path / "l.tar"
    write_directory_layer(_tree(tmp_path / "r"), "/opt/app", layer)
    config = ContainerConfig(env=())
    with pytest.raises(ImageError, match="no tag"):
        write_archive(tmp_path / "i.tar", "example.test/app", [layer], config, "amd64", ["a"])
    with pytest.raises(ImageError, match="history"):
        write_archive(tmp_path / "i.tar", "example.test/app:1", [layer], config, "amd64", [])


def _checkout(root: Path) -> Path:
    repo = Path(__file__).resolve().parents[3]
    for name in (*build.PACKAGING_FILES, "README.md"):
        shutil.copy(repo / name, root / name)
    for package in build.SOURCE_PACKAGES:
        (root / package).mkdir()
        (root / package / "__init__.py").write_text("")
    return root


def test_the_key_follows_the_wheels_sources_and_nothing_else(tmp_path: Path) -> None:
    root = _checkout(tmp_path)
    name = "docker.io/library/dradriver:0.1.0"
    key = build.image_key(name, root)
    (root / "tests").mkdir()
    (root / "tests" / "test_x.py").write_text("x = 1\n")
    (root / "dradriver" / "__pycache__").mkdir()
    (root / "dradriver" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\0")
    with open(root / "README.md", "a") as readme:
        readme.write("\nedited\n")
    # Tests and byte code are not in the wheel; the README is left out on purpose.
    assert build.image_key(name, root) == key
    (root / "controller" / "main.py").write_text("def main() -> None: ...\n")
    changed = build.image_key(name, root)
    assert changed != key
    assert build.image_key("docker.io/library/dradriver:0.2.0", root) != changed


def test_a_cached_archive_is_found_by_its_record_and_a_torn_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "src").mkdir()
    root = _checkout(tmp_path / "src")
    monkeypatch.setenv("DRADRIVER_CACHE_DIR", str(tmp_path / "cache"))
    name = build.default_name(root)
    path = build.image_path(name, root)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive bytes")
    image = build.BuiltImage(name, path, "sha256:00", 13, 5, 8, 1.0, cached=False)
    path.with_suffix(".json").write_text(json.dumps(image.record()))
    found = build.ensure_image(root=root)
    assert found.cached and found.manifest_digest == "sha256:00"
    path.write_bytes(b"torn")  # a size other than the record's: not a hit
    assert build._load_record(path) is None
    assert recipe.REPOSITORY in path.name


def test_pruning_keeps_the_most_recently_used_archives_and_bases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRADRIVER_CACHE_DIR", str(tmp_path))
    directory = tmp_path / "images"
    directory.mkdir()
    # The cluster's small test images share the dir and are never pruned.
    other = directory / "dradriver.dev_probe_dev-1.tar"
    other.write_bytes(b"")
    for i in range(6):
        for name in (f"dradriver-{i:016x}", f"dradriver-base-{i:016x}"):
            for suffix in (".tar", ".json", ".log"):
                (directory / (name + suffix)).write_text("")
            os.utime(directory / (name + ".tar"), (1000 + i, 1000 + i))
    os.utime(directory / f"dradriver-{0:016x}.tar")  # the oldest, but used just now
    removed = build.prune(keep=2, keep_bases=1)
    left = sorted(p.name for p in directory.iterdir())
    assert left == sorted(
        [
            other.name,
            *(f"dradriver-{i:016x}{s}" for i in (0, 5) for s in (".tar", ".json", ".log")),
            *(f"dradriver-base-{5:016x}{s}" for s in (".tar", ".json", ".log")),
        ]
    )
    assert len(removed) == 4 + 5
