"""scripts/launch.sh passes SIGUSR1, and SIGTERM outside Slurm, on to (a stand-in) training; exits 128 + signal."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from testing_utils import REPO, free_port, read_until


pytestmark = pytest.mark.slow  # the recipe's dry run, a server and a training process per test

# `trl vllm-serve`'s stand-in serves a folder holding a file named health: GET /health answers 200.
STUB_SERVER = """#!/usr/bin/env bash
while [[ $# -gt 0 && "$1" != --port ]]; do shift; done
exec "$PYTHON" -m http.server --bind 127.0.0.1 --directory "$STUB_DIR" "$2"
"""

STUB_TRAINING = """import os, signal, sys
record = os.environ["STUB_RECORD"]
def stop(signum, frame):
    with open(record, "a") as f:
        print("got", signal.Signals(signum).name, file=f)
    sys.exit(128 + signum)
for signum in (signal.SIGTERM, signal.SIGUSR1):
    signal.signal(signum, stop)
with open(record, "a") as f:
    print("training started", file=f)
while True:
    signal.pause()
"""


def _as_from_a_terminal():  # SIGINT at its default and unblocked (pytest in the background may have it ignored)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_launch(tmp_path, **env: str) -> tuple[subprocess.Popen, object]:
    (tmp_path / "health").write_text("ok")
    server, training, accelerate, record = (tmp_path / name for name in ("trl", "training.py", "accelerate", "record"))
    training.write_text(STUB_TRAINING)
    for stub, text in [(server, STUB_SERVER), (accelerate, f'#!/bin/bash\nexec "{sys.executable}" "{training}"\n')]:
        stub.write_text(text)
        stub.chmod(0o755)
    full_env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID")}
    full_env |= dict(PYTHON=sys.executable, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TRL_BIN=str(server),
                     ACCELERATE_BIN=str(accelerate), STUB_DIR=str(tmp_path), STUB_RECORD=str(record),
                     HEALTH_INTERVAL="0.5", **env)  # fmt: skip
    proc = subprocess.Popen(
        ["bash", str(REPO / "scripts" / "launch.sh"), "recipes/Qwen3-1.7B/stapo.yaml", "--gpus", "0,1,2,3,4,5,6,7",
         "--port", str(free_port()), "--timeout", "120", "--log-dir", str(tmp_path)],
        cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        preexec_fn=_as_from_a_terminal,
    )  # fmt: skip
    deadline = time.monotonic() + 300  # a guard against a hang, not a bound on the launcher's speed
    while not (record.exists() and "training started" in record.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.2)
    return proc, record


@pytest.mark.parametrize("signum, status, got, printed", [
    *[(signum, 128 + signum, [f"got {signum.name}"], [f"launch.sh: {signum.name}: passed on to training",
                                                      f"training exited with status {128 + signum}"])
      for signum in (signal.SIGUSR1, signal.SIGTERM)],
    (signal.SIGINT, 130, [], ["KeyboardInterrupt"]),
], ids=["SIGUSR1", "SIGTERM", "ctrl-c"])  # fmt: skip
def test_launch_passes_a_stop_signal_on_to_training(tmp_path, signum, status, got, printed):
    # Slurm's `--signal=B:USR1@...` and `kill` reach launch.sh only; Ctrl-C the foreground process group.
    proc, record = _start_launch(tmp_path)
    server = [p for p in psutil.Process(proc.pid).children() if "http.server" in " ".join(p.cmdline())]
    os.killpg(proc.pid, signum) if signum == signal.SIGINT else proc.send_signal(signum)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == status, output[-3000:]
    assert record.read_text().splitlines() == ["training started", *got]
    assert all(line in output for line in printed), output[-3000:]
    if got:
        assert server and not psutil.wait_procs(server, timeout=30)[1], "launch.sh left the vLLM server running"


def test_launch_in_a_slurm_job_leaves_sigterm_to_slurm(tmp_path):
    # scancel and preemption signal every process of the job: passed on, training would get SIGTERM twice.
    proc, record = _start_launch(tmp_path, SLURM_JOB_ID="1")
    proc.send_signal(signal.SIGTERM)
    read_until(proc, "launch.sh: SIGTERM in Slurm job 1, which signals training itself")
    assert record.read_text().splitlines() == ["training started"]  # nothing passed on
    (training,) = [p for p in psutil.Process(proc.pid).children() if "training.py" in " ".join(p.cmdline())]
    training.send_signal(signal.SIGTERM)  # what Slurm sends every process
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 143, output[-3000:]
    assert record.read_text().splitlines() == ["training started", "got SIGTERM"]
