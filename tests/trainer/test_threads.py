"""Every entry point runs a built-in tiny model on one torch thread unless the caller chose a count."""

import os
import shutil

import pytest
import torch
from datasets import Dataset
from testing_utils import tiny_stapo_config
from transformers import TrainerCallback

from stapo_trl import STAPOTrainer
from stapo_trl.data import format_prompt
from stapo_trl.rewards import math_accuracy_reward
from stapo_trl.trainer.trainers import _torch_default_threads, tiny_model_threads


@pytest.fixture
def torch_default_threads(monkeypatch):  # torch's count as it starts (tests/conftest.py pins one), restored after
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    previous = torch.get_num_threads()
    torch.set_num_threads(default := max(_torch_default_threads()))
    yield default
    torch.set_num_threads(previous)


def test_the_rule_applies_to_tiny_models_only_and_gives_way_to_the_callers_count(torch_default_threads, monkeypatch,
        tiny_math_model_path, tmp_path):  # fmt: skip
    default = torch_default_threads
    (tmp_path / "model.safetensors").write_bytes(b"\0" * (5 * 2**20))  # a larger model's weights
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


@pytest.mark.filterwarnings("ignore")
@pytest.mark.slow  # trains, evaluates and predicts on the tiny model (stapo-eval: tests/models/test_loading.py)
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="torch's default is already one thread on one core")
def test_every_entry_point_runs_a_model_trained_from_the_tiny_one_on_one_thread(torch_default_threads, tmp_path,
        tiny_math_model_path):  # fmt: skip
    seen = []

    class Record(TrainerCallback):  # on_prediction_step: evaluate() and predict()
        on_step_end = on_prediction_step = lambda *a, **k: seen.append(torch.get_num_threads())  # noqa: E731

    model = shutil.copytree(tiny_math_model_path, tmp_path / "trained", ignore=shutil.ignore_patterns("stapo_*.json"))
    dataset = Dataset.from_list([{"prompt": format_prompt(f"{a}+{a}"), "solution": str(2 * a)} for a in range(10, 18)])
    args = tiny_stapo_config(tmp_path / "run", max_steps=1, per_device_eval_batch_size=4, num_generations=4)
    trainer = STAPOTrainer(str(model), math_accuracy_reward, args=args, train_dataset=dataset,
                           eval_dataset=dataset.select(range(4)), callbacks=[Record()])  # fmt: skip
    trainer.train()
    trainer.evaluate()
    trainer.predict(dataset.select(range(4)))
    assert len(seen) >= 3 and set(seen) == {1}  # the reported case: each ran at torch's default
    assert torch.get_num_threads() == torch_default_threads  # restored after each
    torch.set_num_threads(3)  # the caller's own count wins
    seen.clear()
    trainer.evaluate()
    assert set(seen) == {3} and torch.get_num_threads() == 3
