# The two commands of the README: `make demo` and `make test`. Both set up what they need.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast lint system-deps demo-deps clean

# System packages: util-linux (unshare, for the worker's mount namespace), iproute2 and nftables (every worker's own
# network), jq and curl (the pages' shell lines) for the demo; the tests also use chromium (console tests) and the
# container runtime's tools with a local registry and test images (runc, skopeo, umoci, docker-registry, busybox-static, mmdebstrap,
# apache2-utils for a registry password), and for drives across machines NFS-Ganesha with its VFS backend and a
# userspace NFS client (libnfs-utils: nfs-cp, nfs-ls), since the kernel of CI machines may have no NFS client.
DEMO_DEPS := unshare:util-linux jq:jq curl:curl ip:iproute2 nft:nftables
TEST_DEPS := $(DEMO_DEPS) chromium:chromium runc:runc skopeo:skopeo umoci:umoci docker-registry:docker-registry busybox:busybox-static mmdebstrap:mmdebstrap htpasswd:apache2-utils \
	ganesha.nfsd:nfs-ganesha /usr/lib/x86_64-linux-gnu/ganesha/libfsalvfs.so:nfs-ganesha-vfs nfs-cp:libnfs-utils \
	node:nodejs npm:npm

define apt_for
	@missing=""; for pair in $(1); do c=$${pair%%:*}; p=$${pair#*:}; \
	  command -v $$c >/dev/null 2>&1 || test -e $$c || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "run as root, or install:$$missing" >&2; exit 1; fi; \
	fi
endef

system-deps:
	$(call apt_for,$(TEST_DEPS))

demo-deps:
	$(call apt_for,$(DEMO_DEPS))

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,torch]'
	touch $(STAMP)

# The per-worker supervisor in C (astraeus.agent.runtime.native); without a C compiler every worker gets the
# Python shim, which keeps the same guarantees.
NATIVE_SHIM := src/astraeus/agent/runtime/astraeus-shim
$(NATIVE_SHIM): src/astraeus/agent/runtime/shim_native.c
	@if command -v cc >/dev/null 2>&1; then cc -O2 -Wall -Wextra -Wno-format-truncation -o $@ $< || exit 1; \
	  else echo "no C compiler (cc): workers get the Python shim"; fi

install: $(STAMP) $(NATIVE_SHIM)

demo: install demo-deps
	$(BIN)/python -m astraeus.demo

# Starts PostgreSQL if it is not up (dev machines and CI have it installed), then the whole suite with the files
# side by side (TEST_WORKERS processes; most tests wait on real processes, not on the CPU; each file's tests in
# order on one worker, tests/conftest.py's SHARED_GROUPS together): much faster than one process (TEST_WORKERS=0),
# even on a machine with few cores. Under that load a timing-sensitive test may fail now and then: the tests that failed
# side by side run again, alone, in one process, and the output names them (a test that fails alone too fails
# make test). Then the tests marked `serial` (they restart PostgreSQL under everyone) alone.
TEST_WORKERS ?= 4
TEST_CACHE := build/pytest-cache
PYTEST := $(BIN)/python -m pytest -q -rs  # -rs: each skipped test named, with its reason
test: install system-deps
	@pg_isready -h 127.0.0.1 -p 5432 -q || (pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql) main start && sleep 2) || true
	@rm -rf $(TEST_CACHE); \
	  $(PYTEST) -o cache_dir=$(TEST_CACHE) -n $(TEST_WORKERS) --dist loadfile --durations=40 -m 'not serial'; side=$$?; \
	  if [ $$side = 1 ] && [ "$(TEST_WORKERS)" != 0 ]; then \
	    echo "make test: the tests that failed side by side, again alone in one process:"; \
	    $(PYTEST) -o cache_dir=$(TEST_CACHE) -rfEp --lf --lfnf=none -m 'not serial'; side=$$?; fi; \
	  $(PYTEST) -p no:cacheprovider -m serial; alone=$$?; \
	  echo "make test: the suite exit $$side, the serial tests exit $$alone"; test $$side = 0 -a $$alone = 0

test-fast: install
	$(BIN)/python -m pytest -q -m 'not faults and not browser' -x

lint: install
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
