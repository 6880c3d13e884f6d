# TurboProm: the two Quickstart commands are `make demo` and `make test`.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DATA ?= ./data
LISTEN ?= 127.0.0.1:9090
# Debian packages the tests use as real peers.
APT_PEERS := prometheus victoria-metrics etcd-server nats-server prometheus-node-exporter chromium

.PHONY: demo test install peers clean bench

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# Installs the real peers the tests run against (needs root, as on this machine kind and in CI).
peers:
	@missing=""; for p in $(APT_PEERS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi

demo: $(STAMP)
	$(VPY) -m turboprom.demo --data-dir $(DATA) --listen $(LISTEN)

test: $(STAMP) peers
	$(VPY) -m pytest -q -ra

bench: $(STAMP) peers
	@echo "see bench/README.md for the individual benchmark scripts"

clean:
	rm -rf $(VENV) $(DATA) .pytest_cache
