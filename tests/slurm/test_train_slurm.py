"""slurm/train.slurm under a real one-node Slurm (`make test-slurm`, root): stopped by the time-limit warning and a
preemption inside held steps, requeued twice, every step's metrics row once. `cred_expire` 10 s lets requeues start."""

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testing_utils import REPO, free_port, read_jsonl, readme_code_blocks, subprocess_env, write_held_reward


pytestmark = [pytest.mark.slow, pytest.mark.slurm]


def _run(*cmd: str, env: dict[str, str]) -> str:
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"{shlex.join(cmd)}: {result.stdout}{result.stderr}"
    return result.stdout


def _wait_for(condition, what: str, log: Path | None = None, timeout: float = 300):  # an event; a guard, with the log
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout} s:\n{log.read_text()[-5000:] if log else ''}")
        time.sleep(0.5)
    return value


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    sbin = {name: shutil.which(name) or f"/usr/sbin/{name}" for name in ("munged", "slurmctld", "slurmd")}
    if os.geteuid() != 0 or not all(os.access(path, os.X_OK) for path in sbin.values()) or not shutil.which("sbatch"):
        pytest.skip("needs root and Slurm with munge (`make test-slurm` installs Debian's slurmctld, slurmd, munge)")
    root = tmp_path_factory.mktemp("slurm")
    for folder in ("state", "spool", "log"):
        (root / folder).mkdir()
    key, socket_path = root / "munge.key", root / "munge.socket"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    host, conf = socket.gethostname().split(".")[0], root / "slurm.conf"
    settings = dict(
        ClusterName="stapotest", SlurmctldHost=host, SlurmctldPort=free_port(), SlurmdPort=free_port(),
        SlurmUser="root", SlurmdUser="root", AuthType="auth/munge", CredType="cred/munge",
        AuthInfo=f"socket={socket_path},cred_expire=10", ProctrackType="proctrack/linuxproc", TaskPlugin="task/none",
        SelectType="select/cons_tres", SelectTypeParameters="CR_Core", ReturnToService=2,
        JobAcctGatherType="jobacct_gather/none", MpiDefault="none", StateSaveLocation=f"{root}/state",
        SlurmdSpoolDir=f"{root}/spool", SlurmctldPidFile=f"{root}/slurmctld.pid", SlurmdPidFile=f"{root}/slurmd.pid",
        SlurmctldLogFile=f"{root}/log/slurmctld.log", SlurmdLogFile=f"{root}/log/slurmd.log",
        PreemptType="preempt/partition_prio", PreemptMode="REQUEUE",
        NodeName=f"{host} CPUs={os.cpu_count()} RealMemory=1000 State=UNKNOWN",
    )  # fmt: skip
    conf.write_text("".join(f"{k}={v}\n" for k, v in settings.items())
                    + "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1\n"
                    + "PartitionName=urgent Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2\n")  # fmt: skip
    env = subprocess_env(SLURM_CONF=str(conf))
    pid_files = [root / "munged.pid", root / "slurmctld.pid", root / "slurmd.pid"]
    try:
        _run(sbin["munged"], "--force", f"--socket={socket_path}", f"--key-file={key}", f"--pid-file={pid_files[0]}",
             f"--log-file={root}/log/munged.log", f"--seed-file={root}/munged.seed", env=env)  # fmt: skip
        _run(sbin["slurmctld"], env=env)
        _run(sbin["slurmd"], env=env)
        _wait_for(lambda: "idle" in _run("sinfo", "-h", "-o", "%t", env=env), "idle node", root / "log/slurmd.log", 60)
        yield env
    finally:
        try:  # jobs left by a failed test, killed: a process ignoring SIGTERM would outlive slurmctld's KillWait
            if jobs := _run("squeue", "-h", "-o", "%i", env=env).split():
                subprocess.run(["scancel", "--full", "--signal=KILL", *jobs], env=env)
                subprocess.run(["scancel", *jobs], env=env)
                _wait_for(lambda: not _run("squeue", "-h", env=env).strip(), "empty queue", timeout=120)
        finally:
            for pid_file in reversed(pid_files):
                if pid_file.exists():
                    os.kill(int(pid_file.read_text()), signal.SIGTERM)


def _job(job_id: str, env: dict[str, str]) -> dict[str, str]:
    text = subprocess.run(["scontrol", "show", "job", job_id], env=env, capture_output=True, text=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", text))


def _running(job_id: str, env: dict[str, str], run: int) -> bool:
    job = _job(job_id, env)
    return job.get("JobState") == "RUNNING" and int(job.get("Restarts", 0)) == run - 1


def test_a_job_stopped_by_the_warning_and_by_preemption_resumes_each_time(slurm, tiny_math_model_path, tmp_path):
    out, log, hold = tmp_path / "run", tmp_path / "job.log", write_held_reward(tmp_path)
    max_steps = 16
    (line,) = [line for line in readme_code_blocks("bash", REPO / "docs/training_at_scale.md")[0].splitlines()
               if "sbatch" in line and "--model demo" in line]  # fmt: skip
    command = shlex.split(line.split("&&")[-1])
    # the job imports the held reward; VENV: train.slurm activates this interpreter's environment
    env = dict(slurm, PYTHONPATH=str(tmp_path), VENV=str(Path(sys.executable).parents[1]))
    while "=" in command[0]:  # VAR=value before the command
        env.update([command.pop(0).split("=", 1)])
    script = command.index("slurm/train.slurm")
    sbatch = command[:script] + ["--parsable", f"--output={log}", f"--error={log}"]
    overrides = ["--model_name_or_path", tiny_math_model_path, "--output_dir", str(out), "--max_steps", str(max_steps),
                 "--logging_steps", "1", "--save_steps", "100000", "--eval_before_after", "false", "--disable_tqdm",
                 "true", "--reward_funcs", "held_reward.held_accuracy"]  # fmt: skip
    script_args = command[script:] + ["--main-process-port", str(free_port()), "--", *overrides]
    start = time.monotonic()
    job = _run(*sbatch, *script_args, env=env).strip()
    try:
        # Run 1: a step held; the time-limit warning, as Slurm sends it to the batch script.
        _wait_for(lambda: out.joinpath("metrics.jsonl").exists() and read_jsonl(out / "metrics.jsonl"), "row", log)
        hold.touch()
        _wait_for(lambda: "reward held" in log.read_text(), "held step", log)
        _run("scancel", "--batch", "--signal=USR1", job, env=env)
        _wait_for(lambda: "SIGUSR1: saving a checkpoint at the end of this step" in log.read_text(), "ack", log)
        hold.unlink()
        # Run 2 (requeued by the job): preemption by a job of the urgent partition, inside a held step.
        _wait_for(lambda: _running(job, env, run=2), "run 2", log)
        _wait_for(lambda: "Resuming training from" in log.read_text(), "resume", log)
        hold.touch()
        _wait_for(lambda: log.read_text().count("reward held") == 2, "held step of run 2", log)
        urgent = _run("sbatch", "--parsable", "--partition=urgent", "--output=/dev/null", "--wrap=true", env=env)
        _wait_for(lambda: "SIGTERM: saving a checkpoint at the end of this step" in log.read_text(), "ack", log)
        hold.unlink()
        _wait_for(lambda: _job(urgent.strip(), env).get("JobState") == "COMPLETED", "urgent job done", log)
        _wait_for(lambda: _running(job, env, run=3), "run 3", log)
        _wait_for(lambda: _job(job, env).get("JobState") in ("COMPLETED", "FAILED"), "the end of the job", log)
    finally:
        subprocess.run(["scancel", job], env=slurm)
    print(f"Slurm job of 3 runs: {time.monotonic() - start:.0f} s")
    text = log.read_text()
    state = _job(job, env)
    assert (state["JobState"], state["ExitCode"], state["Restarts"]) == ("COMPLETED", "0:0", "2"), text[-5000:]
    assert [row["step"] for row in read_jsonl(out / "metrics.jsonl")] == list(range(1, max_steps + 1)), text[-5000:]
    lines = text.splitlines()
    assert sum(line.startswith("train.slurm: SIGUSR1 (the time limit is near)") for line in lines) == 1, text
    assert sum(line.startswith("train.slurm: SIGTERM (scancel, preemption") for line in lines) == 1, text
    assert [line for line in lines if line.startswith(f"train.slurm: job {job}, run ")] == [
        f"train.slurm: job {job}, run {n}: training resumes from the last checkpoint in its output_dir."
        for n in (2, 3)
    ]
    stops = [match for line in lines if (match := re.match(r"Interrupted by (\w+) at step (\d+):", line))]
    assert [match[1] for match in stops] == ["SIGUSR1", "SIGTERM"], text[-5000:]
    assert all(f"Resuming training from {out / f'checkpoint-{match[2]}'}" in text for match in stops)
    assert (out / "model.safetensors").exists() and "run finished" in text
