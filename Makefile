# Pilotfish: the README's commands. Each target does its own set-up on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PILOTFISH_CACHE ?= $(HOME)/.cache/pilotfish

.PHONY: demo test unit e2e bench crds lint typecheck binaries venv down clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip > $(VENV)/install.log 2>&1 || (cat $(VENV)/install.log; exit 1)
	$(PY) -m pip install -q -e '.[dev]' >> $(VENV)/install.log 2>&1 || (cat $(VENV)/install.log; exit 1)
	touch $@

venv: $(STAMP)

binaries:
	devcluster/build.sh

# The local control plane, Pilotfish installed on it, an example of each kind.
demo: $(STAMP) binaries
	$(VENV)/bin/pilotfish demo

down: $(STAMP)
	$(VENV)/bin/pilotfish dev down

# Every test: lint, unit and property tests, then e2e against the real control plane.
test: lint unit e2e

# One worker per core (pytest-xdist): the unit tests are CPU-bound and independent.
unit: $(STAMP) binaries  # binaries: the chart tests render with the pinned helm
	$(PY) -m pytest tests -q -n auto

# The modules that silence machines mostly wait out failure timings (40-100 s): they run on a
# cluster of their own (ports shifted by 1500) beside the rest of the suite. The real node's
# tests (root; one real node per host) run beside both on a third cluster (ports shifted by
# 3000) that starts the node (`pilotfish dev up --real-node`); once it is down, the chart is
# installed in-cluster on a real node of its own cluster (marker incluster), and then the
# tests that freeze the API server or kill Pilotfish's components get a cluster of their own
# (marker disruptive). The side streams' output follows the suite's.
LOSTNODES_LOG := build/e2e-lostnodes.log
REALNODE_LOG := build/e2e-realnode.log
e2e: $(STAMP) binaries
	@mkdir -p build
	@PILOTFISH_E2E_PORT_OFFSET=1500 $(PY) -m pytest e2e -q -m lostnodes --durations=10 \
	  > $(LOSTNODES_LOG) 2>&1 & lost=$$!; \
	(PILOTFISH_E2E_PORT_OFFSET=3000 $(PY) -m pytest e2e -q -m realnode --durations=5; a=$$?; \
	  PILOTFISH_E2E_PORT_OFFSET=3000 $(PY) -m pytest e2e -q -m incluster --durations=5; b=$$?; \
	  PILOTFISH_E2E_PORT_OFFSET=3000 $(PY) -m pytest e2e -q -m disruptive --durations=5; c=$$?; \
	  test $$a -eq 0 && test $$b -eq 0 && test $$c -eq 0) > $(REALNODE_LOG) 2>&1 & real=$$!; \
	$(PY) -m pytest e2e -q -m "not lostnodes and not realnode and not incluster and not disruptive" \
	  --durations=15; main=$$?; \
	wait $$lost; lostrc=$$?; wait $$real; realrc=$$?; \
	echo "--- e2e -m lostnodes (own cluster) ---"; cat $(LOSTNODES_LOG); \
	echo "--- e2e -m realnode, then -m incluster, then -m disruptive (own clusters) ---"; cat $(REALNODE_LOG); \
	test $$main -eq 0 && test $$lostrc -eq 0 && test $$realrc -eq 0

# Every benchmark (a benchmarks/*.py module with a main; the others are shared modules), each
# printing one JSON object, kept in benchmarks/results/<name>.json; then one table of every
# figure against its target, and the plots beside the JSON (`python -m benchmarks.report`).
BENCHMARKS := $(filter-out report,$(basename $(notdir $(shell grep -l '^if __name__ == "__main__":' benchmarks/*.py))))
RESULTS := benchmarks/results
bench: $(STAMP) binaries
	@mkdir -p $(RESULTS)
	@for b in $(BENCHMARKS); do \
	  $(PY) -m benchmarks.$$b > $(RESULTS)/$$b.json.part || exit 1; \
	  mv $(RESULTS)/$$b.json.part $(RESULTS)/$$b.json; \
	done
	$(PY) -m benchmarks.report --results $(RESULTS)

crds: $(STAMP)
	$(PY) -m pilotfish.api.crdgen

# mypy cannot follow setuptools' package-dir mapping, so it reads a tree of links shaped like
# the installed package.
typecheck: $(STAMP)
	@rm -rf build/typecheck && mkdir -p build/typecheck/pilotfish
	@for f in pilotfish/*; do ln -s ../../../$$f build/typecheck/pilotfish/; done
	@ln -s ../../../operators build/typecheck/pilotfish/operators
	@ln -s ../../../scheduler-extender build/typecheck/pilotfish/extender
	@ln -s ../../../admission-webhooks build/typecheck/pilotfish/webhooks
	cd build/typecheck && ../../$(VENV)/bin/mypy --config-file ../../pyproject.toml -p pilotfish
	$(VENV)/bin/mypy tests e2e benchmarks

lint: $(STAMP) typecheck
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf build $(VENV)
