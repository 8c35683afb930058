# The dradriver image (dradriver-kubeletplugin and dradriver-controller) for users with a
# registry and a container engine:
#   docker build -t dradriver:0.1.0 .
# The same image is built without either by `make image` (devtools/image/recipe.py declares
# it); tests/devtools/image/test_recipe.py fails when this file and that recipe disagree.
# Debian 12's Python 3.11, a venv at /opt/dradriver with the wheel and its runtime
# dependencies only (no pip, no setuptools, no dev tools), user 65532. The controller runs
# as that user; the node plugin's pod runs it as root (kubelet sockets, CDI specs, device
# nodes on host paths).

FROM debian:bookworm-slim AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-minimal libpython3.11-stdlib python3-pip python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY dradriver dradriver
COPY controller controller
COPY kubeletplugin kubeletplugin
# setup.py generates the kubelet gRPC stubs while the wheel builds (grpcio-tools is a
# build requirement only).
RUN python3 -m pip wheel --no-cache-dir --wheel-dir /wheels .
RUN python3.11 -m venv --without-pip /opt/dradriver \
 && python3 -m pip --python /opt/dradriver/bin/python install --no-index --find-links /wheels --no-compile --no-cache-dir dradriver \
 && /opt/dradriver/bin/python -m compileall -q --invalidation-mode unchecked-hash /opt/dradriver/lib

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-minimal libpython3.11-stdlib \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 dradriver \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin dradriver
COPY --from=build /opt/dradriver /opt/dradriver
ENV PATH=/opt/dradriver/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
CMD ["dradriver-kubeletplugin", "--help"]
