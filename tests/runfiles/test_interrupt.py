"""A stop signal in a user's script saves a checkpoint too, as under `stapo-train` (one implementation for both).

The reported cases: `trainer.train()` in a script ended on a bare `KeyboardInterrupt` traceback with no checkpoint on
Ctrl-C, and died at once on SIGTERM (preemption, `scancel`, a time limit). Now the first SIGINT, SIGTERM or SIGUSR1
saves at the next step boundary and `train()` raises a `KeyboardInterrupt` that names the signal, says where the
checkpoint is and to resume with `trainer.train(resume_from_checkpoint=True)`; a second SIGINT quits at once.
Where a signal must land inside a step, the reward holds the step (`testing_utils.HELD_REWARD`): events, not timing.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from testing_utils import read_until, tiny_stapo_config, write_held_reward
from transformers import TrainerCallback


REPO_ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys

from datasets import Dataset

from held_reward import held_accuracy
from stapo_trl import STAPOConfig, STAPOTrainer
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
    """SIGTERM (preemption, `scancel`, a time limit) killed the script at once, with nothing saved; now it takes Ctrl-C's
    path and the exception names it. Uncaught, it ends the script as Ctrl-C does (by SIGINT: a shell shows 130)."""
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


class _SignalAtStep(TrainerCallback):
    """Send `signum` to this process once, at the end of `step` (what Ctrl-C in a terminal or a notebook does, or a
    scheduler's SIGTERM)."""

    def __init__(self, step: int, signum: int):
        self.step, self.signum, self.sent = step, signum, False

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1], ids=lambda s: s.name)
def test_interrupted_trainer_resumes_in_the_same_process(tmp_path, tiny_math_model_path, signum):
    """A notebook: the interrupt is caught, and the same trainer object resumes from its checkpoint to the end. Before,
    SIGTERM and SIGUSR1 ended the process at once (here: pytest itself)."""
    from datasets import Dataset

    from stapo_trl import STAPOTrainer
    from stapo_trl.callbacks import STOP_SIGNALS
    from stapo_trl.data import format_prompt
    from stapo_trl.rewards import math_accuracy_reward

    dataset = Dataset.from_list([{"prompt": format_prompt(f"{a}+{a}"), "solution": str(2 * a)} for a in range(10, 60)])
    config = tiny_stapo_config(
        tmp_path / "out",
        max_steps=4,
        logging_steps=1,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=16,
        disable_tqdm=True,
    )
    trainer = STAPOTrainer(tiny_math_model_path, math_accuracy_reward, args=config, train_dataset=dataset)
    trainer.add_callback(_SignalAtStep(2, signum))
    handlers = [signal.getsignal(s) for s in STOP_SIGNALS]
    with pytest.raises(KeyboardInterrupt) as excinfo:
        trainer.train()
    assert [signal.getsignal(s) for s in STOP_SIGNALS] == handlers  # restored
    assert excinfo.value.signal == signum and str(excinfo.value).startswith(f"Interrupted by {signum.name} at step 2:")
    assert excinfo.value.step == 2
    assert excinfo.value.checkpoint == str(tmp_path / "out" / "checkpoint-2")
    assert (tmp_path / "out" / "checkpoint-2" / "trainer_state.json").is_file()  # saved despite save_strategy="no"
    assert str(excinfo.value).endswith("Resume with trainer.train(resume_from_checkpoint=True): a trainer built with "
                                       "the same arguments continues from the last checkpoint of its output_dir.")  # fmt: skip
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 4
    assert [row["step"] for row in trainer.state.log_history if "reward" in row] == [1, 2, 3, 4]
