"""The run-file callbacks (`stapo_trl.run_files`): `STAPOTrainer.train()` adds each writer once (a caller's
own logger replaces the built-in one; `s2t_write_run_files=False` adds none), `MetricsLogCallback` writes strict JSON
and drops the steps a resume redoes, and the tracker table labels tokens as the figures do."""

from __future__ import annotations

import types
import warnings
from pathlib import Path

from datasets import Dataset
from testing_utils import tiny_stapo_config

from stapo_trl import STAPOTrainer
from stapo_trl.data import INSTRUCTION
from stapo_trl.rewards import math_accuracy_reward
from stapo_trl.run_files import MetricsLogCallback, SpuriousTokenLogger, add_run_file_callbacks, read_metrics


def _small_trainer(model_path, tmp_path, **overrides) -> STAPOTrainer:
    prompts = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": f"{i}+{i}\n{INSTRUCTION}"}], "solution": str(2 * i)}
            for i in range(8)
        ]
    )
    args = tiny_stapo_config(
        tmp_path / "out",
        max_steps=2,  # why: enough for two log rows
        activation_checkpointing=False,  # why: nothing to save on a tiny model; recomputing only costs time
        logging_steps=1,
        per_device_train_batch_size=4,  # why: 2 prompts x 2 completions keep a step ~0.1 s
        num_generations=2,
        max_completion_length=8,
        save_strategy="no",
        disable_tqdm=True,
        **overrides,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return STAPOTrainer(model_path, reward_funcs=math_accuracy_reward, args=args, train_dataset=prompts)


def test_trainer_writes_each_run_file_once_and_can_be_told_not_to(tiny_random_model_path, tmp_path):
    # A caller's own spurious-token logger (another path, other caps) replaces the built-in one: one writer per file.
    trainer = _small_trainer(tiny_random_model_path, tmp_path / "a")
    custom = tmp_path / "custom_tokens.jsonl"
    trainer.add_callback(SpuriousTokenLogger(trainer, path=str(custom), max_reference=4))
    trainer.train()
    callbacks = trainer.callback_handler.callbacks
    assert sum(isinstance(c, MetricsLogCallback) for c in callbacks) == 1
    assert [c.path for c in callbacks if isinstance(c, SpuriousTokenLogger)] == [str(custom)]
    out = Path(trainer.args.output_dir)
    assert [row["step"] for row in read_metrics(str(out)) if "loss" in row] == [1, 2]
    assert custom.is_file() and not (out / "spurious_tokens.jsonl").exists()
    assert add_run_file_callbacks(trainer) == []  # a second train() adds nothing

    # s2t_write_run_files=False: no files, the metrics stay in log_history.
    trainer = _small_trainer(tiny_random_model_path, tmp_path / "b", s2t_write_run_files=False)
    trainer.train()
    out = Path(trainer.args.output_dir)
    assert not (out / "metrics.jsonl").exists() and not (out / "spurious_tokens.jsonl").exists()
    assert any("s2t/silenced_ratio" in entry for entry in trainer.state.log_history)
    assert not any(
        isinstance(c, (MetricsLogCallback, SpuriousTokenLogger)) for c in trainer.callback_handler.callbacks
    )


def _state(step: int):
    return types.SimpleNamespace(is_world_process_zero=True, global_step=step, epoch=0.0)


def test_metrics_callback_writes_strict_json_and_drops_redone_steps_on_resume(tmp_path):
    from stapo_trl.run_files import MetricsLogCallback, read_metrics

    args = types.SimpleNamespace(output_dir=str(tmp_path))
    callback = MetricsLogCallback()
    callback.on_train_begin(args, _state(0), None)
    for step in (2, 4, 6):
        callback.on_log(args, _state(step), None, logs={"reward": 0.5, "s2t/entropy_threshold": float("nan")})
    callback.on_log(args, _state(6), None, logs={"train_runtime": 1.0})  # the end-of-training summary: not a step
    callback.on_train_end(args, _state(6), None)
    rows = read_metrics(str(tmp_path))
    assert [r["step"] for r in rows] == [2, 4, 6]
    assert rows[0]["s2t/entropy_threshold"] is None  # NaN is not JSON: written as null

    # Resuming from the step-4 checkpoint: step 6 will be redone, so its old line goes.
    callback = MetricsLogCallback()
    callback.on_train_begin(args, _state(4), None)
    callback.on_log(args, _state(6), None, logs={"reward": 0.75})
    callback.on_train_end(args, _state(6), None)
    assert [(r["step"], r["reward"]) for r in read_metrics(str(tmp_path))] == [(2, 0.5), (4, 0.5), (6, 0.75)]


def test_tracker_table_labels_tokens_like_the_figure(tiny_random_model_path, tmp_path):
    """The wandb/trackio table of top silenced tokens uses the figure's labels: a byte fragment by its bytes (read
    from the trainer's tokenizer), not `\ufffd#161`; different fragments stay apart."""
    import types

    from transformers import AutoTokenizer

    from stapo_trl.run_files import SpuriousTokenLogger

    tokenizer = AutoTokenizer.from_pretrained(tiny_random_model_path)
    lead, other, newline = tokenizer.convert_tokens_to_ids(["â", "Ý", "Ċ"])
    trainer = types.SimpleNamespace(processing_class=tokenizer)
    logger = SpuriousTokenLogger(trainer, path=str(tmp_path / "tokens.jsonl"))
    for kind, token_id in [("silenced", lead), ("silenced", lead), ("silenced", other), ("kept_candidate", newline)]:
        logger._count({"kind": kind, "token_id": token_id, "token": tokenizer.decode([token_id])})
    assert logger.silenced_counts == {"byte 0xE2": 2, "byte 0xDD": 1}
    assert logger.kept_candidate_counts == {"\\n": 1}
