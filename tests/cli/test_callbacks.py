"""`add_command_callbacks`: a compact console line per logging step, a checkpoint on a stop signal."""

import os
import signal
import sys

import pytest
from datasets import Dataset
from testing_utils import SignalAtStep, tiny_stapo_config
from transformers import PrinterCallback, TrainerCallback

from stapo_trl import STAPOTrainer
from stapo_trl.cli import callbacks
from stapo_trl.cli.train import main
from stapo_trl.data import format_prompt
from stapo_trl.rewards import math_accuracy_reward


STAPO_ROW = {"loss": 0.008559, "grad_norm": 0.8039, "rewards/math_accuracy_reward/mean": 0.3594, "reward": 0.3594,
             "s2t/silenced_ratio": 7.75e-05, "s2t/candidate_ratio": 0.0005165, "entropy": 0.3299,
             "epoch": 0.001026}  # fmt: skip


def _trainer(tmp_path, model_path, callback, bar=False):
    config = tiny_stapo_config(tmp_path / "out", max_steps=4, logging_steps=1, per_device_train_batch_size=8,
                               num_generations=4, max_completion_length=16, disable_tqdm=not bar)  # fmt: skip
    rows = [{"prompt": format_prompt(f"{a}+{a}"), "solution": str(2 * a)} for a in range(10, 40)]
    trainer = STAPOTrainer(model_path, math_accuracy_reward, args=config, train_dataset=Dataset.from_list(rows))
    trainer.add_callback(callback)
    callbacks.add_command_callbacks(trainer)
    return trainer, [signal.getsignal(s) for s in callbacks.STOP_SIGNALS]


def _assert_compact(output: str, steps: list[int], max_steps: int, silenced: bool = True) -> list[str]:
    assert "{'" not in output, output[:3000]
    lines = [line.strip() for line in output.replace("\r", "\n").splitlines()]
    shown = [line for line in lines if line.startswith("step ")]
    names = ["reward", "entropy", "silenced"][: 2 + silenced]
    assert [line.split("  ")[0] for line in shown] == [f"step {s}/{max_steps}" for s in steps], output
    assert all([part.split()[0] for part in line.split("  ")[1:]] == names and len(line) < 80 for line in shown), shown
    return lines


@pytest.mark.slow  # a stapo-train run of 8 steps with its figures
def test_stapo_train_prints_a_line_per_logging_step_and_lists_the_files(tmp_path, tiny_math_model_path, capsys):
    out = tmp_path / "demo"
    argv = ["--config", "recipes/demo/stapo.yaml", "--model_name_or_path", tiny_math_model_path]
    argv += ["--output_dir", str(out), "--max_steps", "8", "--save_steps", "8"]  # the demo logs every 4 steps
    main([*argv, "--eval_before_after", "false", "--disable_tqdm", "true"])
    output = capsys.readouterr().out
    lines = _assert_compact(output, [4, 8], 8)
    assert "***** train metrics *****" not in output  # train_results.json has them
    assert any(line.startswith("training done at step 8 (") for line in lines)
    files = output[output.index(f"Files in {out}:") :]
    for name in ("metrics.jsonl", "spurious_tokens.jsonl", "training_curves.png", "s2t_", "train_results.json"):
        assert name in files, name
    assert output.count(f"Files in {out}:") == 1  # listed once, at the end of the run


def test_format_log_line():
    for logs, step, expected in [
        (STAPO_ROW, 4, "step 4/500  reward 0.359  entropy 0.330  silenced 7.75e-05"),
        ({**STAPO_ROW, "s2t/silenced_ratio": 0.0}, 4, "step 4/500  reward 0.359  entropy 0.330  silenced 0"),
        ({"train_runtime": 96.123, "train_loss": 0.0074, "epoch": 0.1, "reward": 0.4}, 500,
         "training done at step 500 (96.1 s, train_loss 0.0074)"), ({"train_runtime": 5.0}, 0,
         "training stopped at step 0 of 500 (5.0 s)"), ({"my_metric": 3, "epoch": 0.2}, 7, "step 7/500  my_metric 3"),
        ({"train_runtime": 12.0, "train_loss": 0.01}, 30,
         "training stopped at step 30 of 500 (12.0 s, train_loss 0.0100)"),
        ({"eval_rewards/math_accuracy_reward/mean": 0.4125, "eval_runtime": 3.2, "epoch": 0.1}, 100,
         "step 100/500  eval  rewards/math_accuracy_reward/mean 0.412"),
        ({"reward": 0.25, "entropy": 0.5, "loss": 0.1}, 3, "step 3/500  reward 0.250  entropy 0.500"),
    ]:  # fmt: skip
        assert callbacks.format_log_line(logs, step, 500) == expected, expected


@pytest.mark.parametrize("signum, bar", [
        (signal.SIGINT, False),
        pytest.param(signal.SIGTERM, False, marks=pytest.mark.slow),
        pytest.param(signal.SIGUSR1, True, marks=pytest.mark.slow),
], ids=["SIGINT", "SIGTERM", "SIGUSR1-progress-bar"])  # fmt: skip
def test_interrupted_trainer_resumes_in_the_same_process(tmp_path, tiny_math_model_path, capsys, signum, bar):
    # A notebook catches the interrupt and resumes the same trainer (reported: `training done` before `Interrupted`).
    trainer, handlers = _trainer(tmp_path, tiny_math_model_path, SignalAtStep(2, signum), bar)
    with pytest.raises(KeyboardInterrupt) as excinfo:
        trainer.train()
    assert [signal.getsignal(s) for s in callbacks.STOP_SIGNALS] == handlers  # restored
    checkpoint, hint = tmp_path / "out" / "checkpoint-2", callbacks.SCRIPT_RESUME_HINT
    assert str(excinfo.value) == f"Interrupted by {signum.name} at step 2: checkpoint saved to {checkpoint}. {hint}"
    assert (excinfo.value.signal, excinfo.value.step, excinfo.value.checkpoint) == (signum, 2, str(checkpoint))
    assert (checkpoint / "trainer_state.json").is_file()  # saved despite save_strategy="no"
    captured = capsys.readouterr()  # a script's progress bar (or printer) gets the compact lines, one each
    lines = _assert_compact(captured.out + captured.err, [1, 2], 4)
    assert any(line.startswith("training stopped at step 2 of 4 (") for line in lines), lines
    assert not any(line.startswith("training done") for line in lines)
    if signum == signal.SIGINT:  # resumed with transformers' dicts back (the printer swapped back)
        trainer.remove_callback(callbacks.CompactPrinterCallback)
        trainer.add_callback(PrinterCallback)
        trainer.train(resume_from_checkpoint=True)
        assert trainer.state.global_step == 4 and "{'loss'" in capsys.readouterr().out
        assert [row["step"] for row in trainer.state.log_history if "reward" in row] == [1, 2, 3, 4]


class _CtrlCTwice(TrainerCallback):  # Ctrl-C at step 2, then again at once or once the checkpoint is saved
    def __init__(self, second: str):
        self.second = second

    def on_step_end(self, args, state, control, **kwargs):
        for _ in range((state.global_step == 2) * (1 + (self.second == "before-the-save"))):
            os.kill(os.getpid(), signal.SIGINT)

    def on_save(self, args, state, control, **kwargs):
        if self.second == "after-the-save":
            os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.parametrize("second", [pytest.param("before-the-save", marks=pytest.mark.slow), "after-the-save"])
def test_a_second_ctrl_c_says_whether_the_checkpoint_is_saved(tmp_path, tiny_math_model_path, monkeypatch, capsys,
                                                               second):  # fmt: skip
    # Reported: checkpoint-33 was saved, and the end said nothing was. The second Ctrl-C quits at once, saying so.
    trainer, handlers = _trainer(tmp_path, tiny_math_model_path, _CtrlCTwice(second))
    monkeypatch.setattr(os, "_exit", sys.exit)  # quits by SystemExit, not at once
    try:
        with pytest.raises(SystemExit) as excinfo:
            trainer.train()
    finally:
        for signum, handler in zip(callbacks.STOP_SIGNALS, handlers):  # quit at once: training's handlers stayed
            signal.signal(signum, handler)
    checkpoint, after = tmp_path / "out" / "checkpoint-2", second == "after-the-save"
    saved = f"checkpoint saved to {checkpoint}. {callbacks.SCRIPT_RESUME_HINT}" if after else "without saving."
    assert excinfo.value.code == 130
    assert capsys.readouterr().err.splitlines()[-1] == f"Second Ctrl-C: quitting now, {saved}"
    assert (checkpoint / "trainer_state.json").is_file() == after
