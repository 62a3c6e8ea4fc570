"""`stapo_trl.run_folder.checkpoints`: whole checkpoints, the run record, no write through a link, one writer."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import Dataset
from testing_utils import PROMPTS, error_line, text_reward, tiny_stapo_config, write_hostile_pickle, zero_reward
from torch.nn.modules.module import _IncompatibleKeys
from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainerCallback, TrainerState
from transformers.trainer_utils import get_last_checkpoint

from stapo_trl import STAPOTrainer
from stapo_trl.cli.args import parse_args
from stapo_trl.cli.prepare import prepare
from stapo_trl.cli.train import main
from stapo_trl.run_folder import checkpoints as ck
from stapo_trl.run_folder.checkpoints import checkpoint_problem, hold_run_folder, newest_complete_checkpoint


def _trainer(model_path, out, reward=zero_reward, dataset=PROMPTS, **kw):
    args = dict(max_steps=2, save_strategy="steps", save_steps=1, logging_steps=1) | kw
    return STAPOTrainer(model_path, reward_funcs=reward, args=tiny_stapo_config(out, **args), train_dataset=dataset)


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory, tiny_random_model_path):
    out = tmp_path_factory.mktemp("two-checkpoints") / "run"
    _trainer(tiny_random_model_path, out).train()
    return out


@pytest.fixture
def run(two_checkpoints, tmp_path):
    shutil.copytree(two_checkpoints, tmp_path / "run")
    return tmp_path / "run"


_resume_lines = lambda caplog: [m for m in caplog.messages if re.search("newest complete|Resuming", m)]  # noqa: E731


def test_a_checkpoint_records_its_files_and_settings_and_needs_its_states(run, tiny_random_model_path):
    record = json.loads((run / "checkpoint-2" / "stapo_run.json").read_text())
    files = sorted(p.name for p in (run / "checkpoint-2").iterdir() if p.name != "stapo_run.json")
    assert record["files"] == files and {"scheduler.pt", "rng_state.pth"} <= set(files)
    settings = record["settings"]
    keys = ("trainer", "model", "reward_funcs", "train_dataset", "s2t_prob_threshold", "s2t_entropy_quantile",
            "s2t_mode", "learning_rate", "optim", "loss_type")  # fmt: skip
    expected = [False, "STAPOTrainer", tiny_random_model_path, ["zero_reward"], PROMPTS._fingerprint, 0.002, 0.75,
                "low_entropy", 1e-06, "adamw_torch_fused", "dapo"]  # fmt: skip
    assert [record["save_only_model"], *(settings[k] for k in keys)] == expected
    assert settings["peft"] is None and "max_steps" not in settings and "per_device_train_batch_size" not in settings
    folder = run / "checkpoint-1"
    (folder / "stapo_run.json").unlink()
    assert checkpoint_problem(str(folder)) is None
    (folder / "rng_state.pth").unlink()
    assert checkpoint_problem(str(folder)) == "no RNG state (rng_state.pth)"
    assert checkpoint_problem(str(folder), save_only_model=True) is None
    (folder / "optimizer.pt").unlink()
    assert checkpoint_problem(str(folder)) == "no optimizer state (optimizer.pt)"
    (folder / "model.safetensors").rename(folder / "adapter_model.safetensors")  # a PEFT checkpoint
    assert checkpoint_problem(str(folder), save_only_model=True) is None
    (folder / "adapter_model.safetensors").unlink()
    assert checkpoint_problem(str(folder), save_only_model=True) == "no model weights"
    assert checkpoint_problem(str(run / "checkpoint-4")) == "not a folder"


_edit = lambda f: lambda p, m: (f(d := json.loads(p.read_text())), p.write_text(json.dumps(d)))  # noqa: E731
CUT = lambda p, m: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])  # noqa: E731
GONE, DEEP = (lambda p, m: p.unlink()), (lambda p, m: p.write_text("[" * 100_000))
DAMAGES = {  # case: (file, damage, problem)
    "model-cut": ("model.safetensors", CUT, "model.safetensors damaged: incomplete metadata, file not fully covered"),
    "optimizer-cut": ("optimizer.pt", CUT, "optimizer.pt damaged: no zip directory (cut short, or overwritten)"),
    "rng-overwritten": ("rng_state.pth", lambda p, m: p.write_bytes(b"overwritten by hand\n"),
                        "rng_state.pth damaged: no zip directory (cut short, or overwritten)"),
    "no-scheduler": ("scheduler.pt", GONE, "no scheduler.pt: without it transformers resumes with a fresh optimizer"),
    "scheduler-hostile": ("scheduler.pt", write_hostile_pickle, "scheduler.pt refused by a safe load: Trying to load "
                          "unsupported GLOBAL posix.system whose module posix is blocked"),
    "config-cut": ("config.json", CUT, "config.json unreadable: JSONDecodeError"),
    "no-tokenizer": ("tokenizer.json", GONE, "no tokenizer.json, which its save wrote"),
    "model-grown": ("model.safetensors", lambda p, m: p.write_bytes(p.read_bytes() + b"\0" * 16),
                    "model.safetensors damaged: incomplete metadata, file not fully covered"),
    "rollout-cut": ("rollout_state_0.safetensors", CUT, "rollout_state_0.safetensors damaged: invalid header length"),
    "no-rollout": ("rollout_state_0.safetensors", GONE, "no rollout_state_0.safetensors, which its save wrote"),
    "rollout-lies": ("rollout_state_0.json", _edit(lambda manifest: manifest["tensors"]["loss"].update(shape=[2])),
                     "rollout_state_0.json does not match rollout_state_0.safetensors (its tensors' "
                     "names, dtypes or shapes)"),
    **{f"step-{case}": ("trainer_state.json", _edit(lambda state, v=value: state.update(global_step=v)),
                        f"trainer_state.json has global_step {value!r}, not its step 2")
       for case, value in (("negative", -5), ("string", "2"), ("ahead", 100), ("huge", 10**30))},
    "state-cut": ("trainer_state.json", CUT, "trainer_state.json unreadable (JSONDecodeError): its save did not "
                  "finish"),
    "state-deep": ("trainer_state.json", DEEP, "trainer_state.json unreadable (RecursionError): its save did not "
                   "finish"),
    "record-deep": ("stapo_run.json", DEEP, "stapo_run.json unreadable: RecursionError"),
    "record-format": ("stapo_run.json", _edit(lambda record: record.update(format=999)),
                      "stapo_run.json is of an unknown format (999; this stapo_trl reads 1)"),
    "record-no-lr": ("stapo_run.json", _edit(lambda record: record["settings"].pop("learning_rate")),
                     "stapo_run.json holds no learning_rate, which its format records"),
    "record-unfinished": ("stapo_run.json", _edit(lambda record: record.update(files=None)),
                          "stapo_run.json says its save did not finish"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(DAMAGES))
def test_what_makes_a_checkpoint_incomplete_names_the_file_and_the_damage(run, tmp_path, case):
    write_hostile_pickle(run / "checkpoint-2" / "training_args.bin", tmp_path / "code-ran")  # never loaded
    assert checkpoint_problem(str(run / "checkpoint-2")) is None
    name, damage, problem = DAMAGES[case]
    damage(run / "checkpoint-2" / name, tmp_path / "code-ran")
    assert checkpoint_problem(str(run / "checkpoint-2")) == problem
    assert newest_complete_checkpoint(str(run)) == (str(run / "checkpoint-1"), [("checkpoint-2", problem)])
    assert ck.resume_checkpoint(str(run)) == str(run / "checkpoint-1") and (run / "checkpoint-2").is_dir()
    assert not (tmp_path / "code-ran").exists()


def test_a_damaged_checkpoint_is_refused_by_name_and_skipped_by_a_resume(run, tiny_random_model_path, caplog):
    name, damage, problem = DAMAGES["model-cut"]
    damage(run / "checkpoint-2" / name, None)
    (run / "checkpoint-1" / "stapo_run.json").unlink()  # saved before the record: resumed with one warning
    trainer = _trainer(tiny_random_model_path, run, max_steps=3, learning_rate=5e-4)
    with pytest.raises(ValueError) as raised:
        trainer.train(resume_from_checkpoint=str(run / "checkpoint-2"))
    assert str(raised.value) == (f"resume_from_checkpoint='{run / 'checkpoint-2'}' is not a complete checkpoint "
        f"({problem}). Give a complete checkpoint folder (<output_dir>/checkpoint-<step>), or let a run take its "
        "newest one.")  # fmt: skip
    assert (run / "checkpoint-2").is_dir()  # named by the user: refused, left in place
    trainer.train(resume_from_checkpoint=True)
    assert _resume_lines(caplog) == [f"The newest complete checkpoint is {run / 'checkpoint-1'}: skipped checkpoint-2 "
        f"({problem}) and moved it aside to _damaged-checkpoint-2.",
        f"Resuming training from {run / 'checkpoint-1'}."]  # fmt: skip
    assert [m for m in caplog.messages if "stapo_run.json" in m] == [f"{run / 'checkpoint-1'} has no stapo_run.json "
        "(saved before stapo_trl recorded a run's settings): resumed without comparing the settings it was trained "
        "with to this run's."]  # fmt: skip
    assert trainer.state.global_step == 3 and (run / "_damaged-checkpoint-2" / "trainer_state.json").exists()
    assert get_last_checkpoint(str(run)) == str(run / "checkpoint-3")  # rotation and transformers see whole ones


@pytest.mark.parametrize(
    "changes, expected",
    [
        (dict(s2t_prob_threshold=0.01, learning_rate=5e-4),
         "s2t_prob_threshold 0.002 -> 0.01, learning_rate 1e-06 -> 0.0005"),
        (dict(optim="sgd", weight_decay=0.1), "optim 'adamw_torch_fused' -> 'sgd', weight_decay 0.0 -> 0.1"),
        (dict(reward=text_reward), "reward_funcs ['zero_reward'] -> ['text_reward']"),
        (dict(dataset=PROMPTS.select(range(32))), "train_dataset '{old}' -> '{new}'"),
        (dict(model_init_kwargs={"dtype": "bfloat16"}), "dtype 'float32' -> 'bfloat16'"),
    ],
    ids=["s2t-and-lr", "optimizer", "reward", "dataset", "dtype"],
)  # fmt: skip
def test_a_resume_changing_what_the_run_optimizes_is_refused(run, tiny_random_model_path, caplog, changes, expected):
    trainer = _trainer(tiny_random_model_path, run, max_steps=3, **changes)
    expected = expected.format(old=PROMPTS._fingerprint, new=trainer.run_settings["train_dataset"])
    with pytest.raises(ValueError) as raised:
        trainer.train(resume_from_checkpoint=True)
    assert str(raised.value) == (
        f"{run / 'checkpoint-2'} was trained with other settings ({expected}): resuming would mix two runs in one "
        "model, and its card could state only one. Resume with the checkpoint's values, or train in another "
        f"output_dir (model_name_or_path / model {run / 'checkpoint-2'} starts from its weights)."
    )
    assert not (run / "checkpoint-3").exists() and _resume_lines(caplog) == []


def test_execution_settings_may_change_on_resume_and_a_tied_head_is_no_missing_key(tmp_path, tiny_random_model_path):
    from testing_utils import LogRecords

    trainer = _trainer(tiny_random_model_path, tmp_path, max_steps=2)
    second = _trainer(
        tiny_random_model_path, tmp_path, max_steps=4, logging_steps=2, save_steps=2, per_device_train_batch_size=2,
        gradient_accumulation_steps=2, steps_per_generation=2, dataloader_num_workers=0,
    ).run_settings  # fmt: skip
    assert ck.changed_settings(trainer.run_settings, second) == []
    assert ck.changed_settings({"peft": {"r": 8, "alpha": 16}}, {"peft": {"r": 16, "alpha": 16}}) == ["peft.r 8 -> 16"]
    assert trainer.model.lm_head.weight is trainer.model.model.embed_tokens.weight
    records, logger = LogRecords(), logging.getLogger("transformers.trainer")
    logger.addHandler(handler := records.handler())
    try:
        trainer._issue_warnings_after_load(_IncompatibleKeys(["lm_head.weight", "model.norm.weight"], []))
        config = AutoConfig.from_pretrained(tiny_random_model_path, tie_word_embeddings=False)
        trainer.model = AutoModelForCausalLM.from_config(config)  # untied: its head really is missing
        trainer._issue_warnings_after_load(_IncompatibleKeys(["lm_head.weight"], []))
    finally:
        logger.removeHandler(handler)
    prefix = "There were missing keys in the checkpoint model loaded: "
    assert [r.removeprefix(prefix) for r in records if "missing keys" in r] == [
        "['model.norm.weight'].", "['lm_head.weight']."
    ]  # fmt: skip


class Killed(Exception):
    pass


@pytest.mark.slow  # two runs and a resume per case (in-process kills); the damages: DAMAGES
@pytest.mark.parametrize("where, skipped", [
    ("trainer_state.json", "trainer_state.json unreadable (JSONDecodeError): its save did not finish"),
    ("_save_optimizer_and_scheduler", "no trainer_state.json: its save did not finish"),
    ("_save_rng_state", "no trainer_state.json: its save did not finish"),
    ("rewritten-in-place", "no trainer_state.json: its save did not finish"),  # a fresh run over checkpoint-1
])  # fmt: skip
def test_a_kill_in_a_save_leaves_a_whole_one(tiny_random_model_path, tmp_path, monkeypatch, caplog, where, skipped):
    from testing_utils import read_jsonl

    def killed(self, *args, **kwargs):
        if where == "trainer_state.json":
            text = json.dumps({"global_step": self.global_step, "log_history": self.log_history}, indent=2)
            Path(args[0]).write_text(text[: len(text) // 2])
        raise Killed(where)

    out, in_place = tmp_path / "run", where == "rewritten-in-place"
    _trainer(tiny_random_model_path, out, max_steps=1).train()
    with monkeypatch.context() as patch, pytest.raises(Killed):
        patch.setattr(*(TrainerState, "save_to_json") if where == "trainer_state.json" else (
            Trainer, "_save_rng_state" if in_place else where), killed)  # fmt: skip
        trainer = _trainer(tiny_random_model_path, out, max_steps=2 - in_place)
        trainer.train(resume_from_checkpoint=not in_place or None)
    if in_place:
        assert newest_complete_checkpoint(str(out)) == (None, [("checkpoint-1", skipped)])
        with pytest.raises(ValueError, match="^No complete checkpoint to resume from in output_dir="):
            _trainer(tiny_random_model_path, out, max_steps=2).train(resume_from_checkpoint=True)
        return
    (trainer := _trainer(tiny_random_model_path, out, max_steps=3)).train(resume_from_checkpoint=True)
    assert _resume_lines(caplog)[-2:] == [
        f"The newest complete checkpoint is {out / 'checkpoint-1'}: skipped checkpoint-2 ({skipped}) and moved it "
        "aside to _damaged-checkpoint-2.",
        f"Resuming training from {out / 'checkpoint-1'}.",
    ]
    assert trainer.state.global_step == 3 and [row["step"] for row in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]


HOLDER = (
    "import sys; from stapo_trl.run_folder.checkpoints import hold_run_folder; "
    "hold_run_folder(sys.argv[1]); print('held', flush=True); sys.stdin.read()"
)
SECRET = "hf_" + "kT9wQ2mZ7xV4" * 3  # a token on the holder's command line, never written into a file


def _hold(folder):
    return subprocess.run([sys.executable, "-c", HOLDER, str(folder)], input="", capture_output=True, text=True)


@pytest.fixture
def holder(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "run"), "--hub_token", SECRET],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout.readline() == "held\n"
    yield proc
    proc.kill(), proc.wait()


def _recipe(model_path, out, *extra):
    from testing_utils import STAPO_RECIPE

    return ["--config", STAPO_RECIPE, "--model_name_or_path", model_path, "--eval_before_after", "false",
            "--output_dir", str(out), *extra]  # fmt: skip


def test_holds_nest_within_a_process_and_a_file_system_that_cannot_lock_is_warned_about(tmp_path, monkeypatch, caplog):
    (tmp_path / "scratch").mkdir()
    (run := tmp_path / "run").symlink_to(tmp_path / "scratch")  # clusters link a scratch disk as the run folder
    hold_run_folder(str(run))  # stapo-train's
    hold_run_folder(str(run))  # its trainer's train()
    hold_run_folder(str(run), acquire=False)
    assert (probe := _hold(run)).returncode == 1 and "is in use by another run" in probe.stderr, probe.stderr
    hold_run_folder(str(run), acquire=False)
    assert (probe := _hold(run)).returncode == 0 and probe.stdout == "held\n", probe.stderr
    assert (tmp_path / "scratch" / "_writer.txt").read_text().startswith("pid ")
    monkeypatch.setattr(fcntl, "flock", lambda fd, operation: (_ for _ in ()).throw(OSError(errno.ENOLCK, "No locks "
                                                                                            "available")))  # fmt: skip
    run = tmp_path / "unlocked"
    hold_run_folder(str(run))  # stapo-train's
    hold_run_folder(str(run), trainer="its trainer")  # its train()'s: no second warning
    hold_run_folder(str(run), acquire=False, trainer="its trainer")
    hold_run_folder(str(run), acquire=False)
    assert [r.getMessage() for r in caplog.records if "cannot lock" in r.getMessage()] == [
        f"output_dir={str(run)!r} is on a file system that cannot lock files ([Errno {errno.ENOLCK}] No locks "
        "available): this run writes it without the lock, so a second run writing the same folder would not be "
        "stopped."
    ]
    assert (run / "_writer.txt").read_text().startswith(f"pid {os.getpid()} on ")


def test_a_link_where_a_run_writes_is_refused_and_its_target_kept(run, tmp_path, tiny_random_model_path):
    target, new = tmp_path / "elsewhere.txt", tmp_path / "new"
    target.write_text("precious")
    (new / "checkpoint-1").mkdir(parents=True)
    for name, writer in [("_writer.txt", "hold"), ("_writer.lock", "hold"), ("metrics.jsonl", "hold"),
                         ("checkpoint-1/optimizer.pt", "hold"), ("eval.json", "w"), ("eval.json", "a"),
                         ("eval.json", "wb")]:  # fmt: skip
        (new / name).symlink_to(target)
        with pytest.raises(ValueError) as raised:
            hold_run_folder(str(new)) if writer == "hold" else ck.open_run_file(new / name, writer)
        assert str(raised.value) == (
            f"{new / name} is a symbolic link (to {str(target)!r}): a run writes its files in its folder, never "
            "through a link (it would overwrite the link's target). Remove the link, or give another output_dir."
        )
        (new / name).unlink()
    assert target.read_text() == "precious"
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "checkpoint-3").mkdir(parents=True)
    trainer = _trainer(tiny_random_model_path, run, max_steps=1)
    trainer.state.global_step = 3
    saves = {"config.json": trainer.save_model, "README.md": trainer.create_model_card,
             "train_results.json": lambda: trainer.save_metrics("train", {"train_loss": 0.0}),
             "checkpoint-3": lambda: trainer._save_checkpoint(trainer.model, None)}  # fmt: skip
    for name, save in saves.items():
        if name != "checkpoint-3":
            (elsewhere / name).write_text("precious")
        (run / name).unlink(missing_ok=True)
        (run / name).symlink_to(elsewhere / name)
        with pytest.raises(ValueError, match=rf"^{run / name} is a symbolic link \(to "):
            save()
        (run / name).unlink()
    outside = {p.name: p.read_text() if p.is_file() else sorted(p.iterdir()) for p in elsewhere.iterdir()}
    assert outside == dict.fromkeys(saves, "precious") | {"checkpoint-3": []}


class _Meanwhile(TrainerCallback):
    def __init__(self, action):
        self.action, self.raised = action, None

    def on_step_end(self, args, state, control, **kwargs):
        try:
            self.action() if state.global_step == 1 else None
        except (ValueError, SystemExit) as e:
            self.raised = e


def test_a_folder_in_use_is_refused(holder, tmp_path, tiny_random_model_path, tiny_math_model_path, capsys):
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as excinfo:
        main(_recipe(tiny_math_model_path, run))
    assert excinfo.value.code == 2
    line = error_line(capsys, "stapo-train")
    assert line.startswith(f"stapo-train: error: output_dir={str(run)!r} is in use by another run (pid {holder.pid}")
    with pytest.raises(ValueError) as raised:
        _trainer(tiny_random_model_path, run, max_steps=1).train()
    message = str(raised.value)
    assert message.startswith(f"output_dir={str(run)!r} is in use by another run (pid {holder.pid} on ")
    assert f" on {socket.gethostname()}, since " in message and "--hub_token REDACTED" in message, message
    assert SECRET not in message and "\n" not in message and not (run / "metrics.jsonl").exists()
    holder.kill(), holder.wait()  # SIGKILL: its lock file stays, its hold goes
    assert (run / "_writer.lock").exists()
    command = parse_args(_recipe(tiny_math_model_path, run, "--max_steps", "1"))
    first, second = (_trainer(tiny_random_model_path, run, max_steps=n) for n in (2, 1))
    for callback in (tries := [_Meanwhile(second.train), _Meanwhile(lambda: prepare(*command))]):
        first.add_callback(callback)
    first.train()
    in_use = f"output_dir={str(run)!r} is in use by another run (pid {os.getpid()} on {socket.gethostname()}, since "
    assert first.state.global_step == 2 and [str(c.raised)[: len(in_use)] for c in tries] == [in_use, in_use]


@pytest.mark.parametrize("names, shown", [
    (["README.md", "config.json"], "README.md, config.json"),  # measured: both replaced by the run's
    (["notes.txt", ".nfs0000000001", "slurm-42.out", "_writer.txt"], "notes.txt"),  # the others are not the user's
    ([f"{c}.py" for c in "abcdef"], "a.py, b.py, c.py, d.py and 2 more"),
])  # fmt: skip
def test_a_folder_of_the_users_files_is_refused_or_warned_about(tmp_path, tiny_random_model_path, names, shown):
    [(tmp_path / name).write_text(f"the user's {name}") for name in names]
    what = f"output_dir={str(tmp_path)!r} holds files that are not a run's ({shown}): "
    with pytest.raises(ValueError) as raised:
        ck.check_output_dir(str(tmp_path), refuse_user_files=True)  # stapo-train's
    assert str(raised.value) == what + (
        "a run writes its model, card (README.md), config and checkpoints there, over files of the same names. Give a "
        "new or empty folder, or a run folder."
    )
    with pytest.warns(UserWarning) as caught:
        _trainer(tiny_random_model_path, tmp_path, max_steps=1)
    assert [str(w.message) for w in caught if "not a run's" in str(w.message)] == [
        what + "the trainer writes its model, card (README.md), config and checkpoints there, as GRPOTrainer does, "
        "over files of the same names."
    ]
    (tmp_path / "checkpoint-5").mkdir()
    (tmp_path / "checkpoint-5" / "trainer_state.json").write_text("{}")
    ck.check_output_dir(str(tmp_path), refuse_user_files=True)
    assert [(tmp_path / n).read_text() for n in names] == [f"the user's {n}" for n in names]


@pytest.fixture(params=["under-a-file", "read-only-mount", "read-only-folder"])
def unwritable(request, tmp_path):
    (tmp_path / "a-file").write_text("")
    if request.param == "under-a-file":
        yield tmp_path / "a-file" / "run", "Not a directory"
        return
    (mount := tmp_path / "ro").mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mount)]).returncode != 0:
        pytest.skip("mounting a read-only tmpfs needs root")  # as root, permission bits do not stop a write
    yield (mount / "run" if request.param == "read-only-mount" else mount), "Read-only file system"
    subprocess.run(["umount", "-l", str(mount)], check=True)


def test_an_unwritable_output_dir_is_one_line(unwritable, capsys, tiny_math_model_path, tiny_random_model_path):
    output_dir, cause = unwritable
    expected = f"output_dir={str(output_dir)!r} cannot be written ({cause}): give a folder this process can create "
    with pytest.raises(ValueError) as excinfo:
        _trainer(tiny_random_model_path, output_dir, max_steps=1)
    assert str(excinfo.value) == expected + "files in."
    with pytest.raises(SystemExit) as excinfo:
        main(_recipe(tiny_math_model_path, output_dir))
    assert excinfo.value.code == 2 and error_line(capsys, "stapo-train") == f"stapo-train: error: {expected}files in."


@pytest.mark.parametrize("reward, rows, model", [("math_accuracy", None, None), (zero_reward, [{"q": "1"}], None),
                                                 (zero_reward, None, "not-a-cached-org/model")])  # fmt: skip
def test_a_trainer_refused_at_construction_leaves_no_output_dir_behind(tiny_random_model_path, tmp_path, reward, rows,
                                                                       model):  # fmt: skip
    with pytest.raises((ValueError, OSError)):  # an uncached Hub id: huggingface_hub's own error, offline
        STAPOTrainer(model or tiny_random_model_path, reward, args=tiny_stapo_config(tmp_path / "new" / "run"),
                     train_dataset=Dataset.from_list(rows) if rows else PROMPTS)  # fmt: skip
    assert not (tmp_path / "new").exists()


@pytest.mark.slow  # two processes under accelerate launch (~20 s of imports on 2 cores)
def test_two_processes_on_a_folder_in_use_stop_with_one_line(holder, tmp_path, tiny_math_model_path):
    from testing_utils import REPO, free_port, subprocess_env

    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
    cmd += [str(REPO / "recipes" / "accelerate_configs" / "cpu_2proc.yaml"), "--main_process_port", str(free_port())]
    cmd += ["-m", "stapo_trl.cli.train", *_recipe(tiny_math_model_path, run, "--max_steps", "2")]
    result = subprocess.run(cmd, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "exitcode  : 2 (pid:" in output, output[-3000:]
    lines = [line for line in output.splitlines() if line.startswith("stapo-train: error: ")]
    assert len(lines) == 1 and lines[0].startswith(
        f"stapo-train: error: output_dir={str(run)!r} is in use by another run (pid {holder.pid} on "
    ), output[-3000:]
    assert not (run / "metrics.jsonl").exists()
