"""Stop signals during `stapo-train` (`stapo_trl.cli.callbacks`), real signals to a real run: Ctrl-C, SIGTERM
(preemption, `scancel`, a time limit, `kill`) and SIGUSR1 (Slurm's time-limit warning) each save a checkpoint at the
next step boundary, print the resume command and exit with 128 + the signal's number, with no final model, results
or summary; a second Ctrl-C quits at once, a repeated SIGTERM changes nothing.

Where a signal must land inside a step, the run's reward holds the step (`testing_utils.HELD_REWARD`) until the test
has sent its signals: no test depends on a step lasting long enough.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from testing_utils import REPO, STAPO_RECIPE, read_until, write_held_reward


STOPS = [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGUSR1, 138)]


def _start_long_run(tmp_path, model_path: str, *extra: str):
    """`stapo-train` of the demo recipe for far more steps than the test waits for, scored by the held reward; returns
    the process, its output_dir, its arguments and the HOLD file."""
    out = tmp_path / "run"
    hold = write_held_reward(tmp_path)
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", model_path, "--output_dir", str(out)]
    # why: no periodic checkpoint, a log line per step to watch, the reward that can hold a step
    argv += ["--max_steps", "5000", "--save_steps", "100000", "--logging_steps", "1", "--eval_before_after", "false"]
    argv += ["--disable_tqdm", "true", "--reward_funcs", "held_reward.held_accuracy", *extra]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "stapo_trl.cli.train", *argv],
        cwd=tmp_path,  # why: held_reward.py is imported from the current folder, as a user's reward module
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, out, argv, hold


def _check_stopped_run(output: str, out, argv, signum, status: int, returncode: int) -> int:
    """What a run stopped by `signum` shows: its status, the one-line message with the checkpoint and the command,
    the checkpoint itself, and nothing of a finished run. Returns the step saved."""
    name = signal.Signals(signum).name
    assert returncode == status, output[-3000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    (line,) = [line for line in output.splitlines() if line.startswith(f"Interrupted by {name} at step ")]
    step = int(line.split()[5].rstrip(":"))
    assert f"checkpoint saved to {out / f'checkpoint-{step}'}." in line
    assert line.endswith("Resume with the same command: stapo-train " + " ".join(argv)), line
    assert json.loads((out / f"checkpoint-{step}" / "trainer_state.json").read_text())["global_step"] == step
    # A stopped run is not a finished one: no final model, results or summary. (TRL writes a card into output_dir
    # with every checkpoint, the periodic ones too.)
    assert not (out / "model.safetensors").exists() and not (out / "train_results.json").exists()
    assert "run finished" not in output and "training done" not in output, output[-3000:]
    return step


@pytest.mark.slow  # a real stapo-train subprocess (start, model load, two steps), then a real signal
@pytest.mark.parametrize("signum, status", STOPS, ids=["SIGINT", "SIGTERM", "SIGUSR1"])
def test_a_stop_signal_saves_a_checkpoint_and_prints_the_resume_command(
    tmp_path, tiny_math_model_path, signum, status
):
    """The reported case is SIGTERM: `stapo-train` died within 0.06 s, printed and saved nothing, and exited -15."""
    proc, out, argv, _ = _start_long_run(tmp_path, tiny_math_model_path)
    read_until(proc, "step ", count=2)  # two optimizer steps done: training is under way
    os.kill(proc.pid, signum)
    output = proc.communicate(timeout=300)[0]
    name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    assert f"{name}: saving a checkpoint at the end of this step, then stopping" in output, output[-3000:]
    step = _check_stopped_run(output, out, argv, signum, status, proc.returncode)
    assert 2 <= step < 5000


@pytest.mark.slow  # a real stapo-train subprocess, then real signals
def test_second_sigint_quits_at_once(tmp_path, tiny_math_model_path):
    """Both signals land inside one step (the reward holds it), so the second always finds the first's checkpoint
    still pending: it quits with 130 and nothing saved. (Sent after a long step had started, as before, the second
    came too late whenever that step ended first.)"""
    from stapo_trl.cli.callbacks import STOP_SIGNALS, SaveOnSignal

    proc, out, _, hold = _start_long_run(tmp_path, tiny_math_model_path)
    read_until(proc, "step ")
    hold.touch()
    read_until(proc, "reward held")
    os.kill(proc.pid, signal.SIGINT)
    read_until(proc, "Ctrl-C: saving a checkpoint at the end of this step")
    os.kill(proc.pid, signal.SIGINT)
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == 130, output
    assert output.startswith("Second Ctrl-C: quitting now, without saving."), output
    assert not list(out.glob("checkpoint-*"))
    # The handlers are installed for training and restored after it.
    handlers = [signal.getsignal(signum) for signum in STOP_SIGNALS]
    stop = SaveOnSignal()
    stop.on_train_begin(None, None, None)
    assert all(signal.getsignal(signum) == stop._handle for signum in STOP_SIGNALS)
    stop.on_train_end(None, None, None)
    assert [signal.getsignal(signum) for signum in STOP_SIGNALS] == handlers


@pytest.mark.slow  # a real stapo-train subprocess, then real signals
def test_a_second_ctrl_c_after_the_save_names_the_checkpoint_and_the_resume_command(tmp_path, tiny_math_model_path):
    """Reported: Ctrl-C twice, 0.3 s apart: checkpoint-33 was saved, and the last line said "interrupted (outside
    training: nothing to save)." with no resume command. The second lands once the save is done (after its "training
    stopped" line), with training's handlers still installed or already given back: the end names the checkpoint and
    the command either way."""
    proc, out, argv, hold = _start_long_run(tmp_path, tiny_math_model_path)
    read_until(proc, "step ")
    hold.touch()
    read_until(proc, "reward held")
    os.kill(proc.pid, signal.SIGINT)
    read_until(proc, "Ctrl-C: saving a checkpoint at the end of this step")
    hold.unlink()
    step = int(read_until(proc, "training stopped at step ")[-1].split()[4])
    os.kill(proc.pid, signal.SIGINT)
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == 130, output[-3000:]
    last = output.strip().splitlines()[-1]
    resume = f"Resume with the same command: stapo-train {' '.join(argv)}"
    assert last.endswith(f"checkpoint saved to {out / f'checkpoint-{step}'}. {resume}"), output[-3000:]
    assert json.loads((out / f"checkpoint-{step}" / "trainer_state.json").read_text())["global_step"] == step


@pytest.mark.slow  # a real stapo-train subprocess, then real signals
@pytest.mark.parametrize(
    "first, repeats, status",
    [
        (signal.SIGTERM, [signal.SIGTERM, signal.SIGTERM], 143),  # Slurm, then torch's launcher, deliver it again
        (signal.SIGUSR1, [signal.SIGUSR1, signal.SIGTERM], 138),  # the time-limit warning, then the limit
    ],
    ids=["SIGTERM-twice-more", "SIGUSR1-then-SIGTERM"],
)
def test_repeated_scheduler_signals_still_save_one_checkpoint(tmp_path, tiny_math_model_path, first, repeats, status):
    """Schedulers and launchers deliver SIGTERM more than once (Slurm signals every process of a step, torch's
    launcher forwards it again): repeats inside the step change nothing; the step ends, is saved, and the run exits
    with the first signal's status."""
    proc, out, argv, hold = _start_long_run(tmp_path, tiny_math_model_path)
    read_until(proc, "step ")
    hold.touch()
    read_until(proc, "reward held")
    os.kill(proc.pid, first)
    read_until(proc, f"{first.name}: saving a checkpoint at the end of this step")
    for signum in repeats:
        os.kill(proc.pid, signum)
    hold.unlink()
    output = proc.communicate(timeout=300)[0]
    _check_stopped_run(output, out, argv, first, status, proc.returncode)
    assert len(list(out.glob("checkpoint-*"))) == 1
    assert "quitting now" not in output and "saving a checkpoint" not in output  # (the first's line was read above)


@pytest.mark.slow  # a real stapo-train subprocess, then a real signal
def test_sigterm_with_transformers_jit_checkpoint_is_still_a_stopped_run(tmp_path, tiny_math_model_path):
    """transformers' own SIGTERM handler (`enable_jit_checkpoint`) saves too, but then lets the run write its final
    model and card and exit 0 at step 92 of 300; the package's handler is installed over it for training."""
    proc, out, argv, _ = _start_long_run(tmp_path, tiny_math_model_path, "--enable_jit_checkpoint", "true")
    read_until(proc, "step ", count=2)
    os.kill(proc.pid, signal.SIGTERM)
    output = proc.communicate(timeout=300)[0]
    _check_stopped_run(output, out, argv, signal.SIGTERM, 143, proc.returncode)
