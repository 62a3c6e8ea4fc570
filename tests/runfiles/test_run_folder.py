"""The run folder (`stapo_trl.runfiles.run_folder`, `stapo_trl.runfiles.checkpoints`): a checkpoint whose save was cut
short (a kill, a full disk) is never resumed and is named in one line with why, the newest complete one is; one writer
per `output_dir`, through a lock that a killed writer does not leave held; no file is written through a symbolic
link.

A cut-short save is made by transformers' own `Trainer._save_checkpoint`, stopped at one of its writes by an exception
(the files on disk are what a SIGKILL at that point leaves); `test_kills_inside_checkpoint_and_run_file_writes` kills
real `stapo-train` processes there instead.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from testing_utils import (
    PROMPTS,
    REPO,
    STAPO_RECIPE,
    builtin_cache_root,
    error_line,
    free_port,
    read_jsonl,
    subprocess_env,
    tiny_stapo_config,
    zero_reward,
)


class Killed(Exception):
    """Stands for the SIGKILL that stops a save at one of its writes."""


def _stop_at(monkeypatch, where: str) -> None:
    """Make the checkpoint save stop at `where`: before a write of `Trainer._save_checkpoint`, or halfway through
    `trainer_state.json` (its last write)."""
    from transformers import Trainer, TrainerState

    if where == "trainer_state.json":

        def half_state(self, json_path):
            text = json.dumps({"global_step": self.global_step, "log_history": self.log_history}, indent=2)
            Path(json_path).write_text(text[: len(text) // 2])
            raise Killed(json_path)

        monkeypatch.setattr(TrainerState, "save_to_json", half_state)
    else:

        def killed(self, *args, **kwargs):
            raise Killed(where)

        monkeypatch.setattr(Trainer, where, killed)


def _trainer(model_path, out, max_steps):
    from stapo_trl import STAPOTrainer

    args = tiny_stapo_config(out, max_steps=max_steps, save_strategy="steps", save_steps=1, logging_steps=1)
    return STAPOTrainer(model_path, reward_funcs=zero_reward, args=args, train_dataset=PROMPTS)


CUT_SHORT = [
    ("_save_optimizer_and_scheduler", "checkpoint-2 (no trainer_state.json: its save did not finish)"),  # weights only
    ("_save_rng_state", "checkpoint-2 (no trainer_state.json: its save did not finish)"),  # all but RNG and state
    ("trainer_state.json", "checkpoint-2 (trainer_state.json unreadable (JSONDecodeError): its save did not finish)"),
    ("stray-folder", "checkpoint-999 (empty)"),  # an empty checkpoint-999/ made by hand
]


@pytest.mark.parametrize("where, skipped", CUT_SHORT, ids=[case[0].strip("_") for case in CUT_SHORT])
def test_the_python_api_resumes_the_newest_complete_checkpoint(
    tiny_random_model_path, tmp_path, monkeypatch, caplog, where, skipped
):
    # Reported: a kill inside a checkpoint's save left a folder that `train(resume_from_checkpoint=True)`
    # (transformers' get_last_checkpoint: the highest number) failed on, every time, with a complete one beside it.
    out = tmp_path / "run"
    _trainer(tiny_random_model_path, out, max_steps=1).train()
    if where == "stray-folder":
        (out / "checkpoint-999").mkdir()
    else:
        with monkeypatch.context() as patch:
            _stop_at(patch, where)
            with pytest.raises(Killed):
                _trainer(tiny_random_model_path, out, max_steps=2).train(resume_from_checkpoint=True)
        assert (out / "checkpoint-2").is_dir()
    trainer = _trainer(tiny_random_model_path, out, max_steps=3)
    trainer.train(resume_from_checkpoint=True)
    folder = skipped.split()[0]
    assert (
        f"Resuming training from {out / 'checkpoint-1'}, the newest complete checkpoint; skipped {skipped} and moved it "
        f"aside to _damaged-{folder}." in caplog.text
    )
    assert trainer.state.global_step == 3
    # Every step's metrics row once: the rows of the steps redone after the resume are not doubled.
    assert [row["step"] for row in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]


def test_a_checkpoint_rewritten_in_place_is_incomplete_until_its_new_state(tiny_random_model_path, tmp_path):
    """A run started again in its folder (no resume) saves checkpoint-1 over the earlier run's: cut short, the earlier
    trainer_state.json would mark new weights with old optimizer state complete."""
    from stapo_trl.runfiles.checkpoints import newest_complete_checkpoint

    out = tmp_path / "run"
    _trainer(tiny_random_model_path, out, max_steps=1).train()
    assert newest_complete_checkpoint(str(out))[0] == str(out / "checkpoint-1")
    with pytest.MonkeyPatch.context() as patch:
        _stop_at(patch, "_save_rng_state")
        with pytest.raises(Killed):
            _trainer(tiny_random_model_path, out, max_steps=1).train()
    assert newest_complete_checkpoint(str(out)) == (
        None,
        [("checkpoint-1", "no trainer_state.json: its save did not finish")],
    )
    with pytest.raises(ValueError, match="^No complete checkpoint to resume from in output_dir="):
        _trainer(tiny_random_model_path, out, max_steps=2).train(resume_from_checkpoint=True)


def test_what_a_complete_checkpoint_holds_without_a_run_record(tmp_path, tiny_random_model_path):
    """A checkpoint saved before the run record: complete by rule (the weights, and unless `save_only_model` the
    optimizer, scheduler and RNG state), each file whole."""
    from stapo_trl.runfiles.checkpoints import checkpoint_problem

    out = tmp_path / "run"
    _trainer(tiny_random_model_path, out, max_steps=1).train()
    folder = out / "checkpoint-1"
    (folder / "stapo_run.json").unlink()
    assert checkpoint_problem(str(folder)) is None
    (folder / "rng_state.pth").unlink()  # a checkpoint resumed with fresh RNG state would differ silently
    assert checkpoint_problem(str(folder)) == "no RNG state (rng_state.pth)"
    assert checkpoint_problem(str(folder), save_only_model=True) is None  # such a run saves no optimizer or RNG
    (folder / "optimizer.pt").unlink()
    assert checkpoint_problem(str(folder)) == "no optimizer state (optimizer.pt)"
    (folder / "model.safetensors").rename(folder / "adapter_model.safetensors")  # a PEFT checkpoint
    assert checkpoint_problem(str(folder), save_only_model=True) is None
    (folder / "adapter_model.safetensors").unlink()
    assert checkpoint_problem(str(folder), save_only_model=True) == "no model weights"
    assert checkpoint_problem(str(tmp_path / "checkpoint-4")) == "not a folder"


# ---------------------------------------------------------------------------------------------------------------
# One writer per run folder
# ---------------------------------------------------------------------------------------------------------------

HOLDER = (
    "import sys; from types import SimpleNamespace; from stapo_trl.runfiles.run_folder import lock_run_folder; "
    "lock_run_folder(SimpleNamespace(output_dir=sys.argv[1], should_save=True)); print('held', flush=True); "
    "sys.stdin.read()"
)


@pytest.fixture
def holder(tmp_path):
    """Another process holding `tmp_path/run` as its writer (it prints "held" once it does)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "run")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline() == "held\n"
    yield proc
    proc.kill()
    proc.wait()


def _recipe(model_path):
    return ["--config", STAPO_RECIPE, "--model_name_or_path", model_path, "--eval_before_after", "false"]


def _args(folder, should_save=True):
    return SimpleNamespace(output_dir=str(folder), should_save=should_save)


def test_a_second_writer_is_refused_naming_the_folder_and_the_other_process(holder, tmp_path):
    from stapo_trl.runfiles.run_folder import lock_run_folder

    run = tmp_path / "run"
    with pytest.raises(ValueError) as excinfo:
        lock_run_folder(_args(run))
    message = str(excinfo.value)
    assert message.startswith(f"output_dir={str(run)!r} is in use by another run (pid {holder.pid} on ")
    assert f" on {socket.gethostname()}, since " in message and "\n" not in message, message
    lock_run_folder(_args(run, should_save=False))  # a rank that writes no run file does not take it
    # Killed (SIGKILL), the holder leaves its lock file but no hold: the next run takes the folder.
    holder.kill()
    holder.wait()
    assert (run / "_writer.lock").exists()
    lock_run_folder(_args(run))
    lock_run_folder(_args(run), acquire=False)


def test_holds_nest_within_a_process(tmp_path):
    from stapo_trl.runfiles.run_folder import lock_run_folder

    run = tmp_path / "run"
    lock_run_folder(_args(run))  # stapo-train's
    lock_run_folder(_args(run))  # its trainer's train()
    lock_run_folder(_args(run), acquire=False)
    probe = subprocess.run([sys.executable, "-c", HOLDER, str(run)], input="", capture_output=True, text=True)
    assert probe.returncode == 1 and "is in use by another run" in probe.stderr, probe.stderr
    lock_run_folder(_args(run), acquire=False)
    probe = subprocess.run([sys.executable, "-c", HOLDER, str(run)], input="", capture_output=True, text=True)
    assert probe.returncode == 0 and probe.stdout == "held\n", probe.stderr


@pytest.mark.parametrize("name", ["_writer.txt", "_writer.lock", "metrics.jsonl", "checkpoint-1/optimizer.pt"])
def test_a_symbolic_link_in_the_run_folder_is_refused_and_its_target_left_alone(tmp_path, name):
    # Measured: a _writer.txt that was a symbolic link was followed, and its target overwritten.
    from stapo_trl.runfiles.run_folder import lock_run_folder

    target = tmp_path / "elsewhere.txt"
    target.write_text("precious")
    run = tmp_path / "run"
    (run / "checkpoint-1").mkdir(parents=True)
    (run / name).symlink_to(target)
    with pytest.raises(ValueError) as raised:
        lock_run_folder(_args(run))
    assert str(raised.value) == (
        f"{run / name} is a symbolic link (to {str(target)!r}): a run writes its files in its folder, never through a "
        "link (it would overwrite the link's target). Remove the link, or give another output_dir."
    )
    assert target.read_text() == "precious"


@pytest.mark.parametrize("mode", ["w", "a", "wb"])
def test_a_link_planted_while_a_run_holds_its_folder_is_not_written_through(tmp_path, mode):
    """Every run file stapo_trl writes is opened by `open_run_file` (O_NOFOLLOW): a link made after the run took its
    folder is refused too."""
    from stapo_trl.runfiles.run_folder import open_run_file

    target = tmp_path / "elsewhere.txt"
    target.write_text("precious")
    (tmp_path / "eval.json").symlink_to(target)
    with pytest.raises(ValueError, match=r"eval.json is a symbolic link \(to "):
        open_run_file(tmp_path / "eval.json", mode)
    assert target.read_text() == "precious"


def test_a_symlinked_output_dir_itself_is_a_run_folder(tmp_path):
    """Clusters link a scratch disk as the run folder: the link is the folder, its files are plain files."""
    from stapo_trl.runfiles.run_folder import lock_run_folder

    (tmp_path / "scratch").mkdir()
    (tmp_path / "run").symlink_to(tmp_path / "scratch")
    lock_run_folder(_args(tmp_path / "run"))
    lock_run_folder(_args(tmp_path / "run"), acquire=False)
    assert (tmp_path / "scratch" / "_writer.txt").read_text().startswith(f"pid {os.getpid()} on ")


def test_stapo_train_refuses_a_folder_another_run_writes(
    holder, tmp_path, no_model_built, capsys, tiny_math_model_path
):
    # Reported: two stapo-train on one output_dir both exited 0, every step twice in metrics.jsonl.
    from stapo_trl.cli.train import main

    run = tmp_path / "run"
    with pytest.raises(SystemExit) as excinfo:
        main([*_recipe(tiny_math_model_path), "--output_dir", str(run)])
    assert excinfo.value.code == 2
    line = error_line(capsys, "stapo-train")
    assert line.startswith(f"stapo-train: error: output_dir={str(run)!r} is in use by another run (pid {holder.pid}")
    assert not (run / "metrics.jsonl").exists()


def test_the_python_api_refuses_a_folder_another_run_writes(holder, tmp_path, tiny_random_model_path):
    with pytest.raises(ValueError, match=rf"is in use by another run \(pid {holder.pid} on "):
        _trainer(tiny_random_model_path, tmp_path / "run", max_steps=1)  # before a model is built
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.fixture(params=["under-a-file", "read-only-mount", "read-only-folder"])
def unwritable(request, tmp_path):
    """(output_dir, the reason the OS gives) of a folder no process can write: below a file, in a read-only tmpfs, or
    that tmpfs itself (unmounted afterwards)."""
    (tmp_path / "a-file").write_text("")
    if request.param == "under-a-file":
        yield tmp_path / "a-file" / "run", "Not a directory"
        return
    mount = tmp_path / "ro"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mount)]).returncode != 0:
        pytest.skip("mounting a read-only tmpfs needs root")  # as root, permission bits do not stop a write
    yield (mount / "run" if request.param == "read-only-mount" else mount), "Read-only file system"
    subprocess.run(["umount", "-l", str(mount)], check=True)


def test_an_unwritable_output_dir_is_one_line_before_anything_runs(
    unwritable, no_model_built, capsys, tiny_math_model_path
):
    # Reported: a read-only output_dir failed with exit 1 and a 46-line traceback after the initial evaluation.
    from stapo_trl.cli.train import main

    output_dir, cause = unwritable
    with pytest.raises(SystemExit) as excinfo:
        main([*_recipe(tiny_math_model_path), "--output_dir", str(output_dir)])
    assert excinfo.value.code == 2
    assert error_line(capsys, "stapo-train") == (
        f"stapo-train: error: output_dir={str(output_dir)!r} cannot be written ({cause}): give a folder this process "
        "can create files in."
    )


def test_the_python_api_refuses_an_unwritable_output_dir_at_construction(unwritable, tiny_random_model_path):
    # Reported: STAPOTrainer(..., args=STAPOConfig(output_dir="ro/run")) on a read-only mount stopped in transformers'
    # Trainer.__init__ with "OSError: [Errno 30] Read-only file system: 'ro/run'", after the model was built; with
    # output_dir="ro" itself, construction passed and train() refused the folder.
    output_dir, cause = unwritable
    with pytest.raises(ValueError) as excinfo:
        _trainer(tiny_random_model_path, output_dir, max_steps=1)
    assert str(excinfo.value) == (
        f"output_dir={str(output_dir)!r} cannot be written ({cause}): give a folder this process can create files in."
    )


def _refused(model_path, out, case):
    from datasets import Dataset

    from stapo_trl import STAPOTrainer

    args = tiny_stapo_config(out, max_steps=1)
    if case == "reward-column":  # a reward reading `solution`, which no column fills
        return STAPOTrainer(model_path, reward_funcs="math_accuracy", args=args, train_dataset=PROMPTS)
    if case == "prompt-column":
        return STAPOTrainer(
            model_path, reward_funcs=zero_reward, args=args, train_dataset=Dataset.from_list([{"q": "1"}])
        )
    return STAPOTrainer("not-a-cached-org/model", reward_funcs=zero_reward, args=args, train_dataset=PROMPTS)


@pytest.mark.parametrize("case", ["reward-column", "prompt-column", "uncached-hub-model"])
def test_a_trainer_refused_at_construction_leaves_no_output_dir_behind(tiny_random_model_path, tmp_path, case):
    # Was: the construction took the run folder's lock first, creating output_dir with _writer.lock and _writer.txt,
    # then refused the data (or the model): a folder was left behind by a trainer that never ran.
    with pytest.raises((ValueError, FileNotFoundError, ConnectionError)):
        _refused(tiny_random_model_path, tmp_path / "new" / "run", case)
    assert not (tmp_path / "new").exists()


# ---------------------------------------------------------------------------------------------------------------
# Real kills (SIGKILL) of stapo-train processes
# ---------------------------------------------------------------------------------------------------------------

# Runs stapo-train in a child that SIGKILLs itself at the N-th call of `target`: `trainer_state.json` (transformers'
# `TrainerState.save_to_json`, after writing half of the file), `rng_state` (`Trainer._save_rng_state`, before it
# writes) or `metrics-rewrite` (the N-th row written by `open_jsonl_for_run` when a resumed run rewrites metrics.jsonl).
KILLER = r"""
import dataclasses, json, os, signal, sys
from transformers import Trainer, TrainerState
from stapo_trl.runfiles import callbacks, metrics_log
target, n, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
calls, inside, dumps, opening = [0], [False], json.dumps, metrics_log.open_jsonl_for_run
def count(counts=True):
    calls[0] += counts
    if calls[0] == n:
        os.kill(os.getpid(), signal.SIGKILL)
def save_to_json(self, path, original=TrainerState.save_to_json):
    if calls[0] + 1 == n:
        text = json.dumps(dataclasses.asdict(self), indent=2)
        open(path, "w").write(text[: len(text) // 2])
    count()
    original(self, path)
def save_rng_state(self, *args, original=Trainer._save_rng_state):
    count()
    original(self, *args)
def counting_dumps(*args, **kwargs):
    count(inside[0])
    return dumps(*args, **kwargs)
def open_for_run(*args):
    inside[0] = True
    try:
        return opening(*args)
    finally:
        inside[0] = False
if target == "trainer_state.json":
    TrainerState.save_to_json = save_to_json
elif target == "rng_state":
    Trainer._save_rng_state = save_rng_state
else:
    json.dumps, callbacks.open_jsonl_for_run = counting_dumps, open_for_run
from stapo_trl.cli.train import main
main(argv)
"""


@pytest.mark.slow  # two to three stapo-train processes per case (~10 s of imports each)
@pytest.mark.parametrize(
    "target, n",
    [
        ("trainer_state.json", 2),  # inside checkpoint-4's trainer_state.json
        ("rng_state", 2),  # checkpoint-4 written but for its RNG state and trainer state
        ("metrics-rewrite", 3),  # the third row of a resumed run's rewrite of metrics.jsonl
    ],
    ids=["in-trainer-state", "before-rng-state", "in-metrics-rewrite"],
)
def test_kills_inside_checkpoint_and_run_file_writes(tmp_path, tiny_math_model_path, target, n):
    """The same command rerun after each kill finishes with every logging step's metrics row exactly once."""
    out = tmp_path / "run"
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", "builtin:tiny-math", "--output_dir", str(out)]
    argv += ["--max_steps", "8", "--save_steps", "2", "--logging_steps", "1", "--eval_before_after", "false"]
    argv += ["--disable_tqdm", "true"]
    env = subprocess_env(STAPO_TRL_CACHE=str(builtin_cache_root(tiny_math_model_path)))
    if target == "metrics-rewrite":  # a first run killed in checkpoint-6, whose resume from checkpoint-4 is killed
        first = subprocess.run(
            [sys.executable, "-c", KILLER, "rng_state", "3", *argv], env=env, cwd=REPO, capture_output=True
        )
        assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    killed = subprocess.run(
        [sys.executable, "-c", KILLER, target, str(n), *argv], env=env, cwd=REPO, capture_output=True
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-3000:]
    rerun = subprocess.run(
        [sys.executable, "-m", "stapo_trl.cli.train", *argv], env=env, cwd=REPO, capture_output=True
    )
    assert rerun.returncode == 0, rerun.stderr.decode()[-3000:]
    assert [row["step"] for row in read_jsonl(out / "metrics.jsonl")] == list(range(1, 9))
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 8


@pytest.mark.slow  # two processes under accelerate launch (~20 s of imports on 2 cores)
def test_a_two_process_launch_on_a_folder_another_run_writes_stops_with_one_line(
    holder, tmp_path, tiny_math_model_path
):
    """The main process holds the lock for a launch (the demo's two-process tests run with it held); a second launch's
    main process refuses with one line, and the launcher stops the other process instead of leaving it waiting."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
    cmd += [str(REPO / "recipes" / "accelerate_configs" / "cpu_2proc.yaml"), "--main_process_port", str(free_port())]
    cmd += ["-m", "stapo_trl.cli.train", *_recipe(tiny_math_model_path), "--output_dir", str(run), "--max_steps", "2"]
    result = subprocess.run(cmd, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "exitcode  : 2 (pid:" in output, output[-3000:]
    lines = [line for line in output.splitlines() if line.startswith("stapo-train: error: ")]
    assert len(lines) == 1, output[-3000:]  # the main process's; the other is stopped by the launcher
    assert lines[0].startswith(
        f"stapo-train: error: output_dir={str(run)!r} is in use by another run (pid {holder.pid} on "
    )
    assert not (run / "metrics.jsonl").exists()
