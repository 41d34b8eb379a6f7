# The two set-up commands of the README: `make demo` and `make test`.
# Everything installs into .venv/ in the repo root; all targets use .venv/bin/python.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
DEPS_STAMP := $(VENV)/.vtpu-deps
# Importing torch during the build must not try to autoload the half-built backend.
export TORCH_DEVICE_BACKEND_AUTOLOAD := 0
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test build system-deps engine-test python-test host-path-test opinfo-full bench clean

demo: build
	$(VPY) -m torch_vtpu demo

test: build engine-test python-test host-path-test

# redis-server: the shared compile-cache tier's tests start one on a loopback port;
# libssl-dev: TLS to Redis (rediss://), whose tests make certificates with openssl.
system-deps:
	@missing=""; \
	for pkg in g++ cmake ninja-build libgtest-dev ccache redis-server libssl-dev openssl; do \
	  dpkg -s $$pkg >/dev/null 2>&1 || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $$missing; \
	fi

$(VPY):
	$(PYTHON) -m venv $(VENV)

# The Makefile too: a venv made before a dependency was added here gets it.
$(DEPS_STAMP): pyproject.toml Makefile | $(VPY)
	$(VPY) -m pip install -q --upgrade pip
	# torch pinned: the CPU wheel on disk (an unpinned torch would pull a CUDA build).
	$(VPY) -m pip install -q torch==2.13.0 numpy pytest pytest-xdist scikit-build-core ninja "cmake>=3.22" \
	    transformers==5.23.0 accelerate==1.15.0 tqdm expecttest
	touch $@

build: system-deps $(DEPS_STAMP)
	$(VPY) -m pip install -q --no-build-isolation -e . 2>&1 | grep -v "^WARNING: Location" || true
	@$(VPY) -c "import torch, torch_vtpu; assert torch.vtpu.is_available()" \
	  || { echo "torch_vtpu failed to build or import"; exit 1; }

engine-test: system-deps $(DEPS_STAMP)
	$(VENV)/bin/cmake -S engine -B build/engine -G Ninja -DCMAKE_BUILD_TYPE=Release \
	    -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV))/bin/ninja >/dev/null
	$(VENV)/bin/cmake --build build/engine -j2
	$(VENV)/bin/ctest --test-dir build/engine --output-on-failure -j2

# Generated kernels are the default: the ahead-of-time library serves the
# common ones, the rest compile on first use into a cache under build/.
# Two pytest workers, each taking whole files (module fixtures and a file's
# order stay as written; the kernel cache is shared between processes by
# design): most of the suite's time is kernel compiles, one compiler process
# at a time per worker, so two workers use both cores (34 -> 17 min on 2).
PYTEST_WORKERS ?= 2
python-test: build
	VTPU_CACHE_DIR=$(abspath build/kernel-cache) $(VPY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile tests/python

# The OpInfo CI slice again with generated kernels off: every op on ATen's CPU
# kernels through the host-kernel path (the path the long tail takes).
host-path-test: build
	VTPU_GENERATED_KERNELS=0 $(VPY) -m pytest -q tests/python/test_opinfo.py

# The whole OpInfo sweep (float32/bfloat16/int64 forward, float32 gradients);
# writes docs/opinfo_failures.md.
opinfo-full: build
	VTPU_CACHE_DIR=$(abspath build/kernel-cache) VTPU_OPINFO_FULL=1 $(VPY) -m pytest -q tests/python/test_opinfo.py -p no:cacheprovider || true
	$(VPY) tests/python/opinfo_report.py

bench: build
	$(VPY) -m torch_vtpu bench

clean:
	rm -rf build
