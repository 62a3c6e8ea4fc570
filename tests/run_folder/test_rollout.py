"""`stapo_trl.run_folder.rollout`: a resume from any checkpoint ends with the uninterrupted run's weights (bitwise),
metrics rows (timing aside) and token records; a rollout that cannot be restored is generated again, in one line."""

from __future__ import annotations

import json
import logging
import re
import shutil
import signal
import textwrap

import pytest
import torch
from datasets import Dataset
from safetensors.torch import load_file
from testing_utils import SignalAtStep, read_jsonl, run_torchrun, tiny_stapo_config
from transformers import TrainerCallback

from stapo_trl import STAPOTrainer
from stapo_trl.cli.callbacks import add_command_callbacks
from stapo_trl.data import format_prompt
from stapo_trl.run_folder.rollout import load_rollout_state
from stapo_trl.trainer.trainers import GRPOBaselineTrainer


DATASET = Dataset.from_list(
    [{"prompt": format_prompt(f"{a}+{b}"), "solution": str(a + b)} for a in range(10, 100, 7) for b in (12, 47, 83)]
)
TIMING = re.compile(r"step_time|runtime|_per_second")
SIX = dict(max_steps=6, per_device_train_batch_size=8, save_steps=1, logging_steps=3)  # 6 steps, a checkpoint each
LAYOUTS = {"GA2": SIX | dict(gradient_accumulation_steps=2), "iterations2": SIX | dict(num_iterations=2),
           "mask-over-two-updates": SIX | dict(steps_per_generation=6, gradient_accumulation_steps=4),
           "grpo": SIX | dict(cls="grpo")}  # fmt: skip
RUNS = {"4-steps": {}, "3-epochs": dict(dataset=DATASET.select(range(16)), max_steps=24),
        "12-steps": dict(max_steps=12), **LAYOUTS}  # fmt: skip


def _trainer(model_path, out, cls=None, dataset=DATASET, **overrides):
    args = tiny_stapo_config(out, **dict(max_steps=4, per_device_train_batch_size=16, num_generations=8,
        steps_per_generation=4, max_completion_length=32, learning_rate=1e-4, logging_steps=4, save_strategy="steps",
        save_steps=2, disable_tqdm=True) | overrides)  # fmt: skip
    cls = GRPOBaselineTrainer if cls == "grpo" else cls or STAPOTrainer
    return cls(model_path, reward_funcs="math_accuracy", args=args, train_dataset=dataset)


def _rows(path) -> list[dict]:
    return [{k: v for k, v in row.items() if not TIMING.search(k)} for row in read_jsonl(path / "metrics.jsonl")]


def _outcome(trainer, out) -> dict:
    records = read_jsonl(out / "spurious_tokens.jsonl") if hasattr(trainer, "s2t") else None
    return {"weights": dict(trainer.model.state_dict()), "rows": _rows(out), "records": records}


def _copy_until(run, out, step: int) -> None:
    shutil.copytree(
        run, out, ignore=lambda _, names: [n for n in names if n[:11] == "checkpoint-" and int(n[11:]) > step]
    )


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_math_model_path):
    runs = {}

    def run(kind: str = "4-steps"):
        if kind not in runs:
            out = tmp_path_factory.mktemp(kind) / "run"
            (trainer := _trainer(tiny_math_model_path, out, **RUNS[kind])).train()
            assert kind != "4-steps" or trainer.state.log_history[0]["reward"] > 0  # the weights depend on completions
            runs[kind] = out, _outcome(trainer, out)
        return runs[kind]

    return run


@pytest.mark.parametrize("kind, step", [
    ("4-steps", 2), ("3-epochs", 8), ("3-epochs", 10), ("3-epochs", 18),
    *(pytest.param("12-steps", step, marks=pytest.mark.slow) for step in (2, 4, 6)),
    *(pytest.param(kind, step, marks=pytest.mark.slow) for kind in LAYOUTS for step in (1, 4)),
    pytest.param("4-steps", "stop-signal", marks=pytest.mark.slow),
])  # fmt: skip
def test_a_resume_ends_as_the_uninterrupted_run(uninterrupted, tiny_math_model_path, tmp_path, kind, step):
    # Inside a rollout batch and a logging window (checkpoint-2, -10), after an epoch boundary (3-epochs: 8 steps).
    run, expected = uninterrupted(kind)
    if kind in LAYOUTS:
        saved = json.loads((run / "checkpoint-1" / "rollout_state_0.json").read_text())["tensors"]
        assert ("batch.4.s2t_keep" in saved) == (kind == "mask-over-two-updates")
    if step == "stop-signal":  # stapo-train's save at a stop signal inside a rollout batch
        (trainer := _trainer(tiny_math_model_path, tmp_path / "run")).add_callback(SignalAtStep(3, signal.SIGTERM))
        add_command_callbacks(trainer)
        with pytest.raises(KeyboardInterrupt):
            trainer.train()
        assert [row["step"] for row in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [3]
    else:
        _copy_until(run, tmp_path / "run", step)
    trainer = _trainer(tiny_math_model_path, tmp_path / "run", **RUNS[kind])
    trainer.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-3") if step == "stop-signal" else True)
    outcome = _outcome(trainer, tmp_path / "run")
    assert outcome["rows"] == expected["rows"] and outcome["records"] == expected["records"]
    assert [n for n, w in expected["weights"].items() if not torch.equal(w, outcome["weights"][n])] == []


def _assert_fallback(caplog, checkpoint, why: str, micro_steps: int = 2) -> None:
    assert [r.getMessage() for r in caplog.records if "with a new rollout" in r.getMessage()] == [
        f"Resuming from {checkpoint}, {micro_steps} of the 4 micro-steps of a rollout batch in, with a new rollout: "
        f"{why}; the rest of this batch trains on other completions than the uninterrupted run's."
    ]


@pytest.mark.parametrize("changes, why", [
    ({}, "it holds no rollout_state_0.json (saved before checkpoints held the rollout)"),
    ({"world_size": 2}, "it was saved with another batch layout (world_size 2 -> 1)"),
    ({"steps_per_generation": 8}, "it was saved with another batch layout (steps_per_generation 8 -> 4)"),
], ids=["before-rollout-files", "another-world-size", "another-layout"])  # fmt: skip
def test_a_lost_rollout_is_redrawn(uninterrupted, tiny_math_model_path, tmp_path, caplog, changes, why):
    _copy_until(uninterrupted()[0], tmp_path / "run", 2)
    manifest = (checkpoint := tmp_path / "run" / "checkpoint-2") / "rollout_state_0.json"
    if changes:  # the manifest changed, or no rollout files (saved before they were)
        manifest.write_text(json.dumps(json.loads(manifest.read_text()) | changes))
    else:
        record = json.loads((checkpoint / "stapo_run.json").read_text())
        record["files"] = [name for name in record["files"] if not name.startswith("rollout_state_")]
        (checkpoint / "stapo_run.json").write_text(json.dumps(record))
        [path.unlink() for path in checkpoint.glob("rollout_state_*")]
    with caplog.at_level(logging.WARNING):
        assert load_rollout_state(_trainer(tiny_math_model_path, tmp_path / "run"), str(checkpoint)) is None
    _assert_fallback(caplog, checkpoint, why)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["objects-in-a-batch", "jit-checkpoint"])
def test_a_rollout_that_is_not_saved_is_generated_again(tiny_math_model_path, tmp_path, caplog, case):
    class WithNotes(STAPOTrainer):  # no pickle: a batch holding objects is not saved
        def _generate_and_score_completions(self, inputs):
            batch = super()._generate_and_score_completions(inputs)
            return batch | {"notes": [object() for _ in range(batch["advantages"].size(0))]}

    class JITCheckpoint(TrainerCallback):  # transformers' JITCheckpointCallback without its timer: inside an update
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            if state.global_step == 1:
                trainer._save_checkpoint(trainer.model, trial=None)
                control.should_training_stop = True

    cls, step = (WithNotes, 2) if (notes := case == "objects-in-a-batch") else (None, 1)
    trainer = _trainer(tiny_math_model_path, tmp_path / "run", cls, max_steps=2 if notes else 3)
    trainer.add_callback(TrainerCallback() if notes else JITCheckpoint())
    trainer.train()
    checkpoint = tmp_path / "run" / f"checkpoint-{step}"
    manifest = json.loads((checkpoint / "rollout_state_0.json").read_text())
    assert manifest["micro_batches"] == {} and manifest["tensors"] == {}
    with caplog.at_level(logging.WARNING):
        _trainer(tiny_math_model_path, tmp_path / "run", cls, max_steps=3 if notes else 2).train(
            resume_from_checkpoint=str(checkpoint))  # fmt: skip
    why = "its micro-batch 2 holds 'notes', a list, which is not saved (no pickle)" if notes else (
        "it was saved inside an optimizer update (transformers' JIT checkpoint)")  # fmt: skip
    _assert_fallback(caplog, checkpoint, why, micro_steps=step)


WORKER = textwrap.dedent(
    r"""
    import sys
    from datasets import Dataset
    from safetensors.torch import save_file
    from stapo_trl import STAPOConfig, STAPOTrainer
    from stapo_trl.data import format_prompt
    from stapo_trl.integrations.process_group import import_group_capturing_modules

    import_group_capturing_modules()
    model_path, out_dir, resume = sys.argv[1], sys.argv[2], sys.argv[3] == "resume"
    problems = [(a, b) for a in range(10, 100, 7) for b in (12, 47, 83)]
    dataset = Dataset.from_list([{"prompt": format_prompt(f"{a}+{b}"), "solution": str(a + b)} for a, b in problems])
    args = STAPOConfig(
        output_dir=out_dir, use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=8,
        num_generations=8, steps_per_generation=4, max_completion_length=48, learning_rate=1e-4, max_steps=6,
        logging_steps=4, save_strategy="steps", save_steps=2, disable_tqdm=True,
    )
    trainer = STAPOTrainer(model_path, reward_funcs="math_accuracy", args=args, train_dataset=dataset)
    trainer.train(resume_from_checkpoint=True if resume else None)
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    save_file(weights, f"{out_dir}/weights_{trainer.accelerator.process_index}.safetensors")
    trainer.end()
    report(f"rank {trainer.accelerator.process_index} done")
    """
)


@pytest.mark.slow  # two torchrun launches of 2 processes
def test_a_resume_inside_a_rollout_batch_is_exact_on_two_processes(tiny_math_model_path, tmp_path):
    run, resumed = tmp_path / "run", tmp_path / "resumed"
    output = run_torchrun(WORKER, tmp_path / "worker.py", tiny_math_model_path, str(run), "full", nproc=2)
    assert "rank 1 done" in output, output[-3000:]
    assert {p.name for p in (run / "checkpoint-2").glob("rollout_state_*")} == {
        f"rollout_state_{rank}.{ext}" for rank in (0, 1) for ext in ("json", "safetensors")
    }
    _copy_until(run, resumed, 2)
    output = run_torchrun(WORKER, tmp_path / "worker.py", tiny_math_model_path, str(resumed), "resume", nproc=2)
    assert "rank 1 done" in output and "with a new rollout" not in output, output[-3000:]
    for rank in (0, 1):
        expected, got = (load_file(f / f"weights_{rank}.safetensors") for f in (run, resumed))
        assert all(torch.equal(expected[k], got[k]) for k in expected)
    assert _rows(resumed) == _rows(run)
