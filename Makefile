# TurboProm: the two Quickstart commands are `make demo` and `make test`.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DATA ?= ./data
LISTEN ?= 127.0.0.1:9090
# Debian packages the tests use as real peers.
APT_PEERS := prometheus victoria-metrics etcd-server nats-server prometheus-node-exporter chromium prometheus-alertmanager

# The compiled ingest hot path (ingest/csrc -> ingest/_rw_native*.so), built in place; rebuilt when
# its C source or setup.py changes. Without it ingest uses the pure-Python walk (same results).
EXT_SUFFIX := $(shell $(PY) -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))' 2>/dev/null)
NATIVE_SO = ingest/_rw_native$(EXT_SUFFIX)
# The HTTP API's compiled matrix JSON assembly (turboprom/csrc -> turboprom/_json_native*.so), same build.
JSON_SO = turboprom/_json_native$(EXT_SUFFIX)
# The head's merge of sorted runs (storage/csrc -> storage/_merge_native*.so), same build.
MERGE_SO = storage/_merge_native$(EXT_SUFFIX)
NATIVE_ALL = $(NATIVE_SO) $(JSON_SO) $(MERGE_SO)

.PHONY: demo test install native peers clean bench cluster-demo

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[test]'
	touch $(STAMP)

$(NATIVE_ALL) &: $(wildcard ingest/csrc/*.c) $(wildcard turboprom/csrc/*.c) $(wildcard storage/csrc/*.c) setup.py $(STAMP)
	$(VPY) -c 'import setuptools' 2>/dev/null || $(VPY) -m pip install -q 'setuptools>=68'  # venvs of Python 3.12+ have none
	$(VPY) setup.py -q build_ext --inplace
	test -f $(NATIVE_SO) && test -f $(JSON_SO) && test -f $(MERGE_SO) && touch $(NATIVE_ALL)  # fails loudly when a C build failed (setup.py marks them optional for pip)

native: $(NATIVE_ALL)

install: $(STAMP) $(NATIVE_ALL)

# Installs the real peers the tests run against (needs root, as on this machine kind and in CI).
peers:
	@missing=""; for p in $(APT_PEERS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi

demo: $(STAMP) $(NATIVE_ALL)
	$(VPY) -m turboprom.demo --data-dir $(DATA) --listen $(LISTEN)

# A local cluster on loopback (3 NATS JetStream nodes, 3 etcd members, distributor, 2 ingesters, querier; docs/cluster.md).
cluster-demo: $(STAMP) $(NATIVE_ALL) peers
	$(VPY) -m turboprom.cluster.demo --dir $(DATA)-cluster

# Two workers (the CI machine's two cores), one test file per worker at a time (a file's servers and
# peers are started once, as in a serial run): ~17 min instead of ~31 serially.
test: $(STAMP) $(NATIVE_ALL) peers
	$(VPY) -m pytest -q -ra -n 2 --dist loadfile

bench: $(STAMP) peers
	@echo "see bench/README.md for the individual benchmark scripts"

clean:
	rm -rf $(VENV) $(DATA) .pytest_cache build ingest/_rw_native*.so turboprom/_json_native*.so storage/_merge_native*.so
