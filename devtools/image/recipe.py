"""What the dradriver image is: the one declaration both recipes follow.

The registry-less build (:mod:`devtools.image.build`) reads these values; the
``Dockerfile`` at the top of the repository spells the same image for users
with a registry, and ``tests/devtools/image/test_recipe.py`` fails when the two
disagree (base, packages, Python, user, environment, commands).

The image: Debian's root filesystem (``minbase``, docs and locales left out
as in Debian's ``-slim`` images) with Debian's Python 3.11, and a virtualenv
at :data:`VENV` without pip or setuptools that holds the dradriver wheel and
its runtime dependencies only. The default user is the unprivileged
:data:`USER_NAME` (uid/gid :data:`UID`): the controller runs as it. The node
plugin needs root (its pod sets ``runAsUser: 0`` and ``privileged``): it
writes the kubelet's plugin and registration sockets under
``/var/lib/kubelet``, CDI specs under ``/var/run/cdi``, its ledger, and makes
device nodes (``CAP_MKNOD``), all on host paths owned by root.
"""

from __future__ import annotations

DEBIAN_SUITE = "bookworm"
# Debian's own mirror; mmdebstrap takes it as the one apt source.
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# minbase plus these: the interpreter and its standard library, nothing that
# compiles or fetches (no pip, no python3-venv's ensurepip, no build tools).
PACKAGES = ("python3-minimal", "libpython3.11-stdlib")
PYTHON_MINOR = "3.11"
PYTHON = f"/usr/bin/python{PYTHON_MINOR}"
# Left out of every package, as Debian's slim images do.
DPKG_PATH_EXCLUDES = (
    "/usr/share/doc/*",
    "/usr/share/man/*",
    "/usr/share/info/*",
    "/usr/share/locale/*",
)

VENV = "/opt/dradriver"
USER_NAME = "dradriver"
UID = 65532
USER = f"{UID}:{UID}"
# The commands that make the user, run in the image (the Dockerfile runs the same).
ADD_USER = (
    ("groupadd", "--gid", str(UID), USER_NAME),
    (
        "useradd",
        "--uid",
        str(UID),
        "--gid",
        str(UID),
        "--no-create-home",
        "--home-dir",
        "/nonexistent",
        "--shell",
        "/usr/sbin/nologin",
        USER_NAME,
    ),
)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ENV = (
    f"PATH={VENV}/bin:{DEFAULT_PATH}",
    # Logs reach the kubelet as they are written.
    "PYTHONUNBUFFERED=1",
    # The byte code is compiled at build time; the root filesystem may be read-only.
    "PYTHONDONTWRITEBYTECODE=1",
)
# The distribution installed into the venv, without extras (no [dev]).
DISTRIBUTION = "dradriver"
# The commands the image exists for; the pod spec picks one with `command:`.
COMMANDS = ("dradriver-kubeletplugin", "dradriver-controller")
# No entrypoint: `command:` (or `docker run IMAGE dradriver-controller ...`) names the
# program. Without one the image explains itself.
CMD = ("dradriver-kubeletplugin", "--help")

REPOSITORY = "dradriver"
# containerd and the kubelet normalise "dradriver:TAG" to this name.
CANONICAL_PREFIX = "docker.io/library/"

# Distributions that must never be in the image: dev tooling and the build
# machinery (the stub generator, installers, test and lint tools, devtools).
FORBIDDEN = frozenset(
    {
        "dradriver-devtools",
        "grpcio-tools",
        "pip",
        "setuptools",
        "wheel",
        "pytest",
        "pytest-timeout",
        "hypothesis",
        "ruff",
        "mypy",
        "import-linter",
        "types-pyyaml",
        "types-protobuf",
        "grpc-stubs",
        # The local cluster's PKI and the webhook tests' certificates; no runtime
        # dependency needs it today. Should one pull it in, drop it here with that reason.
        "cryptography",
        # Tests and benches read /metrics with its parser; the driver writes the format
        # itself (dradriver/metrics.py).
        "prometheus-client",
        # The tests' and the dev harness' HTTP client; the driver's own transport is
        # dradriver/k8s/http.py.
        "httpx",
        # The documentation site (`make docs`) and the benchmark plots (bench/plots.py).
        "mkdocs",
        "mkdocs-material",
        "pymdown-extensions",
        "matplotlib",
    }
)
