"""A run that cannot learn says why: one warning when the first logging steps had no learning signal.

The reported case: a user's script with plain-text prompts in another wording on `builtin:tiny-math` trained with
reward 0, loss 0 and grad_norm 0 at every step, and nothing said why (every group had zero reward spread).
"""

import logging

import pytest
from datasets import Dataset

from stapo_trl import STAPOConfig, STAPOTrainer
from stapo_trl.data import format_prompt
from stapo_trl.rewards import math_accuracy_reward


LOGGER = "stapo_trl.run_files"
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


@pytest.mark.parametrize("alongside", [None, "length_reward"])
def test_a_reward_that_returns_none_for_every_completion_is_named(alongside, tmp_path, tiny_random_model_path, caplog):
    """The reported case (alone): `[None] * n` trained to the end, exit 0, learned nothing, with only TRL's repeated
    "All reward functions returned None". Beside a reward that varies, it is named alone."""
    from testing_utils import PROMPTS, length_reward

    rewards = [_unjudged] + ([length_reward] if alongside else [])
    args = _config(tmp_path, per_device_train_batch_size=8, max_completion_length=8)
    trainer = STAPOTrainer(tiny_random_model_path, rewards, args=args, train_dataset=PROMPTS)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    (first,) = [r.getMessage() for r in caplog.records if r.name == "stapo_trl.rewards"]  # once, at the first step
    assert first.startswith("Reward function _unjudged returned None for all 8 completions at step 0: ")
    (message,) = _warnings(caplog)
    if alongside:
        assert message.startswith("A reward function gave every completion the same value in the first 3 logging ")
        assert (
            "(_unjudged gave None): it adds nothing" in message and "length_reward" not in message.split("Likely")[0]
        )
    else:
        assert message.startswith(
            "No learning signal. In the first 3 logging steps (steps 1-3), no reward function gave "
        )
        assert "the reward functions gave every completion the same value (_unjudged gave None)." in message


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

    from stapo_trl.run_files import NoLearningSignalCallback

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
