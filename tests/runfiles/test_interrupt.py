"""Ctrl-C in a user's script saves a checkpoint too, as under `stapo-train` (one implementation for both).

The reported case: `trainer.train()` in a script ended on a bare `KeyboardInterrupt` traceback with no checkpoint. Now
the first SIGINT saves at the next step boundary and `train()` raises a `KeyboardInterrupt` whose message says where
the checkpoint is and to resume with `trainer.train(resume_from_checkpoint=True)`; a second SIGINT quits at once.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from testing_utils import tiny_stapo_config
from transformers import TrainerCallback


REPO_ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys

from datasets import Dataset

from stapo_trl import STAPOConfig, STAPOTrainer
from stapo_trl.data import format_prompt
from stapo_trl.rewards import math_accuracy_reward

model, output_dir, max_steps, resume, temperature, length = sys.argv[1:]
dataset = Dataset.from_list(
    [{"prompt": format_prompt(f"{a}+{b}"), "solution": str(a + b)} for a in range(10, 100, 7) for b in (12, 47, 83)]
)
config = STAPOConfig(
    output_dir=output_dir, max_steps=int(max_steps), logging_steps=1, per_device_train_batch_size=8,
    num_generations=4, max_completion_length=int(length), temperature=float(temperature), save_steps=100000,
    report_to="none", disable_tqdm=True, seed=0,
)
trainer = STAPOTrainer(model, math_accuracy_reward, args=config, train_dataset=dataset)
trainer.train(resume_from_checkpoint=True if resume == "resume" else None)
print("FINISHED at step", trainer.state.global_step)
"""


def _start(tmp_path, model_path, *, max_steps=5000, resume=False, temperature=1.0, length=48):
    script = tmp_path / "train_script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    args = [model_path, str(tmp_path / "out"), str(max_steps), "resume" if resume else "new", str(temperature)]
    return subprocess.Popen(
        [sys.executable, str(script), *args, str(length)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _read_until(proc, prefix: str, count: int = 1, timeout: float = 240) -> list[str]:
    """The output lines up to the `count`-th that starts with `prefix`; the process is killed if it ends first or no
    such line comes within `timeout` seconds (checked at each line)."""
    import time

    lines, seen, deadline = [], 0, time.monotonic() + timeout
    for line in proc.stdout:
        lines.append(line)
        seen += line.startswith(prefix)
        if seen == count:
            return lines
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise AssertionError(f"no line starting with {prefix!r} (rc {proc.wait()}):\n{''.join(lines)[-3000:]}")


def test_ctrl_c_in_a_script_saves_a_checkpoint_and_resumes(tmp_path, tiny_math_model_path):
    """The reported case, in a subprocess: SIGINT, the checkpoint and the printed hint, then the resume."""
    proc = _start(tmp_path, tiny_math_model_path)
    _read_until(proc, "step ", count=2)  # two optimizer steps logged: training is under way
    proc.send_signal(signal.SIGINT)
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == -signal.SIGINT, output  # ended by SIGINT, as Ctrl-C does (a shell shows status 130)
    assert "Ctrl-C: saving a checkpoint at the end of this step" in output
    last = output.strip().splitlines()[-1]
    prefix = "KeyboardInterrupt: Interrupted at step "
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


def test_second_ctrl_c_in_a_script_quits_at_once(tmp_path, tiny_math_model_path):
    import time

    # why: long random completions (T = 3, 400 tokens) make a step last long enough for the second signal to land
    proc = _start(tmp_path, tiny_math_model_path, temperature=3.0, length=400)
    _read_until(proc, "step ")
    proc.send_signal(signal.SIGINT)
    _read_until(proc, "Ctrl-C: saving a checkpoint at the end of this step")
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, output
    assert time.monotonic() - start < 10
    assert output.startswith("Second Ctrl-C: quitting now, without saving."), output
    assert not list((tmp_path / "out").glob("checkpoint-*"))


class _CtrlCAtStep(TrainerCallback):
    """Send SIGINT to this process once, at the end of `step` (what Ctrl-C in a terminal or a notebook does)."""

    def __init__(self, step: int):
        self.step, self.sent = step, False

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step and not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)


def test_interrupted_trainer_resumes_in_the_same_process(tmp_path, tiny_math_model_path):
    """A notebook: the interrupt is caught, and the same trainer object resumes from its checkpoint to the end."""
    from datasets import Dataset

    from stapo_trl import STAPOTrainer
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
    trainer.add_callback(_CtrlCAtStep(2))
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt) as excinfo:
        trainer.train()
    assert signal.getsignal(signal.SIGINT) is handler  # restored
    assert excinfo.value.step == 2
    assert excinfo.value.checkpoint == str(tmp_path / "out" / "checkpoint-2")
    assert (tmp_path / "out" / "checkpoint-2" / "trainer_state.json").is_file()  # saved despite save_strategy="no"
    assert str(excinfo.value).endswith("Resume with trainer.train(resume_from_checkpoint=True): a trainer built with "
                                       "the same arguments continues from the last checkpoint of its output_dir.")  # fmt: skip
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 4
    assert [row["step"] for row in trainer.state.log_history if "reward" in row] == [1, 2, 3, 4]


def test_ctrl_c_under_stapo_train_still_prints_the_command(tmp_path, tiny_math_model_path):
    """The CLI goes through the same trainer code: one line with its own resume command, no traceback."""
    argv = ["--config", "recipes/demo/stapo.yaml", "--model_name_or_path", tiny_math_model_path]
    argv += ["--output_dir", str(tmp_path / "run"), "--max_steps", "5000", "--save_steps", "100000"]
    argv += ["--logging_steps", "1", "--eval_before_after", "false", "--disable_tqdm", "true"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "stapo_trl.cli.train", *argv],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    _read_until(proc, "step ", count=2)
    proc.send_signal(signal.SIGINT)
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == 130, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    (line,) = [line for line in output.splitlines() if line.startswith("Interrupted at step")]
    step = int(line.split()[3].rstrip(":"))
    assert f"checkpoint saved to {tmp_path / 'run' / f'checkpoint-{step}'}." in line
    assert line.endswith("Resume with the same command: stapo-train " + " ".join(argv)), line
