"""`stapo_trl.run_folder.logs`: `metrics.jsonl` and `spurious_tokens.jsonl` as written during `train()` and read back (a resumed
run keeps its rows up to the checkpoint, a kill never loses one), and the one warning when the first logging steps had
no learning signal (the reported case: plain-text prompts in another wording on `builtin:tiny-math` trained with reward
0 and nothing said why)."""

from __future__ import annotations

import logging
import types
import warnings
from pathlib import Path

import pytest
from datasets import Dataset
from testing_utils import STAPO_RECIPE, no_activation_checkpointing, tiny_stapo_config

from stapo_trl import STAPOConfig, STAPOTrainer
from stapo_trl.data import INSTRUCTION, format_prompt
from stapo_trl.rewards import math_accuracy_reward
from stapo_trl.run_folder.logs import MetricsLogCallback, SpuriousTokenLogger, add_run_file_callbacks, read_metrics


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
        **no_activation_checkpointing(),  # why: nothing to save on a tiny model; recomputing only costs time
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
    from stapo_trl.run_folder.logs import MetricsLogCallback, read_metrics

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

    from stapo_trl.run_folder.logs import SpuriousTokenLogger

    tokenizer = AutoTokenizer.from_pretrained(tiny_random_model_path)
    lead, other, newline = tokenizer.convert_tokens_to_ids(["â", "Ý", "Ċ"])
    trainer = types.SimpleNamespace(processing_class=tokenizer)
    logger = SpuriousTokenLogger(trainer, path=str(tmp_path / "tokens.jsonl"))
    for kind, token_id in [("silenced", lead), ("silenced", lead), ("silenced", other), ("kept_candidate", newline)]:
        logger._count({"kind": kind, "token_id": token_id, "token": tokenizer.decode([token_id])})
    assert logger.silenced_counts == {"byte 0xE2": 2, "byte 0xDD": 1}
    assert logger.kept_candidate_counts == {"\\n": 1}


@pytest.mark.slow  # three stapo-train runs: 12-35 s on 2 cores, with the load
def test_fresh_run_keeps_an_earlier_runs_metrics_aside(tmp_path, tiny_math_model_path, caplog):
    """A run that saved no checkpoint and no model (save_strategy no, stopped before its final save) started again in
    its folder: the earlier metrics.jsonl and spurious_tokens.jsonl are moved aside (metrics.1.jsonl, then .2), never
    overwritten. (A folder holding a trained model and no checkpoint is refused: tests/cli/test_checkpoints.py.)"""
    from stapo_trl.cli.train import main
    from stapo_trl.run_folder.logs import read_jsonl

    out = tmp_path / "run"
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--output_dir", str(out)]
    argv += ["--max_steps", "2", "--logging_steps", "1", "--save_strategy", "no", "--eval_before_after", "false"]
    argv += ["--disable_tqdm", "true"]
    main(argv)
    first = (out / "metrics.jsonl").read_text()
    assert [row["step"] for row in read_jsonl(out / "metrics.jsonl")] == [1, 2]
    (out / "model.safetensors").unlink()  # as a run stopped before its final save leaves the folder
    main([*argv, "--max_steps", "1"])
    assert (out / "metrics.1.jsonl").read_text() == first
    assert [row["step"] for row in read_jsonl(out / "metrics.jsonl")] == [1]
    assert "metrics.jsonl held an earlier run's records: kept as metrics.1.jsonl" in caplog.text
    (out / "model.safetensors").unlink()
    main([*argv, "--max_steps", "1"])
    assert (out / "metrics.1.jsonl").read_text() == first and (out / "metrics.2.jsonl").exists()


class Killed(Exception):
    """Stands for the SIGKILL that stops the rewrite at one of its rows."""


@pytest.mark.parametrize("row", [1, 3, 6])
def test_a_resume_killed_while_it_rewrites_the_file_loses_no_row(tmp_path, monkeypatch, row):
    # Reported: a kill while a resumed run rewrote metrics.jsonl (open(path, "w")) left it empty; the next run exited 0
    # with the rows after the checkpoint only.
    import json

    from stapo_trl import run_files as metrics_log

    path = tmp_path / "metrics.jsonl"
    rows = [{"step": step, "reward": step / 10} for step in range(1, 9)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 9, "rew')  # a last line cut short
    written = path.read_text()
    dumps, calls = json.dumps, []

    def dumps_until_killed(obj, **kwargs):
        calls.append(obj)
        if len(calls) == row:
            raise Killed(obj)
        return dumps(obj, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(metrics_log.json, "dumps", dumps_until_killed)
        with pytest.raises(Killed):
            metrics_log.open_jsonl_for_run(str(path), global_step=6)  # resuming from checkpoint-6
    assert path.read_text() == written  # every row written so far is still there
    file, kept = metrics_log.open_jsonl_for_run(str(path), global_step=6)
    file.write(json.dumps({"step": 7, "reward": 0.7}) + "\n")
    file.close()
    # The rows after the checkpoint's step (to be redone) and the cut line are gone; the new row is whole.
    assert [r["step"] for r in metrics_log.read_jsonl(path)] == [1, 2, 3, 4, 5, 6, 7] and len(kept) == 6


LOGGER = "stapo_trl.run_folder.logs"
PAIRS = [(a, b) for a in range(10, 100, 11) for b in range(12, 100, 13)]


def _config(tmp_path, **overrides) -> STAPOConfig:
    """A short run: 4 prompts x 4 completions of up to 16 tokens per step, a log row per step."""
    settings = dict(
        output_dir=str(tmp_path / "out"),
        max_steps=3,
        logging_steps=1,
        per_device_train_batch_size=16,
        num_generations=4,
        max_completion_length=16,
        learning_rate=1e-4,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    return STAPOConfig(**(settings | overrides))


def _chat_dataset() -> Dataset:
    return Dataset.from_list([{"prompt": format_prompt(f"{a}+{b}"), "solution": str(a + b)} for a, b in PAIRS])


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def test_plain_text_prompts_on_tiny_math_warn_with_the_prompt_format(tmp_path, tiny_math_model_path, caplog):
    """The reported case: plain-text prompts in another wording; every group has zero spread."""
    dataset = Dataset.from_list([{"prompt": f"What is {a} plus {b}?", "solution": str(a + b)} for a, b in PAIRS])
    trainer = STAPOTrainer(tiny_math_model_path, math_accuracy_reward, args=_config(tmp_path), train_dataset=dataset)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        trainer.train()
    rows = [row for row in trainer.state.log_history if "frac_reward_zero_std" in row]
    assert rows and all(row["frac_reward_zero_std"] == 1.0 for row in rows)  # the situation the warning is about
    (message,) = _warnings(caplog)
    assert message.startswith("No learning signal. In the first 3 logging steps (steps 1-3), every prompt group had ")
    assert "frac_reward_zero_std = 1" in message
    assert "math_accuracy_reward gave 0" in message
    assert "Your prompts are plain text, so TRL does not apply the model's chat template" in message
    assert "builtin:tiny-math was trained on one prompt format only" in message
    assert "Please reason step by step, and put your final answer within" in message
    assert "(here: solution)" in message  # the columns handed to the reward


def test_a_reward_that_never_fires_is_named_while_another_varies(tmp_path, tiny_math_model_path, caplog):
    """Groups have spread (math accuracy varies), but a format reward gives 0 to every completion: named alone."""

    def answer_tag_reward(completions, **kwargs):
        return [1.0 if "<answer>" in completion[0]["content"] else 0.0 for completion in completions]

    trainer = STAPOTrainer(
        tiny_math_model_path,
        [math_accuracy_reward, answer_tag_reward],
        args=_config(tmp_path, max_completion_length=40),
        train_dataset=_chat_dataset(),
    )
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        trainer.train()
    (message,) = _warnings(caplog)
    assert message.startswith("A reward function gave every completion the same value in the first 3 logging steps")
    assert "answer_tag_reward gave 0" in message and "math_accuracy_reward" not in message.split("Likely")[0]
    assert "frac_reward_zero_std = 1" not in message


def test_random_model_on_the_cli_warns_when_training_ends_before_a_logging_step(
    tmp_path, tiny_random_model_path, caplog
):
    """The CLI path (the same trainer), with fewer steps than logging_steps: the end-of-training row decides."""
    from stapo_trl.cli.train import main

    argv = ["--config", "recipes/demo/stapo.yaml", "--model_name_or_path", tiny_random_model_path]
    argv += ["--output_dir", str(tmp_path / "cli"), "--max_steps", "2", "--logging_steps", "10"]
    argv += ["--max_completion_length", "16", "--eval_before_after", "false", "--save_strategy", "no"]
    argv += ["--disable_tqdm", "true"]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        main(argv)
    (message,) = _warnings(caplog)
    assert message.startswith("No learning signal. In the first logging step (step 2), every prompt group had ")
    assert "builtin:tiny-random has random weights" in message


def test_a_run_that_learns_gives_no_warning(tmp_path, tiny_math_model_path, caplog):
    trainer = STAPOTrainer(
        tiny_math_model_path,
        math_accuracy_reward,
        args=_config(tmp_path, max_completion_length=40),
        train_dataset=_chat_dataset(),
    )
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        trainer.train()
    assert _warnings(caplog) == []


def _unjudged(completions, **kwargs):
    return [None] * len(completions)


def _not_a_number(completions, **kwargs):
    return [float("nan")] * len(completions)


@pytest.mark.parametrize(
    "rewards, expected",
    [
        ([_unjudged], "_unjudged"),  # reported: trained to the end, exit 0; TRL's dump at every step named no reward
        ([_not_a_number], "_not_a_number"),  # NaN is TRL's None
        ([_unjudged, _not_a_number], "_unjudged, _not_a_number"),
        ([_unjudged, "length_reward"], None),  # TRL's "not applicable": the other reward still teaches
    ],
    ids=["none", "nan", "none-and-nan", "none-beside-a-value"],
)
def test_a_step_without_any_reward_is_warned_naming_the_rewards(
    rewards, expected, tmp_path, tiny_random_model_path, caplog
):
    """The library keeps TRL's warning and trains on (TRL's own test expects both); a `NoRewardWarning` names the
    reward functions at each such step, counted from 1. A reward that gives nothing beside one that gives values is
    named by the no-learning-signal warning alone."""
    from testing_utils import PROMPTS, length_reward

    from stapo_trl.rewards import NoRewardWarning

    rewards = [length_reward if r == "length_reward" else r for r in rewards]
    args = _config(tmp_path, per_device_train_batch_size=8, max_completion_length=8)
    trainer = STAPOTrainer(tiny_random_model_path, rewards, args=args, train_dataset=PROMPTS)
    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NoRewardWarning)
        trainer.train()
    assert trainer.state.global_step == 3
    no_reward = [str(w.message) for w in caught if w.category is NoRewardWarning]
    trl_dumps = [r for r in caplog.records if "All reward functions returned None" in r.getMessage()]
    (message,) = _warnings(caplog)
    if expected is None:
        assert no_reward == [] and trl_dumps == []
        assert message.startswith("A reward function gave every completion the same value in the first 3 logging ")
        assert "(_unjudged gave None): it adds nothing" in message and "length_reward" not in message.split("Lik")[0]
        return
    assert no_reward == [
        f"No reward at step {step}: no reward function ({expected}) gave any of the 8 completions a value (every one "
        "None or NaN), so the step has no learning signal."
        for step in (1, 2, 3)
    ]
    assert len(trl_dumps) == 3
    assert message.startswith("No learning signal. In the first 3 logging steps (steps 1-3), no reward function gave ")


@pytest.mark.parametrize(
    "rows, expected",
    [
        ([{"frac_reward_zero_std": 1.0, "rewards/r/mean": 0.0, "rewards/r/std": 0.0}] * 3, "No learning signal"),
        ([{"frac_reward_zero_std": 1.0, "rewards/r/mean": 0.0, "rewards/r/std": 0.0}] * 2, None),  # 2 of 3 rows
        ([{"frac_reward_zero_std": 0.5, "rewards/r/mean": 0.4, "rewards/r/std": 0.5}] * 3, None),
        (
            [{"frac_reward_zero_std": 1.0, "rewards/r/mean": m, "rewards/r/std": 0.0} for m in (0.0, 1.0, 0.0)],
            "No learning signal",  # zero spread in every group, but the reward moved between batches
        ),
    ],
)
def test_decision_on_the_first_rows(rows, expected, caplog):
    from types import SimpleNamespace

    from stapo_trl.run_folder.logs import NoLearningSignalCallback

    trainer = SimpleNamespace(reward_func_names=["r"], train_dataset=None, model=None, processing_class=None)
    callback = NoLearningSignalCallback(trainer)
    state = SimpleNamespace(is_world_process_zero=True, global_step=0)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for row in rows:
            state.global_step += 1
            callback.on_log(None, state, None, logs=dict(row))
    warned = _warnings(caplog)
    assert (warned[0].split(".")[0] if warned else None) == expected
    if expected and rows[0]["rewards/r/mean"] != rows[1]["rewards/r/mean"]:
        assert "gave every completion the same value" not in warned[0]
