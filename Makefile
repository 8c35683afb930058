# Everything a fresh machine needs is installed by these targets.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: all install protos kube-binaries kube-binaries-all runtime-binaries helm kwok manifests image lint typecheck test test-unit test-grpc test-chart test-cluster test-isolated test-compat test-docs-cluster matrix bench docs demo clean

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
# its path, and nothing else on stdout (its prerequisites print to stderr), so that
# `$(make -s helm) install ...` in the README and docs/install.md works as pasted.
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
# sources are unchanged); helm for tests/chart and test_helm_chart.py. Three pytest
# processes run at once, so the cluster tier (mostly waiting on the cluster) sets the
# pace: the cluster tier in front; beside it at nice 5 the tiers that need no cluster
# (unit, grpc, fuzz, chart, docs, the dev tools' and benches' logic); at nice 10 the
# isolated tier (clusters of their own on free ports: the fault suite, the torture and
# scale smokes). The two beside print their output after the cluster tier's.
test: lint typecheck kube-binaries-all runtime-binaries image helm kwok
	@logic=$$(mktemp); iso=$$(mktemp); \
	nice -n 5 $(BIN)/pytest -m "not cluster" --durations=10 tests \
		--ignore=tests/cluster --ignore=tests/isolated > $$logic 2>&1 & lpid=$$!; \
	nice -n 10 $(BIN)/pytest tests/isolated > $$iso 2>&1 & ipid=$$!; \
	$(BIN)/pytest --durations=25 tests/cluster; cluster=$$?; \
	wait $$lpid; logic_rc=$$?; wait $$ipid; isolated=$$?; \
	echo "== the tiers without a cluster (run beside the cluster tier at nice 5)"; \
	cat $$logic; \
	echo "== tests/isolated (clusters of their own, run beside the cluster tier at nice 10)"; \
	cat $$iso; rm -f $$logic $$iso; \
	test $$cluster -eq 0 && test $$logic_rc -eq 0 && test $$isolated -eq 0
	$(MAKE) test-docs-cluster
	$(MAKE) test-compat

# The README's cluster commands as written (tests/docs/test_runnable_cluster.py): they
# start and stop the local cluster themselves, so they run after the session's cluster
# is gone, like the compatibility subset.
test-docs-cluster: kube-binaries runtime-binaries image helm
	$(BIN)/pytest -m cluster tests/docs

# The compat-marked cluster tests on each of COMPAT_VERSIONS. They record what
# they found in tests/cluster/matrix/<version>.json; the table in docs/compatibility.md
# must then match (`make matrix` rewrites it).
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
	$(BIN)/pytest -m unit tests/docs

test-grpc: install
	$(BIN)/pytest tests/grpc

test-chart: helm
	$(BIN)/pytest tests/chart

test-cluster: kube-binaries runtime-binaries image helm kwok
	$(BIN)/pytest tests/cluster

test-isolated: kube-binaries runtime-binaries kwok
	$(BIN)/pytest tests/isolated

# Every benchmark at full size; rewrites the performance section of docs/benchmarks.md
# (machine, date, versions), then the plots on that page from it (bench/plots.py).
# Needs the machine to itself (bench/__init__.py, docs/benchmarks.md).
bench: kube-binaries runtime-binaries kwok
	BENCH_SCALE_RESULTS=docs/img/bench/scale-recorded.json $(BIN)/python -m bench --page docs/benchmarks.md
	$(BIN)/python -m bench.plots docs/benchmarks.md --results docs/img/bench/scale-recorded.json

# The documentation site: regenerate the reference pages and diagrams (devtools/docs/),
# then build strictly (a warning, a broken link or a page missing from the nav fails)
# into $(DOCS_SITE), outside the tracked tree. Offline: no fonts or scripts fetched.
DOCS_SITE ?= build/site
docs: install
	$(BIN)/python -m devtools.docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir $(DOCS_SITE)

demo: kube-binaries runtime-binaries
	$(BIN)/dradriver demo

clean:
	rm -rf $(VENV) dradriver/kubeletapi/gen
