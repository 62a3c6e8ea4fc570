"""Real stop signals to a real `stapo-train`: a checkpoint at the step boundary, the resume command, exit 128 + N."""

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
    out = tmp_path / "run"
    hold = write_held_reward(tmp_path)
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", model_path, "--output_dir", str(out)]
    # why: no periodic checkpoint, a log line per step to watch, the reward that can hold a step
    argv += ["--max_steps", "5000", "--save_steps", "100000", "--logging_steps", "1", "--eval_before_after", "false"]
    argv += ["--disable_tqdm", "true", "--reward_funcs", "held_reward.held_accuracy", *extra]
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "stapo_trl.cli.train", *argv], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    return proc, out, argv, hold


def _check_stopped_run(output: str, out, argv, signum, status: int, returncode: int) -> int:
    name = signal.Signals(signum).name
    assert returncode == status, output[-3000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    (line,) = [line for line in output.splitlines() if line.startswith(f"Interrupted by {name} at step ")]
    step = int(line.split()[5].rstrip(":"))
    assert f"checkpoint saved to {out / f'checkpoint-{step}'}." in line
    assert line.endswith("Resume with the same command: stapo-train " + " ".join(argv)), line
    assert json.loads((out / f"checkpoint-{step}" / "trainer_state.json").read_text())["global_step"] == step
    assert not (out / "model.safetensors").exists() and not (out / "train_results.json").exists()
    assert "run finished" not in output and "training done" not in output, output[-3000:]
    return step


@pytest.mark.slow  # a real stapo-train subprocess (start, model load, two steps), then a real signal
@pytest.mark.parametrize("signum, status", STOPS, ids=["SIGINT", "SIGTERM", "SIGUSR1"])
def test_a_stop_signal_saves_a_checkpoint_and_prints_the_resume_command(
    tmp_path, tiny_math_model_path, signum, status
):
    # The reported case is SIGTERM: `stapo-train` died within 0.06 s, printed and saved nothing, and exited -15.
    proc, out, argv, _ = _start_long_run(tmp_path, tiny_math_model_path)
    read_until(proc, "step ", count=2)  # two optimizer steps done: training is under way
    os.kill(proc.pid, signum)
    output = proc.communicate(timeout=300)[0]
    name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    assert f"{name}: saving a checkpoint at the end of this step, then stopping" in output, output[-3000:]
    step = _check_stopped_run(output, out, argv, signum, status, proc.returncode)
    assert 2 <= step < 5000


@pytest.mark.slow  # a real stapo-train subprocess, then real signals
@pytest.mark.parametrize("first, repeats, status", [
        (signal.SIGTERM, [signal.SIGTERM, signal.SIGTERM], 143),  # Slurm, then torch's launcher, deliver it again
        (signal.SIGUSR1, [signal.SIGUSR1, signal.SIGTERM], 138),  # the time-limit warning, then the limit
], ids=["SIGTERM-twice-more", "SIGUSR1-then-SIGTERM"])  # fmt: skip
def test_repeated_scheduler_signals_still_save_one_checkpoint(tmp_path, tiny_math_model_path, first, repeats, status):
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
    proc, out, argv, _ = _start_long_run(tmp_path, tiny_math_model_path, "--enable_jit_checkpoint", "true")
    read_until(proc, "step ", count=2)
    os.kill(proc.pid, signal.SIGTERM)
    output = proc.communicate(timeout=300)[0]
    _check_stopped_run(output, out, argv, signal.SIGTERM, 143, proc.returncode)
