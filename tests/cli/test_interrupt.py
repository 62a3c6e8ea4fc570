"""Real stop signals to a real `stapo-train`: a checkpoint at the step boundary, the resume command, exit 128 + N."""

import json
import os
import signal
import subprocess
import sys

import pytest
from testing_utils import REPO, STAPO_RECIPE, read_until, subprocess_env, write_held_reward


@pytest.mark.slow  # a real stapo-train subprocess (start, model load, two steps), then real signals
@pytest.mark.parametrize("first, repeats, status, extra", [
        (signal.SIGINT, [], 130, []),
        (signal.SIGTERM, [], 143, []),  # reported: `stapo-train` died within 0.06 s, saved nothing, and exited -15
        (signal.SIGUSR1, [], 138, []),
        (signal.SIGTERM, [signal.SIGTERM, signal.SIGTERM], 143, []),  # Slurm, then torch's launcher, deliver it again
        (signal.SIGUSR1, [signal.SIGUSR1, signal.SIGTERM], 138, []),  # the time-limit warning, then the limit
        (signal.SIGTERM, [], 143, ["--enable_jit_checkpoint", "true"]),  # transformers' own SIGTERM checkpoint
])  # fmt: skip
def test_a_stop_signal_saves_one_checkpoint_and_prints_the_resume_command(
    tmp_path, tiny_math_model_path, first, repeats, status, extra
):
    out, hold = tmp_path / "run", write_held_reward(tmp_path)
    # why: no periodic checkpoint, a log line per step to watch, the reward that can hold a step
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--output_dir", str(out),
            "--max_steps", "5000", "--save_steps", "100000", "--logging_steps", "1", "--eval_before_after", "false",
            "--disable_tqdm", "true", "--reward_funcs", "held_reward.held_accuracy", *extra]  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "stapo_trl.cli.train", *argv], cwd=tmp_path, env=subprocess_env(
        PYTHONPATH=str(REPO)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    read_until(proc, "step ", count=2)  # two optimizer steps done: training is under way
    hold.touch()
    read_until(proc, "reward held")
    os.kill(proc.pid, first)
    name = "Ctrl-C" if first == signal.SIGINT else first.name
    read_until(proc, f"{name}: saving a checkpoint at the end of this step, then stopping")
    for signum in repeats:
        os.kill(proc.pid, signum)
    hold.unlink()
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == status, output[-3000:]
    (line,) = [line for line in output.splitlines() if line.startswith(f"Interrupted by {first.name} at step ")]
    step = int(line.split()[5].rstrip(":"))
    assert 2 <= step < 5000 and f"checkpoint saved to {out / f'checkpoint-{step}'}." in line, line
    assert line.endswith("Resume with the same command: stapo-train " + " ".join(argv)), line
    assert json.loads((out / f"checkpoint-{step}" / "trainer_state.json").read_text())["global_step"] == step
    assert [p.name for p in out.glob("checkpoint-*")] == [f"checkpoint-{step}"]
    assert not (out / "model.safetensors").exists() and not (out / "train_results.json").exists()
    for text in ("Traceback", "KeyboardInterrupt", "run finished", "training done", "quitting now", "saving a"):
        assert text not in output, output[-3000:]
