"""The console shows the result: one compact line per logging step, and the files written at the end.

The reported case: `make demo` printed 125 metric dicts of ~40 keys inside the progress bar (transformers'
`ProgressCallback` / `PrinterCallback`), and the summary did not say where the figures were.
"""

import json

import pytest
from datasets import Dataset
from testing_utils import tiny_stapo_config

from stapo_trl.data import format_prompt
from stapo_trl.rewards import math_accuracy_reward


STAPO_ROW = {
    "loss": 0.008559, "grad_norm": 0.8039, "learning_rate": 0.0001, "num_tokens": 3856.0,
    "completions/mean_length": 30.25, "completions/clipped_ratio": 0.03125,
    "rewards/math_accuracy_reward/mean": 0.3594, "rewards/math_accuracy_reward/std": 0.4836, "reward": 0.3594,
    "reward_std": 0.4836, "frac_reward_zero_std": 0.0, "grading/error_ratio": 0.0, "s2t/entropy_p10": 0.1798,
    "s2t/entropy_p50": 0.2281, "s2t/silenced_ratio": 7.75e-05, "s2t/candidate_ratio": 0.0005165,
    "s2t/entropy_threshold": 0.2138, "s2t/num_silenced": 1.0, "s2t/num_candidates": 5.0,
    "s2t/num_loss_tokens": 1936.0, "entropy": 0.3299, "clip_ratio/low_mean": 0.003647, "step_time": 1.268,
    "epoch": 0.001026,
}  # fmt: skip


def _dataset() -> Dataset:
    return Dataset.from_list([{"prompt": format_prompt(f"{a}+{a}"), "solution": str(2 * a)} for a in range(10, 40)])


def _assert_compact(output: str, steps: list[int], max_steps: int, silenced: bool = True) -> list[str]:
    """No metric dict; one line per logging step that starts with its step and has reward, entropy (and silenced)."""
    assert "{'" not in output, output[:3000]
    lines = [line.strip() for line in output.replace("\r", "\n").splitlines()]
    step_lines = [line for line in lines if line.startswith("step ")]
    assert [int(line.split()[1].split("/")[0]) for line in step_lines] == steps, output
    for line in step_lines:
        assert line.startswith(f"step {line.split()[1].split('/')[0]}/{max_steps}  reward "), line
        assert "  entropy " in line and ("  silenced " in line) == silenced and len(line) < 80, line
    return lines


def test_stapo_train_prints_a_line_per_logging_step_and_lists_the_files(tmp_path, tiny_math_model_path, capsys):
    """The reported case (the CLI, here without a progress bar: transformers' PrinterCallback path)."""
    from stapo_trl.cli.train import main

    out = tmp_path / "demo"
    argv = ["--config", "recipes/demo/stapo.yaml", "--model_name_or_path", tiny_math_model_path]
    argv += ["--output_dir", str(out), "--max_steps", "8", "--save_steps", "8"]  # the demo logs every 4 steps
    argv += ["--eval_before_after", "false", "--disable_tqdm", "true"]
    main(argv)
    output = capsys.readouterr().out
    lines = _assert_compact(output, [4, 8], 8)
    assert "***** train metrics *****" not in output  # train_results.json has them
    assert any(line.startswith("training done at step 8 (") for line in lines)
    files = output[output.index(f"Files in {out}:") :]
    for name in ("metrics.jsonl", "spurious_tokens.jsonl", "training_curves.png", "s2t_", "train_results.json"):
        assert name in files, name
    assert output.count(f"Files in {out}:") == 1  # listed once, at the end of the run
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and len(rows[0]) > 30  # the full metrics are in the file


def test_api_progress_bar_gets_compact_lines_and_the_files(tmp_path, tiny_math_model_path, capsys):
    from stapo_trl import STAPOTrainer

    config = tiny_stapo_config(
        tmp_path / "api",
        max_steps=4,
        logging_steps=2,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=16,
        disable_tqdm=False,
    )
    trainer = STAPOTrainer(tiny_math_model_path, math_accuracy_reward, args=config, train_dataset=_dataset())
    trainer.train()
    captured = capsys.readouterr()
    output = captured.out + captured.err
    _assert_compact(output, [2, 4], 4)
    assert f"Files in {tmp_path / 'api'}:" in output and "metrics.jsonl" in output
    assert f"stapo-plot {tmp_path / 'api'}" in output
    assert [row["step"] for row in trainer.state.log_history if "reward" in row] == [2, 4]  # history untouched


def test_grpo_baseline_line_has_no_silenced_ratio_and_the_dicts_can_come_back(tmp_path, tiny_math_model_path, capsys):
    from transformers import PrinterCallback
    from trl import GRPOConfig

    from stapo_trl.callbacks import CompactPrinterCallback
    from stapo_trl.trainer import GRPOBaselineTrainer

    config = GRPOConfig(
        output_dir=str(tmp_path / "grpo"),
        max_steps=2,
        logging_steps=1,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=16,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
    )
    trainer = GRPOBaselineTrainer(tiny_math_model_path, math_accuracy_reward, args=config, train_dataset=_dataset())
    trainer.train()
    _assert_compact(capsys.readouterr().out, [1, 2], 2, silenced=False)
    # The documented way back to transformers' dicts.
    trainer.remove_callback(CompactPrinterCallback)
    trainer.add_callback(PrinterCallback)
    trainer.args.max_steps = 3
    trainer.train(resume_from_checkpoint=None)
    assert "{'loss'" in capsys.readouterr().out


@pytest.mark.parametrize(
    "logs, step, expected",
    [
        (STAPO_ROW, 4, "step 4/500  reward 0.359  entropy 0.330  silenced 7.75e-05"),
        ({**STAPO_ROW, "s2t/silenced_ratio": 0.0}, 4, "step 4/500  reward 0.359  entropy 0.330  silenced 0"),
        ({"train_runtime": 96.123, "train_loss": 0.0074, "epoch": 0.1, "reward": 0.4}, 500,
         "training done at step 500 (96.1 s, train_loss 0.0074)"),
        ({"train_runtime": 12.0, "train_loss": 0.01}, 30, "training stopped at step 30 of 500 (12.0 s, train_loss 0.0100)"),
        ({"train_runtime": 5.0}, 0, "training stopped at step 0 of 500 (5.0 s)"),
        ({"eval/tiny-math/avg@4": 0.4125, "eval/tiny-math/pass@4": 0.8, "epoch": 0.1}, 100,
         "step 100/500  eval  eval/tiny-math/avg@4 0.412  eval/tiny-math/pass@4 0.800"),
        ({"my_metric": 3, "epoch": 0.2}, 7, "step 7/500  my_metric 3"),
    ],
    ids=["stapo", "nothing-silenced", "end", "stopped-early", "stopped-before-a-step", "benchmark-eval", "caller-log"],
)  # fmt: skip
def test_format_log_line(logs, step, expected):
    from stapo_trl.callbacks import format_log_line

    assert format_log_line(logs, step, 500) == expected


def test_a_run_stopped_before_max_steps_does_not_say_done(tmp_path, tiny_math_model_path, capsys):
    """The reported case: after Ctrl-C the console said `training done at step 30` just before `Interrupted at step
    30`. Here a callback stops a 4-step run after step 2 (as Ctrl-C and early stopping do)."""
    from transformers import TrainerCallback

    from stapo_trl import STAPOTrainer

    class StopAfterTwo(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step >= 2

    config = tiny_stapo_config(
        tmp_path / "stopped", max_steps=4, logging_steps=1, per_device_train_batch_size=8, num_generations=4,
        disable_tqdm=True,
    )  # fmt: skip
    trainer = STAPOTrainer(tiny_math_model_path, math_accuracy_reward, args=config, train_dataset=_dataset())
    trainer.add_callback(StopAfterTwo())
    trainer.train()
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("training stopped at step 2 of 4 (") for line in lines), lines
    assert not any(line.startswith("training done") for line in lines)
