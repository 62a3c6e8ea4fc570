"""Stop signals across a two-process launch (launcher, Slurm, Ctrl-C), and the Slurm script's per-node launch line."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from accelerate.utils.versions import compare_versions
from testing_utils import (
    PORT_TAKEN,
    REPO,
    SMALL_TWO_RANK_DEMO,
    STAPO_RECIPE,
    accelerate_launch,
    check_two_rank_demo_run,
    free_port,
    read_until,
    subprocess_env,
    torchrun_launch,
    write_held_reward,
)


pytestmark = pytest.mark.slow

SLURM_SCRIPT, CPU_2PROC = REPO / "slurm" / "train.slurm", REPO / "recipes" / "accelerate_configs" / "cpu_2proc.yaml"
PIPED = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)  # in its own session


def _train_args(model_path: str, out: Path, max_steps: int = 5000) -> list[str]:
    return ["--config", STAPO_RECIPE, "--model_name_or_path", model_path, "--output_dir", str(out), "--max_steps",
            str(max_steps), "--per_device_train_batch_size", "8", "--logging_steps", "1", "--save_strategy", "no",
            "--eval_before_after", "false", "--report_to", "none", "--disable_tqdm", "true", "--reward_funcs",
            "held_reward.held_accuracy"]  # fmt: skip


def _start_two_ranks(tmp_path: Path, model_path: str, launch: list[str] | None = None, max_steps=5000, **env: str):
    out, hold = tmp_path / "run", write_held_reward(tmp_path)
    launch = launch or [*accelerate_launch(free_port()), "-m", "stapo_trl.cli.train"]
    env = subprocess_env(PYTHONPATH=str(REPO), TORCH_ELASTIC_SHUTDOWN_TIMEOUT="300", **env)
    proc = subprocess.Popen(launch + _train_args(model_path, out, max_steps), cwd=tmp_path, env=env, **PIPED)
    return proc, out, hold


def _node_launch_env(machines: int, **extra: str) -> dict[str, str]:  # what slurm/train.slurm exports for it
    return dict(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", STAPO_NUM_PROCESSES="2",
                STAPO_ACCELERATE_CONFIG=str(CPU_2PROC), STAPO_NUM_MACHINES=str(machines), **extra,
                STAPO_MAIN_PROCESS_IP="127.0.0.1", STAPO_MAIN_PROCESS_PORT=str(free_port()))  # fmt: skip


def _workers(launcher: subprocess.Popen) -> list[psutil.Process]:
    workers = [c for c in psutil.Process(launcher.pid).children(recursive=True) if "stapo_trl.cli.train" in c.cmdline()
               and "accelerate.commands.launch" not in c.cmdline()]  # fmt: skip
    assert len(workers) == 2, [w.cmdline() for w in workers]
    return workers


def _finish(proc: subprocess.Popen) -> str:
    try:
        return proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _check_one_checkpoint_on_every_rank(output: str, out: Path, signum: signal.Signals) -> tuple[int, str]:
    interrupted = [line for line in output.splitlines() if line.startswith("Interrupted by")]
    assert [line.split()[2] for line in interrupted] == [signum.name], output[-5000:]
    step = int(interrupted[0].removeprefix(f"Interrupted by {signum.name} at step ").split(":")[0])
    assert [p.name for p in out.glob("checkpoint-*")] == [f"checkpoint-{step}"]
    checkpoint = out / f"checkpoint-{step}"
    assert {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors", "optimizer.pt"} <= set(os.listdir(checkpoint))
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == step
    assert not (out / "model.safetensors").exists() and "quitting now" not in output, output[-5000:]
    return step, interrupted[0]


@pytest.mark.parametrize("signum, env, launcher", [
    (signal.SIGTERM, {}, "accelerate"), (signal.SIGINT, {}, "accelerate"), (signal.SIGTERM, {}, "torchrun"),
    (signal.SIGUSR1, {"PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"}, "accelerate"),
    (signal.SIGINT, {}, "ctrl-c"),
], ids=["SIGTERM", "SIGINT", "SIGTERM-torchrun", "SIGUSR1-listed", "ctrl-c"])  # fmt: skip
def test_a_stop_signal_saves_one_checkpoint_on_every_rank(tiny_math_model_path, tmp_path, signum, env, launcher):
    # to the launcher, which forwards it to both workers (they save together); Ctrl-C: the launcher's process group
    launch = [*torchrun_launch(free_port()), "-m", "stapo_trl.cli.train"] if launcher == "torchrun" else None
    proc, out, _ = _start_two_ranks(tmp_path, tiny_math_model_path, launch, **env)
    try:
        read_until(proc, "step ", count=2)  # two optimizer steps logged on both ranks
        os.killpg(proc.pid, signum) if launcher == "ctrl-c" else proc.send_signal(signum)
    finally:
        output = _finish(proc)
    step, line = _check_one_checkpoint_on_every_rank(output, out, signum)
    if launcher == "ctrl-c":
        tail = ("Resume with the same command: the same launch command, i.e. accelerate launch [your launch options] "
                f"-m stapo_trl.cli.train {' '.join(_train_args(tiny_math_model_path, out))}")  # fmt: skip
        assert step >= 2 and line.endswith(tail), line
        proc, _, _ = _start_two_ranks(tmp_path, tiny_math_model_path, max_steps=step + 2)
        resumed = _finish(proc)
        assert proc.returncode == 0, resumed[-3000:]
        assert f"Resuming training from {out / f'checkpoint-{step}'}" in resumed, resumed[-3000:]
        assert json.loads((out / "trainer_state.json").read_text())["global_step"] == step + 2
        assert (out / "model.safetensors").exists()
        return
    assert output.count(f"closing signal {signum.name}") == 2, output[-5000:]  # the launcher forwarded it to each
    # the launcher's own status, after the workers: accelerate >= 1.16 exits 128 + the signal's number, quietly
    if launcher == "accelerate" and compare_versions("accelerate", ">=", "1.16.0"):
        assert proc.returncode == 128 + signum and "Traceback" not in output, output[-5000:]
    else:
        assert proc.returncode == 1 and "SignalException: Process" in output, output[-5000:]


HELD_CASES = [(signal.SIGUSR1, "node"), (signal.SIGTERM, "node"), (signal.SIGTERM, "rank 1")]


@pytest.mark.parametrize("signum, launcher", HELD_CASES, ids=["SIGUSR1", "SIGTERM", "rank1"])
def test_a_signal_in_a_held_step_stops_both_ranks_at_one_step(tiny_math_model_path, tmp_path, signum, launcher):
    # node: train.slurm's --node-launch, every process signalled twice as Slurm does; rank 1: rank 1 alone signalled
    node = [["bash", str(SLURM_SCRIPT), "--node-launch"], _node_launch_env(1, SLURM_PROCID="0")]
    launch, env = node if launcher == "node" else (None, {})
    proc, out, hold = _start_two_ranks(tmp_path, tiny_math_model_path, launch, **env)
    try:
        read_until(proc, "step ")
        hold.touch()
        read_until(proc, "reward held", count=2)  # both ranks inside the step
        if launcher == "node":
            processes = [psutil.Process(proc.pid), *_workers(proc)] * 2
        else:
            processes = [next(w for w in _workers(proc) if w.environ().get("RANK") == "1")]
        for process in processes:
            process.send_signal(signum)
        read_until(proc, f"{signum.name}: saving a checkpoint at the end of this step", count=1 + (launcher == "node"))
        hold.unlink()
    finally:
        output = _finish(proc)
    _check_one_checkpoint_on_every_rank(output, out, signum)
    if launcher == "rank 1":
        assert output.count("saving a checkpoint at the end of this step") == 0  # only rank 1's line, read above
        return
    assert "got signal" not in output, output[-5000:]  # the launcher's SignalException: it did not take the signal
    # It ended as for any worker's failure, once both had exited with 128 + the signal's number.
    assert proc.returncode == 1 and output.count(f"exitcode  : {128 + signum}") == 2, output[-5000:]


def test_the_slurm_scripts_node_launch_runs_two_machine_ranks(tiny_math_model_path, tmp_path):
    out = tmp_path / "two-machines"
    train_args = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--output_dir", str(out)]
    command = ["bash", str(SLURM_SCRIPT), "--node-launch", *train_args, *SMALL_TWO_RANK_DEMO]
    for attempt in range(2):  # a second port when another job took the first meanwhile
        env = subprocess_env(**_node_launch_env(2))
        ranks = [subprocess.Popen(command, cwd=REPO, env=env | {"SLURM_PROCID": str(r)}, **PIPED) for r in (0, 1)]
        outputs = [_finish(rank) for rank in ranks]
        if attempt or not any(marker in outputs[0] for marker in PORT_TAKEN):
            break
    assert [rank.returncode for rank in ranks] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    check_two_rank_demo_run(outputs[0], out)  # machine rank 0 holds global rank 0: the batch size and the files
