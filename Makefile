# stapo_trl developer commands. Everything runs inside .venv, created on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
export DS_BUILD_OPS ?= 0

.PHONY: install test test-slow quality style demo compare bench evaluate clean

install: $(VENV)/.installed

# torch comes first from the CPU pin: unpinned, trl/accelerate would pull a CUDA build of several GB.
$(VENV)/.installed: setup.cfg constraints-cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints-cpu.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints-cpu.txt -e ".[dev]"
	touch $@

test: install
	$(PY) -m pytest -q -m "not slow" tests

test-slow: install
	$(PY) -m pytest -q -m slow tests

quality: install
	$(PY) -m ruff check stapo_trl tests benchmarks
	$(PY) -m ruff format --check stapo_trl tests benchmarks

style: install
	$(PY) -m ruff check --fix stapo_trl tests benchmarks
	$(PY) -m ruff format stapo_trl tests benchmarks

demo: install
	$(VENV)/bin/stapo-train --config recipes/demo/stapo.yaml

compare: install
	$(VENV)/bin/stapo-train compare recipes/demo/grpo.yaml recipes/demo/stapo.yaml

# The sections of benchmarks/bench.py (overhead vs the off twin and GRPOTrainer, mask scaling, learning, gpu), then
# the per-update scope table, the stapo-train demo wall time against its off twin, and grading throughput.
bench: install
	$(PY) benchmarks/bench.py
	$(PY) benchmarks/scopes.py
	$(PY) benchmarks/demo_wall.py
	$(PY) benchmarks/grading_throughput.py

MODEL ?= outputs/demo-stapo
BENCHMARKS ?= aime24,aime25,amc23,math500,minerva,olympiadbench
evaluate: install
	$(VENV)/bin/stapo-eval --model $(MODEL) --benchmarks $(BENCHMARKS) $(EVAL_ARGS)

clean:
	rm -rf $(VENV) outputs build *.egg-info
