"""Helpers shared by several test files (TRL's `tests/testing_utils.py` is the pattern)."""

import json
import os
import signal
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from stapo_trl import STAPOConfig


REPO = Path(__file__).resolve().parents[1]


class ForwardCounter:
    """Counts the no-grad scoring forwards (fused LM head, not generation) of a model."""

    def __init__(self, model):
        self.count = 0
        model.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs):
        if kwargs.get("fused_lm_head") and not torch.is_grad_enabled():
            self.count += 1


def tiny_stapo_config(output_dir, **overrides) -> STAPOConfig:
    """A `STAPOConfig` for a few CPU steps of a tiny model: 4 completions per step (2 prompts x 2), no checkpoints,
    no trackers; `overrides` win. Built with warnings silenced (the tests check values, not TRL's notices)."""
    settings = dict(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=False,  # bf16 on CPU is slow and not what the maths is checked in
        report_to=[],
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,  # tiny model, short completions
        save_strategy="no",
    )
    settings.update(overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return STAPOConfig(**settings)


# ---------------------------------------------------------------------------------------------------------------
# Subprocesses and multi-process runs (each with a timeout: a hung collective fails the test, not the suite)
# ---------------------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        # why: two processes on two cores; more threads per process only oversubscribe
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


PORT_TAKEN = ("Address already in use", "EADDRINUSE")


def run_distributed(make_cmd, *, timeout: float, env: dict[str, str] | None = None) -> str:
    """`run_subprocess(make_cmd(port))` on a free port; once more on a new port if another job took it meanwhile."""
    for attempt in range(2):
        output = run_subprocess(make_cmd(free_port()), timeout=timeout, env=env, retry_on=PORT_TAKEN * (attempt == 0))
        if output is not None:
            return output
    raise AssertionError("unreachable")


def run_subprocess(
    cmd: list[str],
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: Path = REPO,
    retry_on: tuple[str, ...] = (),
) -> str | None:
    """Run `cmd` in its own process group; fail the test (printing the output) on a non-zero exit or a timeout.

    Returns `None` instead of failing when the run failed and its output contains one of `retry_on`.
    """
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env or subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        print(output)
        pytest.fail(f"timed out after {timeout}s (a hung collective?): {' '.join(cmd)}\n{output[-5000:]}")
    if proc.returncode != 0:
        if any(marker in output for marker in retry_on):
            return None
        print(output)
        pytest.fail(f"exit status {proc.returncode}: {' '.join(cmd)}\n{output[-5000:]}")
    return output


def run_torchrun(source: str, script: Path, *args: str, nproc: int, timeout: float = 600) -> str:
    """Write `source` to `script` and run it on `nproc` local ranks under torchrun (`run_distributed`: free port,
    timeout, output on failure)."""
    script.write_text(source)
    return run_distributed(
        lambda port: [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_addr", "127.0.0.1", "--master_port", str(port), str(script), *args,
        ],
        timeout=timeout,
    )  # fmt: skip


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_two_rank_demo_run(output: str, out: Path) -> None:
    # 8 completions per device x 2 processes x gradient_accumulation_steps 1: only two ranks make it 16.
    assert "Total train batch size (w. parallel, distributed & accumulation) = 16" in output, output[-3000:]
    rows = read_jsonl(out / "metrics.jsonl")
    assert rows, "no metrics.jsonl rows"
    for row in rows:
        for key in ("s2t/silenced_ratio", "s2t/candidate_ratio", "s2t/num_candidates", "loss", "reward"):
            assert key in row, (key, row)
        assert 0.0 <= row["s2t/silenced_ratio"] <= row["s2t/candidate_ratio"] <= 1.0
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    assert any("s2t/silenced_ratio" in entry for entry in state["log_history"])
