# Everything a fresh machine needs is installed by these targets.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: all install protos kube-binaries kube-binaries-all runtime-binaries helm kwok manifests image lint typecheck test test-unit test-grpc test-chart test-cluster test-compat matrix bench demo clean

# The releases the compatibility subset runs on besides the primary one
# (devtools/cluster/binaries.py: PRIMARY_VERSION, SUPPORTED_VERSIONS).
COMPAT_VERSIONS ?= v1.34.4 v1.35.4 v1.36.3 v1.38.0-beta.0

all: install

$(STAMP): pyproject.toml devtools/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]' -e ./devtools
	touch $(STAMP)

install: $(STAMP) protos

protos: $(STAMP)
	$(BIN)/python -m dradriver.kubeletapi.generate

# The primary release's binaries (kubectl included); kube-binaries-all adds
# every other supported release, each cached in ~/.cache/dradriver/kube/.
kube-binaries: install
	$(BIN)/dradriver cluster build

kube-binaries-all: install
	$(BIN)/dradriver cluster build --all

# containerd, runc, CNI plugins and the probe (node-1's real runtime), cached
# like the kube binaries in ~/.cache/dradriver/runtime/.
runtime-binaries: install
	$(BIN)/python -m devtools.cluster.runtimebin

# helm v3 from the Go module proxy (helmbin/), cached in ~/.cache/dradriver/helm/; prints
# its path. The chart tests and the README's install commands use it.
helm: install
	$(BIN)/python -m devtools.cluster.helmbin

# kwok v0.8.0 from the Go module proxy (kwokbin/), cached in ~/.cache/dradriver/kwok/; prints
# its path. The simulated nodes of `dradriver cluster up --kwok-nodes` and bench.scale.
kwok: install
	$(BIN)/python -m devtools.cluster.kwokbin

# Re-render manifests/ from the Helm chart (tests/chart fails while they differ).
manifests: helm
	$(BIN)/python -m devtools.manifests --write

# The dradriver image as an OCI archive in ~/.cache/dradriver/images/, built without a
# registry or a container engine (Debian's packages + the wheel; needs root), cached by
# content; `make image IMPORT=1` also loads it into the running local cluster's node-1.
image: install
	$(BIN)/python -m devtools.image build $(if $(IMPORT),--import)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/python -m devtools.shape

typecheck: install
	$(BIN)/mypy

# The README's test command: lint, import contracts, types, and every test tier
# (the cluster tier with node-1 on the real runtime; DRADRIVER_RUNTIME=fake for
# the fake one) on the primary release, then the compatibility subset on each
# other release, one cluster after another (they share the fixed ports). The
# image is built first, with its progress on the terminal, for
# tests/cluster/test_image.py and test_helm_chart.py (a cache hit when the wheel's
# sources are unchanged); helm for tests/chart and test_helm_chart.py.
test: lint typecheck kube-binaries-all runtime-binaries image helm kwok
	$(BIN)/pytest tests
	$(MAKE) test-compat

# The compat-marked cluster tests on each of COMPAT_VERSIONS. They record what
# they found in tests/cluster/matrix/<version>.json; the README's table must
# then match (`make matrix` rewrites it).
test-compat: kube-binaries-all runtime-binaries
	@set -e; for v in $(COMPAT_VERSIONS); do \
		echo "== compatibility subset on Kubernetes $$v"; \
		DRADRIVER_KUBE_VERSION=$$v $(BIN)/pytest -m compat tests/cluster; \
	done
	$(BIN)/python -m devtools.matrix --check

matrix: install
	$(BIN)/python -m devtools.matrix

test-unit: install
	$(BIN)/pytest tests/unit tests/devtools tests/bench

test-grpc: install
	$(BIN)/pytest tests/grpc

test-chart: helm
	$(BIN)/pytest tests/chart

test-cluster: kube-binaries runtime-binaries image helm kwok
	$(BIN)/pytest tests/cluster

# Every benchmark at full size; rewrites the README's performance section (machine, date,
# versions). Needs the machine to itself (bench/__init__.py, README "Benchmarks").
bench: kube-binaries runtime-binaries kwok
	$(BIN)/python -m bench --readme README.md

demo: kube-binaries runtime-binaries
	$(BIN)/dradriver demo

clean:
	rm -rf $(VENV) dradriver/kubeletapi/gen
