"""`benchmarks/harness.py`: every arm of a comparison trains on one thread count (a fresh process per case)."""

import json
import os
import subprocess
import sys

import pytest
from testing_utils import REPO, builtin_cache_root


SCRIPT = """
import json, sys, tempfile, torch
from transformers import TrainerCallback
sys.path.insert(0, "benchmarks")
from harness import PLAIN_GRPO_RECIPE, STAPO_RECIPE, build_trainer
seen = {"default": torch.get_num_threads()}
for arm, recipe in (("GRPOTrainer", PLAIN_GRPO_RECIPE), ("STAPOTrainer", STAPO_RECIPE)):
    trainer, _ = build_trainer(recipe, ["--max_steps", "1", *sys.argv[1:]], workdir=tempfile.mkdtemp())
    package = type(trainer).__module__.split(".")[0]
    record = lambda *a, arm=arm, package=package, **k: seen.__setitem__(arm, (package, torch.get_num_threads()))
    trainer.add_callback(type("Threads", (TrainerCallback,), {"on_step_end": record}))
    trainer.train()
print(json.dumps(seen))
"""


@pytest.mark.slow  # a fresh process per case (this one pins one thread): ~20 s each on 2 cores
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="torch's default is already one thread on one core")
@pytest.mark.parametrize(  # the recipes' torch_num_threads: 1; a recipe override; the caller's environment, which wins
    "environ, overrides, expected",
    [({}, [], 1), ({}, ["--torch_num_threads", "2"], 2), ({"OMP_NUM_THREADS": "2"}, [], 2)],
)
def test_plain_grpo_and_stapo_arms_train_on_the_same_thread_count(tiny_math_model_path, tmp_path, environ, overrides,
                                                                  expected):  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env |= environ | {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    env["STAPO_TRL_CACHE"] = str(builtin_cache_root(tiny_math_model_path))
    command = [sys.executable, "-c", SCRIPT, *overrides]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["default"] == len(os.sched_getaffinity(0))  # nothing set before the harness
    assert seen["GRPOTrainer"] == ["trl", expected] and seen["STAPOTrainer"] == ["stapo_trl", expected]
