# Everything a fresh machine needs is installed by these targets.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: all install protos kube-binaries runtime-binaries image lint typecheck test test-unit test-grpc test-cluster demo clean

all: install

$(STAMP): pyproject.toml devtools/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]' -e ./devtools
	touch $(STAMP)

install: $(STAMP) protos

protos: $(STAMP)
	$(BIN)/python -m dradriver.kubeletapi.generate

kube-binaries: install
	$(BIN)/dradriver cluster build

# containerd, runc, CNI plugins and the probe (node-1's real runtime), cached
# like the kube binaries in ~/.cache/dradriver/runtime/.
runtime-binaries: install
	$(BIN)/python -m devtools.cluster.runtimebin

# The dradriver image as an OCI archive in ~/.cache/dradriver/images/, built without a
# registry or a container engine (Debian's packages + the wheel; needs root), cached by
# content; `make image IMPORT=1` also loads it into the running local cluster's node-1.
image: install
	$(BIN)/python -m devtools.image build $(if $(IMPORT),--import)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: install
	$(BIN)/mypy

# The README's test command: lint, import contracts, types, and every test tier
# (the cluster tier with node-1 on the real runtime; DRADRIVER_RUNTIME=fake for
# the fake one). The image is built first, with its progress on the terminal, for
# tests/cluster/test_image.py (a cache hit when the wheel's sources are unchanged).
test: lint typecheck kube-binaries runtime-binaries image
	$(BIN)/pytest tests

test-unit: install
	$(BIN)/pytest tests/unit

test-grpc: install
	$(BIN)/pytest tests/grpc

test-cluster: kube-binaries runtime-binaries image
	$(BIN)/pytest tests/cluster

demo: kube-binaries runtime-binaries
	$(BIN)/dradriver demo

clean:
	rm -rf $(VENV) dradriver/kubeletapi/gen
