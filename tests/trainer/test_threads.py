"""Every entry point that runs a built-in tiny model (`train`, `evaluate`, `predict`, `stapo-eval`) does so on one torch
thread unless the caller chose a count.

The reported cases: `examples/python_api.py` as printed took 1 min 44 s (`train_runtime` 96 s) on 2 shared cores at
torch's default of one thread per core, and 9.7 s (3.1 s) with `OMP_NUM_THREADS=1`; the recipes set
`torch_num_threads: 1`, the API did not. Then `trainer.evaluate()` after `train()` ran on torch's 2 threads: 79 s
against 1.9 s on one. Measured in fresh processes: the test process itself pins torch to one thread
(tests/conftest.py).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


REPO_ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json
import shutil
import sys

import torch
from datasets import Dataset
from transformers import AutoConfig, AutoModelForCausalLM, TrainerCallback

from stapo_trl import STAPOConfig, STAPOTrainer
from stapo_trl.data import format_prompt
from stapo_trl.rewards import math_accuracy_reward

model_path, output_dir, scenarios = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
dataset = Dataset.from_list([{"prompt": format_prompt(f"{a}+{a}"), "solution": str(2 * a)} for a in range(10, 30)])


class Record(TrainerCallback):
    def __init__(self):
        self.seen, self.evaluating = [], []

    def on_step_end(self, args, state, control, **kwargs):
        self.seen.append(torch.get_num_threads())

    def on_prediction_step(self, args, state, control, **kwargs):  # evaluate() and predict()
        self.evaluating.append(torch.get_num_threads())


def run(model):
    record = Record()
    config = STAPOConfig(
        output_dir=output_dir, max_steps=1, per_device_train_batch_size=4, num_generations=4,
        max_completion_length=8, save_strategy="no", report_to="none", disable_tqdm=True,
    )
    before = torch.get_num_threads()
    STAPOTrainer(model, math_accuracy_reward, args=config, train_dataset=dataset, callbacks=[record]).train()
    return {"before": before, "during": record.seen[0], "after": torch.get_num_threads()}


def stapo_eval(model):  # the command, in this process: the threads each generate call runs on
    from stapo_trl.cli.eval import main
    from stapo_trl.evaluation.generation import HFGenerator

    seen, generate = [], HFGenerator.generate
    HFGenerator.generate = lambda self, *a, **k: seen.append(torch.get_num_threads()) or generate(self, *a, **k)
    before = torch.get_num_threads()
    argv = ["--model", model, "--benchmarks", "tiny-math", "--backend", "hf", "--decoding", "greedy", "--limit", "2"]
    main(argv + ["--samples", "1", "--max-new-tokens", "8", "--output", output_dir + f"-{len(results)}.json"])
    HFGenerator.generate = generate
    return {"before": before, "during": seen[0], "after": torch.get_num_threads()}


results = {}
for scenario in scenarios:
    if scenario == "default":
        results[scenario] = run(model_path)
    elif scenario == "set_num_threads_3":
        torch.set_num_threads(3)
        results[scenario] = run(model_path)
    elif scenario.startswith(("trained_", "larger_")):  # models other than the built-in folder itself
        torch.set_num_threads(results["default"]["before"])
        # What a run trained from the built-in model saves (its output folder, a checkpoint): no build record.
        trained = shutil.copytree(
            model_path, output_dir + "-trained", ignore=shutil.ignore_patterns("stapo_builtin.json"), dirs_exist_ok=True
        )
        if scenario == "trained_folder":
            results[scenario] = run(trained)
        elif scenario == "trained_model":  # a model object loaded from it
            results[scenario] = run(AutoModelForCausalLM.from_pretrained(trained))
        elif scenario == "trained_stapo_eval":
            results[scenario] = stapo_eval(trained)
        else:  # larger_model: the same architecture 8x wider (7.6M parameters, 30 MB): torch's default
            larger = shutil.copytree(trained, output_dir + "-larger", dirs_exist_ok=True)
            config = AutoConfig.from_pretrained(larger)
            config.update({"hidden_size": 512, "intermediate_size": 2048, "num_attention_heads": 8, "head_dim": 64})
            AutoModelForCausalLM.from_config(config).save_pretrained(larger)
            results[scenario] = run(larger)
    elif scenario.startswith(("evaluate", "predict")):  # after train(), as open-r1's do_eval; "_3": set to 3 first
        record, config = Record(), STAPOConfig(
            output_dir=output_dir, max_steps=1, per_device_train_batch_size=4, num_generations=4,
            per_device_eval_batch_size=4, max_completion_length=8, save_strategy="no", report_to="none",
            disable_tqdm=True,
        )
        trainer = STAPOTrainer(
            model_path, math_accuracy_reward, args=config, train_dataset=dataset, eval_dataset=dataset.select(range(4)),
            callbacks=[record],
        )
        trainer.train()
        if scenario.endswith("_3"):
            torch.set_num_threads(3)
        before = torch.get_num_threads()
        trainer.evaluate() if scenario.startswith("evaluate") else trainer.predict(dataset.select(range(4)))
        results[scenario] = {"before": before, "during": record.evaluating[0], "after": torch.get_num_threads()}
    elif scenario == "stapo_eval":
        results[scenario] = stapo_eval(model_path)
print(json.dumps(results))
"""


def _threads_in_fresh_process(tmp_path, model_path: str, scenarios: list[str], **env) -> dict:
    script = tmp_path / "threads_script.py"
    script.write_text(SCRIPT)
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", **env}
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if name not in env:
            environment.pop(name, None)
    proc = subprocess.run(
        [sys.executable, str(script), model_path, str(tmp_path / "out"), ",".join(scenarios)],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


needs_two_cores = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="torch's default is already one thread on one core"
)


@pytest.mark.slow  # a fresh process training, evaluating and predicting in several scenarios (~1-3 min)
@needs_two_cores
def test_every_entry_point_defaults_to_one_thread_for_tiny_models_and_keeps_explicit_counts(
    tmp_path, tiny_math_model_path
):
    trained = ["trained_folder", "trained_model", "trained_stapo_eval"]
    scenarios = ["default", "set_num_threads_3", "larger_model", *trained, "evaluate", "predict", "stapo_eval"]
    results = _threads_in_fresh_process(tmp_path, tiny_math_model_path, [*scenarios, "evaluate_3"])
    default = results["default"]
    assert default["before"] == len(os.sched_getaffinity(0))  # torch's default: one thread per available core
    assert default["during"] == 1  # the reported case: the example ran at torch's default
    assert default["after"] == default["before"]  # restored after train()
    assert results["set_num_threads_3"] == {"before": 3, "during": 3, "after": 3}  # torch.set_num_threads wins
    assert results["larger_model"]["during"] == default["before"]  # a larger model keeps torch's default
    # evaluate() after train() ran on torch's default (the reported case), and so did predict() and stapo-eval; and
    # so did a model trained from the tiny one (its folder has no build record): `stapo-eval --model
    # outputs/demo-stapo`, the README's command, took 22-26 s against 5 s for 100 problems on 2 shared cores.
    one_thread = {"before": default["before"], "during": 1, "after": default["before"]}
    entry_points = [*trained, "evaluate", "predict", "stapo_eval"]
    assert {name: results[name] for name in entry_points} == {name: one_thread for name in entry_points}
    assert results["evaluate_3"] == {"before": 3, "during": 3, "after": 3}


@pytest.mark.slow
@needs_two_cores
def test_omp_num_threads_wins(tmp_path, tiny_math_model_path):
    scenarios = ["default", "evaluate", "stapo_eval"]
    results = _threads_in_fresh_process(tmp_path, tiny_math_model_path, scenarios, OMP_NUM_THREADS="2")
    assert [results[scenario]["during"] for scenario in scenarios] == [2, 2, 2]


def test_the_rule_applies_to_tiny_models_only_and_gives_way_to_the_callers_count(
    monkeypatch, tiny_math_model_path, tmp_path
):
    import torch

    from stapo_trl.trainer.trainers import _torch_default_threads, tiny_model_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    (tmp_path / "model.safetensors").write_bytes(b"\0" * (5 * 2**20))  # a larger model's weights
    previous = torch.get_num_threads()
    default = max(_torch_default_threads())
    try:
        torch.set_num_threads(default)  # as torch starts
        for model, inside in ((tiny_math_model_path, 1), (str(tmp_path), default), ("Qwen/Qwen3-1.7B", default)):
            with tiny_model_threads(model):
                assert torch.get_num_threads() == inside, model
            assert torch.get_num_threads() == default  # restored
        torch.set_num_threads(default + 5)  # the caller's own count wins
        with tiny_model_threads(tiny_math_model_path):
            assert torch.get_num_threads() == default + 5
        torch.set_num_threads(default)
        monkeypatch.setenv("OMP_NUM_THREADS", "2")  # and so does OMP_NUM_THREADS
        with tiny_model_threads(tiny_math_model_path):
            assert torch.get_num_threads() == default
    finally:
        torch.set_num_threads(previous)
