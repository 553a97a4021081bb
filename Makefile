# Frontier: the two commands on a fresh machine are `make demo` and `make test`.
PY      ?= python3.11
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: install system-packages test test-quick test-fast typecheck demo lint fmt bench clean lock

install: $(STAMP)

$(STAMP): pyproject.toml hostside/pyproject.toml runtime/pyproject.toml gateway/pyproject.toml \
          runtime/frontier_runtime/ops/csrc/kernels.cpp requirements/toolkit.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# Every third-party wheel from the lock (`make lock`), each checked against its sha256; torch is
	# locked as the CPU wheel that lies on local disk, so nothing pulls a CUDA build.
	$(BIN)/pip install --quiet --require-hashes --no-deps -r requirements/toolkit.txt
	# Ours, built from this tree (no index has them); their dependencies are all in the lock.
	$(BIN)/pip install --quiet --no-deps -e './hostside' -e './runtime' -e './gateway' -e '.[dev]'
	# The native CPU kernels, every variant of this architecture (serving never compiles).
	$(BIN)/python -m frontier_runtime.ops.build_kernels
	touch $(STAMP)

system-packages:
	bash scripts/system-packages.sh

# requirements/*.txt: every third-party distribution of the toolkit, the runtime, the gateway and the
# runtime image, pinned with its hashes (uv, itself pinned, in .frontier/uv-venv; scripts/lock.sh).
lock:
	bash scripts/lock.sh

# CI: the lock files are what `make lock` writes from the pyprojects as they stand (nothing unlocked,
# and no lock it writes left uncommitted: the image's among them); the hashes themselves are checked
# by every --require-hashes install (make install, both stages of runtime/Dockerfile).
.PHONY: lock-check
lock-check:
	bash scripts/lock.sh
	git diff --exit-code -- requirements/
	@untracked=$$(git ls-files --others --exclude-standard -- requirements/); \
	test -z "$$untracked" || { echo "make lock wrote locks that are not committed: $$untracked"; exit 1; }

# pip-audit over every lock (scripts/audit_locks.py): fails on a known vulnerability; where the
# vulnerability service cannot be asked about every package it says "not run" and why.
.PHONY: audit
audit: install
	$(BIN)/python scripts/audit_locks.py

# Two lanes at once on one machine: the tests that start processes and servers (mostly waiting on
# sshd, HAProxy, runtimes and moto) run here on two workers, a room's tests on one of them
# (tests/conftest.py says which rooms share what), while the work that only computes (the type check,
# the scan, the tests that start nothing, the torch-ops run) runs beside them into a log printed at
# the end. Together they run every test; either lane failing fails the target.
LANE_LOG := .frontier/compute-lane.log
# checkov's venv before the lanes split: the scan runs in the compute lane, and the proc lane's
# tests of the scan (tests/kubernetes/test_security_scan.py) need it there from their start.
CHECKOV_VENV := .frontier/checkov-venv
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed
test: system-packages install lock-check audit $(CHECKOV_STAMP)
	@mkdir -p .frontier; rm -f $(LANE_LOG) $(LANE_LOG).rc
	@( $(MAKE) --no-print-directory test-compute-lane > $(LANE_LOG) 2>&1; echo $$? > $(LANE_LOG).rc ) & \
	$(BIN)/python -m pytest -q -m "proc or e2e" -n 2 --dist loadscope --durations=25; proc=$$?; \
	echo "waiting for the compute lane (typecheck, scan, the tests that start nothing, torch ops)"; wait; \
	echo "--- the compute lane ($(LANE_LOG)):"; cat $(LANE_LOG); \
	test $$proc -eq 0 && test "$$(cat $(LANE_LOG).rc)" = 0

.PHONY: test-compute-lane
test-compute-lane: typecheck scan
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not proc and not e2e" --durations=10
	$(MAKE) --no-print-directory test-torch-ops

# checkov, a peer scanner, over every stack's rendered Kubernetes manifests, every Dockerfile and the
# Pulumi programs' policy documents; each exception sits on the object it excuses (scripts/security_scan.py).
# checkov's own pins clash with ours: it gets its own venv, every wheel pinned by hash.

$(CHECKOV_STAMP): tools/checkov/requirements.txt
	test -x $(CHECKOV_VENV)/bin/python || $(PY) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install --quiet --require-hashes --no-deps -r tools/checkov/requirements.txt
	touch $(CHECKOV_STAMP)

.PHONY: scan
scan: install $(CHECKOV_STAMP)
	$(BIN)/python scripts/security_scan.py --checkov $(CHECKOV_VENV)/bin/checkov

# The engine's tests again on torch ops alone (native CPU kernels off): what a GPU host runs. The e2e
# ones (a replica over two nodes: processes and sockets, no kernel of their own) run once, above.
.PHONY: test-torch-ops
test-torch-ops: install
	FRONTIER_NATIVE_KERNELS=0 $(BIN)/python -m pytest -q -m "not native_kernels and not e2e" tests/runtime/engine

# Strict on the typed layers listed in pyproject.toml's [tool.mypy].
typecheck: install
	$(BIN)/mypy

# The quick tier: no process, no server (tests/conftest.py marks `proc`), nothing slow; under 2 minutes.
test-quick: install
	$(BIN)/python -m pytest -q -m "not proc and not e2e and not slow" --durations=15

test-fast: test-quick

demo: system-packages install
	$(BIN)/python -m frontier.demo

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

fmt: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install
	$(BIN)/python bench/engine_throughput.py

clean:
	rm -rf build dist .pytest_cache .frontier
