"""What `stapo-train` adds, as callbacks a script adds in one line (`stapo_trl.cli.callbacks.add_command_callbacks`):
one compact console line per logging step, a checkpoint at the step boundary on Ctrl-C / SIGTERM / SIGUSR1, one writer
per folder (the lock itself is tested in `tests/runfiles/test_run_folder.py`).

The reported cases: `make demo` printed 125 metric dicts of ~40 keys inside the progress bar; `trainer.train()` in a
script ended on a bare `KeyboardInterrupt` with no checkpoint on Ctrl-C, and died at once on SIGTERM. Where a signal
must land inside a step, the reward holds the step (`testing_utils.HELD_REWARD`): events, not timing.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import Dataset
from testing_utils import SignalAtStep, no_activation_checkpointing, read_until, tiny_stapo_config, write_held_reward
from transformers import TrainerCallback

from stapo_trl.data import format_prompt
from stapo_trl.rewards import math_accuracy_reward


REPO_ROOT = Path(__file__).resolve().parents[2]


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


@pytest.mark.slow  # a stapo-train run of 8 steps with its figures
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


def test_grpo_baseline_line_has_no_silenced_ratio_and_the_dicts_can_come_back(tmp_path, tiny_math_model_path, capsys):
    from transformers import PrinterCallback
    from trl import GRPOConfig

    from stapo_trl.cli.callbacks import CompactPrinterCallback, add_command_callbacks
    from stapo_trl.trainer.trainers import GRPOBaselineTrainer

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
        **no_activation_checkpointing(),
    )
    trainer = GRPOBaselineTrainer(tiny_math_model_path, math_accuracy_reward, args=config, train_dataset=_dataset())
    add_command_callbacks(trainer)
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
        ({"train_runtime": 12.0, "train_loss": 0.01}, 30,
         "training stopped at step 30 of 500 (12.0 s, train_loss 0.0100)"),
        ({"train_runtime": 5.0}, 0, "training stopped at step 0 of 500 (5.0 s)"),
        ({"eval_rewards/math_accuracy_reward/mean": 0.4125, "eval_runtime": 3.2, "epoch": 0.1}, 100,
         "step 100/500  eval  rewards/math_accuracy_reward/mean 0.412"),
        ({"my_metric": 3, "epoch": 0.2}, 7, "step 7/500  my_metric 3"),
    ],
    ids=["stapo", "nothing-silenced", "end", "stopped-early", "stopped-before-a-step", "benchmark-eval", "caller-log"],
)  # fmt: skip
def test_format_log_line(logs, step, expected):
    from stapo_trl.cli.callbacks import format_log_line

    assert format_log_line(logs, step, 500) == expected


SCRIPT = """
import sys

from datasets import Dataset

from held_reward import held_accuracy
from stapo_trl import STAPOConfig, STAPOTrainer
from stapo_trl.cli.callbacks import add_command_callbacks
from stapo_trl.data import format_prompt

model, output_dir, max_steps, resume = sys.argv[1:]
dataset = Dataset.from_list(
    [{"prompt": format_prompt(f"{a}+{b}"), "solution": str(a + b)} for a in range(10, 100, 7) for b in (12, 47, 83)]
)
config = STAPOConfig(
    output_dir=output_dir, max_steps=int(max_steps), logging_steps=1, per_device_train_batch_size=8,
    num_generations=4, max_completion_length=48, save_steps=100000,
    report_to="none", disable_tqdm=True, seed=0,
)
trainer = STAPOTrainer(model, held_accuracy, args=config, train_dataset=dataset)
add_command_callbacks(trainer)  # save on Ctrl-C / SIGTERM / SIGUSR1, one writer, the compact console
trainer.train(resume_from_checkpoint=True if resume == "resume" else None)
print("FINISHED at step", trainer.state.global_step)
"""


def _start(tmp_path, model_path, *, max_steps=5000, resume=False):
    script = tmp_path / "train_script.py"
    script.write_text(SCRIPT)
    write_held_reward(tmp_path)  # next to the script, which imports it
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    args = [model_path, str(tmp_path / "out"), str(max_steps), "resume" if resume else "new"]
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow  # a training subprocess, then a real signal
def test_ctrl_c_in_a_script_saves_a_checkpoint_and_resumes(tmp_path, tiny_math_model_path):
    """The reported case, in a subprocess: SIGINT, the checkpoint and the printed hint, then the resume."""
    proc = _start(tmp_path, tiny_math_model_path)
    read_until(proc, "step ", count=2)  # two optimizer steps logged: training is under way
    proc.send_signal(signal.SIGINT)
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == -signal.SIGINT, output  # ended by SIGINT, as Ctrl-C does (a shell shows status 130)
    assert "Ctrl-C: saving a checkpoint at the end of this step" in output
    last = output.strip().splitlines()[-1]
    prefix = "KeyboardInterrupt: Interrupted by SIGINT at step "
    assert last.startswith(prefix), output[-3000:]
    step = int(last.removeprefix(prefix).split(":")[0])
    checkpoint = tmp_path / "out" / f"checkpoint-{step}"
    assert f"checkpoint saved to {checkpoint}. Resume with trainer.train(resume_from_checkpoint=True)" in last
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == step
    assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "optimizer.pt").is_file()

    proc = _start(tmp_path, tiny_math_model_path, max_steps=step + 2, resume=True)
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, output[-3000:]
    assert output.strip().splitlines()[-1] == f"FINISHED at step {step + 2}"
    assert f"step {step + 1}/{step + 2}" in output and f"step {step}/" not in output  # resumed, not restarted


@pytest.mark.slow  # a training subprocess, then real signals
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_a_scheduler_signal_in_a_script_saves_a_checkpoint(tmp_path, tiny_math_model_path, signum):
    """SIGTERM (preemption, `scancel`, a time limit) killed the script at once, with nothing saved; now it takes
    Ctrl-C's path and the exception names it. Uncaught, it ends the script as Ctrl-C does (by SIGINT: a shell shows
    130)."""
    proc = _start(tmp_path, tiny_math_model_path)
    read_until(proc, "step ", count=2)
    proc.send_signal(signum)
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == -signal.SIGINT, output[-3000:]
    assert f"{signum.name}: saving a checkpoint at the end of this step" in output
    last = output.strip().splitlines()[-1]
    prefix = f"KeyboardInterrupt: Interrupted by {signum.name} at step "
    assert last.startswith(prefix), output[-3000:]
    step = int(last.removeprefix(prefix).split(":")[0])
    assert (
        json.loads((tmp_path / "out" / f"checkpoint-{step}" / "trainer_state.json").read_text())["global_step"] == step
    )
    assert "FINISHED" not in output


@pytest.mark.slow  # a training subprocess, then real signals
def test_second_ctrl_c_in_a_script_quits_at_once(tmp_path, tiny_math_model_path):
    """Both signals land inside one step, which the reward holds: the second always finds the first's checkpoint
    pending. (Sent during a long step, as before, the second came too late whenever that step ended first.)"""
    proc = _start(tmp_path, tiny_math_model_path)
    read_until(proc, "step ")
    (tmp_path / "HOLD").touch()
    read_until(proc, "reward held")
    proc.send_signal(signal.SIGINT)
    read_until(proc, "Ctrl-C: saving a checkpoint at the end of this step")
    proc.send_signal(signal.SIGINT)
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == 130, output
    assert output.startswith("Second Ctrl-C: quitting now, without saving."), output
    assert not list((tmp_path / "out").glob("checkpoint-*"))


@pytest.mark.parametrize(
    "signum, bar",
    [(signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGUSR1, True)],
    ids=["SIGINT", "SIGTERM", "SIGUSR1-progress-bar"],
)
def test_interrupted_trainer_resumes_in_the_same_process(tmp_path, tiny_math_model_path, capsys, signum, bar):
    """A notebook: the interrupt is caught, and the same trainer object resumes from its checkpoint to the end. Before,
    SIGTERM and SIGUSR1 ended the process at once (here: pytest itself). Reported: after Ctrl-C the console said
    `training done at step 30` just before `Interrupted at step 30`."""
    from stapo_trl import STAPOTrainer
    from stapo_trl.cli.callbacks import SCRIPT_RESUME_HINT, STOP_SIGNALS, add_command_callbacks

    config = tiny_stapo_config(
        tmp_path / "out", max_steps=4, logging_steps=1, per_device_train_batch_size=8, num_generations=4,
        max_completion_length=16, disable_tqdm=not bar,
    )  # fmt: skip
    trainer = STAPOTrainer(tiny_math_model_path, math_accuracy_reward, args=config, train_dataset=_dataset())
    trainer.add_callback(SignalAtStep(2, signum))
    add_command_callbacks(trainer)
    handlers = [signal.getsignal(s) for s in STOP_SIGNALS]
    with pytest.raises(KeyboardInterrupt) as excinfo:
        trainer.train()
    assert [signal.getsignal(s) for s in STOP_SIGNALS] == handlers  # restored
    assert str(excinfo.value) == (
        f"Interrupted by {signum.name} at step 2: checkpoint saved to {tmp_path / 'out' / 'checkpoint-2'}. "
        f"{SCRIPT_RESUME_HINT}"
    )
    assert (excinfo.value.signal, excinfo.value.step) == (signum, 2)
    assert excinfo.value.checkpoint == str(tmp_path / "out" / "checkpoint-2")
    assert (tmp_path / "out" / "checkpoint-2" / "trainer_state.json").is_file()  # saved despite save_strategy="no"
    captured = capsys.readouterr()  # a script's progress bar (or printer) gets the compact lines, one each
    lines = _assert_compact(captured.out + captured.err, [1, 2], 4)
    assert any(line.startswith("training stopped at step 2 of 4 (") for line in lines), lines
    assert not any(line.startswith("training done") for line in lines)
    if signum == signal.SIGINT:
        trainer.train(resume_from_checkpoint=True)
        assert trainer.state.global_step == 4
        assert [row["step"] for row in trainer.state.log_history if "reward" in row] == [1, 2, 3, 4]


class _CtrlCTwice(TrainerCallback):
    """Ctrl-C twice at step 2: the first at its end, the second right after it (the save still to come) or once the
    checkpoint is saved."""

    def __init__(self, second: str):
        self.second = second

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            os.kill(os.getpid(), signal.SIGINT)
            if self.second == "before-the-save":
                os.kill(os.getpid(), signal.SIGINT)

    def on_save(self, args, state, control, **kwargs):
        if self.second == "after-the-save":
            os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.parametrize("second", ["before-the-save", "after-the-save"])
def test_a_second_ctrl_c_says_whether_the_checkpoint_is_saved(
    tmp_path, tiny_math_model_path, monkeypatch, capsys, second
):
    # Reported (stapo-train, 0.3 s apart): checkpoint-33 was saved, and the end said nothing was. The second Ctrl-C
    # quits at once (here: os._exit raises SystemExit) and says what is on disk.
    from stapo_trl import STAPOTrainer
    from stapo_trl.cli.callbacks import SCRIPT_RESUME_HINT, STOP_SIGNALS, add_command_callbacks

    config = tiny_stapo_config(
        tmp_path / "out", max_steps=4, logging_steps=1, per_device_train_batch_size=8, num_generations=4,
        max_completion_length=16, disable_tqdm=True,
    )  # fmt: skip
    trainer = STAPOTrainer(tiny_math_model_path, math_accuracy_reward, args=config, train_dataset=_dataset())
    trainer.add_callback(_CtrlCTwice(second))
    add_command_callbacks(trainer)
    handlers = [signal.getsignal(s) for s in STOP_SIGNALS]

    def exit_now(code):
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", exit_now)
    try:
        with pytest.raises(SystemExit) as excinfo:
            trainer.train()
    finally:
        for signum, handler in zip(STOP_SIGNALS, handlers):  # quit at once: training's handlers stayed
            signal.signal(signum, handler)
    checkpoint = tmp_path / "out" / "checkpoint-2"
    saved = (
        f"checkpoint saved to {checkpoint}. {SCRIPT_RESUME_HINT}" if second == "after-the-save" else "without saving."
    )
    assert (
        excinfo.value.code == 130
        and capsys.readouterr().err.splitlines()[-1] == f"Second Ctrl-C: quitting now, {saved}"
    )
    assert (checkpoint / "trainer_state.json").is_file() == (second == "after-the-save")
