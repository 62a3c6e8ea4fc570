"""Ctrl-C during `stapo-train` (`stapo_trl.runfiles.interrupt`), with real signals to a real run: the first saves a
checkpoint at the next step boundary and prints the resume command; the second quits at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from testing_utils import REPO, STAPO_RECIPE


def _start_long_run(tmp_path, model_path: str, *extra: str):
    out = tmp_path / "run"
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", model_path, "--output_dir", str(out)]
    # why: far more steps than the test waits for, no periodic checkpoint, a log line per step to watch
    argv += ["--max_steps", "5000", "--save_steps", "100000", "--logging_steps", "1", "--eval_before_after", "false"]
    argv += ["--disable_tqdm", "true", *extra]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "stapo_trl.cli.train", *argv],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, out, argv


def _read_until(proc, prefix: str) -> list[str]:
    """The output lines up to and including the first that starts with `prefix` (the process is killed if it ends
    first)."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(prefix):
            return lines
    proc.kill()
    raise AssertionError(f"no line starting with {prefix!r} (rc {proc.wait()}):\n{''.join(lines)}")


@pytest.mark.slow  # a real stapo-train subprocess (start, model load, two steps), then real signals
def test_first_sigint_saves_a_checkpoint_and_prints_the_resume_command(tmp_path, tiny_math_model_path):
    proc, out, argv = _start_long_run(tmp_path, tiny_math_model_path)
    _read_until(proc, "step ")
    _read_until(proc, "step ")  # two optimizer steps done: training is under way
    os.kill(proc.pid, signal.SIGINT)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    (line,) = [line for line in output.splitlines() if line.startswith("Interrupted at step")]
    step = int(line.split()[3].rstrip(":"))
    assert 2 <= step < 5000
    assert f"checkpoint saved to {out / f'checkpoint-{step}'}." in line
    assert line.endswith("Resume with the same command: stapo-train " + " ".join(argv)), line
    assert json.loads((out / f"checkpoint-{step}" / "trainer_state.json").read_text())["global_step"] == step
    assert not (out / "model.safetensors").exists()  # no final model: the run is not finished


@pytest.mark.slow  # a real stapo-train subprocess with 400-token rollouts, then real signals
def test_second_sigint_quits_at_once(tmp_path, tiny_math_model_path):
    from stapo_trl.runfiles.interrupt import GracefulInterrupt

    # why: long random completions (T = 3, 400 tokens) make each step last about a second, so that the second signal,
    # sent as soon as the first is acknowledged, lands before the step boundary
    proc, out, _ = _start_long_run(
        tmp_path, tiny_math_model_path, "--temperature", "3.0", "--max_completion_length", "400"
    )
    _read_until(proc, "step ")
    os.kill(proc.pid, signal.SIGINT)
    _read_until(proc, "Ctrl-C: saving a checkpoint at the end of this step")
    start = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130, output
    assert time.monotonic() - start < 5
    assert output.startswith("Second Ctrl-C: quitting now, without saving."), output
    assert not list(out.glob("checkpoint-*"))
    # The handler is installed for the block and restored after it.
    handler = signal.getsignal(signal.SIGINT)
    with GracefulInterrupt():
        assert signal.getsignal(signal.SIGINT) is not handler
    assert signal.getsignal(signal.SIGINT) is handler
