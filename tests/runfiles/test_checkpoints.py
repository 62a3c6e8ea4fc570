"""Which checkpoint a run resumes (`stapo_trl.runfiles.checkpoints`) and with which settings
(`stapo_trl.runfiles.run_record`): a checkpoint is complete when every file its save wrote is there and whole; a
damaged newest one is skipped for the newest whole one, named in one line and moved aside; nothing in a checkpoint is
unpickled unsafely; a resume that changes what the run optimizes is refused in one line, from the Python API too.

Each test damages a copy of one real two-checkpoint run of the Python API (tiny random model)."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
from testing_utils import PROMPTS, text_reward, tiny_stapo_config, write_hostile_pickle, zero_reward


def _trainer(model_path, out, reward=zero_reward, dataset=PROMPTS, **overrides):
    from stapo_trl import STAPOTrainer

    settings = dict(max_steps=2, save_strategy="steps", save_steps=1, logging_steps=1) | overrides
    return STAPOTrainer(
        model_path, reward_funcs=reward, args=tiny_stapo_config(out, **settings), train_dataset=dataset
    )


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory, tiny_random_model_path):
    """A finished two-step run of the Python API with checkpoint-1 and checkpoint-2 (each test copies it)."""
    out = tmp_path_factory.mktemp("two-checkpoints") / "run"
    _trainer(tiny_random_model_path, out).train()
    return out


@pytest.fixture
def run(two_checkpoints, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(two_checkpoints, out)
    return out


def _cut(path, fraction=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])


def _resume_lines(caplog):
    return [r.getMessage() for r in caplog.records if "newest complete checkpoint" in r.getMessage()]


def test_each_checkpoint_records_its_files_and_what_the_run_optimizes(run, tiny_random_model_path):
    record = json.loads((run / "checkpoint-2" / "stapo_run.json").read_text())
    files = sorted(p.name for p in (run / "checkpoint-2").iterdir() if p.name != "stapo_run.json")
    assert record["files"] == files and "scheduler.pt" in files and "rng_state.pth" in files
    assert record["save_only_model"] is False
    settings = record["settings"]
    assert settings["trainer"] == "STAPOTrainer" and settings["model"] == tiny_random_model_path
    assert settings["reward_funcs"] == ["zero_reward"] and settings["train_dataset"] == PROMPTS._fingerprint
    assert (settings["s2t_prob_threshold"], settings["s2t_entropy_quantile"], settings["s2t_mode"]) == (
        0.002,
        0.75,
        "low_entropy",
    )
    assert (settings["learning_rate"], settings["optim"], settings["loss_type"], settings["peft"]) == (
        1e-06,
        "adamw_torch_fused",
        "dapo",
        None,
    )
    assert "max_steps" not in settings and "per_device_train_batch_size" not in settings  # execution, not objective


# The damages measured on main: each rerun said "Resuming from checkpoint-2, the newest complete checkpoint", then
# stopped in transformers (SafetensorError, PytorchStreamReader, UnpicklingError), every time; or resumed checkpoint-2
# with a fresh optimizer (no scheduler.pt). Then two more of each kind.
DAMAGES = {
    "model-cut": ("model.safetensors", "model.safetensors cut short: {size} of {full} bytes"),
    "optimizer-cut": ("optimizer.pt", "optimizer.pt damaged: no zip directory (cut short, or overwritten)"),
    "rng-overwritten": ("rng_state.pth", "rng_state.pth damaged: no zip directory (cut short, or overwritten)"),
    "no-scheduler": ("scheduler.pt", "no scheduler.pt: without it transformers resumes with a fresh optimizer"),
    "scheduler-hostile": (
        "scheduler.pt",
        "scheduler.pt refused by a safe load: Trying to load unsupported GLOBAL posix.system whose module posix is "
        "blocked",
    ),
    "config-cut": ("config.json", "config.json unreadable: JSONDecodeError"),
    "no-tokenizer": ("tokenizer.json", "no tokenizer.json, which its save wrote"),
    "no-config": ("config.json", "no config.json, which its save wrote"),
    "model-grown": ("model.safetensors", "model.safetensors damaged: bytes past its tensors"),
}


def _damage(folder, case, marker):
    name = DAMAGES[case][0]
    path = folder / name
    full = path.stat().st_size
    if case.endswith("-cut"):
        _cut(path)
    elif case == "rng-overwritten":
        path.write_bytes(b"overwritten by hand\n")
    elif case.startswith("no-"):
        path.unlink()
    elif case.endswith("-hostile"):
        write_hostile_pickle(path, marker)
    elif case == "model-grown":
        path.write_bytes(path.read_bytes() + b"\0" * 16)
    return DAMAGES[case][1].format(size=full // 2, full=full)


@pytest.mark.parametrize("case", list(DAMAGES))
def test_what_makes_a_checkpoint_incomplete_names_the_file_and_the_damage(run, tmp_path, case):
    from stapo_trl.runfiles.checkpoints import checkpoint_problem, newest_complete_checkpoint

    marker = tmp_path / "code-ran"
    assert checkpoint_problem(str(run / "checkpoint-2")) is None
    problem = _damage(run / "checkpoint-2", case, marker)
    assert checkpoint_problem(str(run / "checkpoint-2")) == problem
    assert newest_complete_checkpoint(str(run)) == (str(run / "checkpoint-1"), [("checkpoint-2", problem)])
    assert not marker.exists()


@pytest.mark.parametrize("case", ["model-cut", "optimizer-cut", "rng-overwritten", "no-scheduler"])
def test_the_python_api_resumes_the_newest_whole_checkpoint_and_moves_the_damaged_one_aside(
    run, tmp_path, tiny_random_model_path, caplog, case
):
    from transformers.trainer_utils import get_last_checkpoint

    problem = _damage(run / "checkpoint-2", case, tmp_path / "code-ran")
    trainer = _trainer(tiny_random_model_path, run, max_steps=3)
    trainer.train(resume_from_checkpoint=True)
    assert _resume_lines(caplog) == [
        f"Resuming training from {run / 'checkpoint-1'}, the newest complete checkpoint; skipped checkpoint-2 "
        f"({problem}) and moved it aside to _damaged-checkpoint-2."
    ]
    assert trainer.state.global_step == 3 and (run / "_damaged-checkpoint-2" / "trainer_state.json").exists()
    assert get_last_checkpoint(str(run)) == str(run / "checkpoint-3")  # rotation and transformers see whole ones


def test_a_damaged_checkpoint_named_by_the_python_api_is_one_line(run, tiny_random_model_path):
    _cut(run / "checkpoint-2" / "model.safetensors")
    with pytest.raises(ValueError) as raised:
        _trainer(tiny_random_model_path, run, max_steps=3).train(resume_from_checkpoint=str(run / "checkpoint-2"))
    assert str(raised.value).startswith(
        f"resume_from_checkpoint='{run / 'checkpoint-2'}' is not a complete checkpoint (model.safetensors cut short: "
    )
    assert (run / "checkpoint-2").is_dir()  # named by the user: refused, left in place


def test_no_file_of_a_checkpoint_is_unpickled_unsafely(run, tmp_path, tiny_random_model_path, caplog):
    """A checkpoint's files with a pickle that would run code: the one nobody reads (training_args.bin) is left alone,
    those transformers loads are refused by the check before it (the checkpoint is skipped); no code runs."""
    marker = tmp_path / "code-ran"
    for checkpoint in ("checkpoint-1", "checkpoint-2"):
        write_hostile_pickle(run / checkpoint / "training_args.bin", marker)
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        write_hostile_pickle(run / "checkpoint-2" / name, marker)
    trainer = _trainer(tiny_random_model_path, run, max_steps=3)
    trainer.train(resume_from_checkpoint=True)
    (line,) = _resume_lines(caplog)
    assert "skipped checkpoint-2 (optimizer.pt refused by a safe load: Trying to load unsupported GLOBAL" in line
    assert trainer.state.global_step == 3 and not marker.exists()


# ---------------------------------------------------------------------------------------------------------------
# The run record: a resume that changes what the run optimizes is refused
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, expected",
    [
        # Measured: other S2T values and learning rate resumed, and the card then stated the new values for the run.
        (
            dict(s2t_prob_threshold=0.01, learning_rate=5e-4),
            "s2t_prob_threshold 0.002 -> 0.01, learning_rate 1e-06 -> 0.0005",
        ),
        (dict(optim="sgd", weight_decay=0.1), "optim 'adamw_torch_fused' -> 'sgd', weight_decay 0.0 -> 0.1"),
        (dict(reward=text_reward), "reward_funcs ['zero_reward'] -> ['text_reward']"),
        (dict(dataset=PROMPTS.select(range(32))), "train_dataset '{old}' -> '{new}'"),
    ],
    ids=["s2t-and-lr", "optimizer", "reward", "dataset"],
)
def test_the_python_api_refuses_a_resume_that_changes_what_the_run_optimizes(
    run, tiny_random_model_path, changes, expected
):
    trainer = _trainer(tiny_random_model_path, run, max_steps=3, **changes)
    expected = expected.format(old=PROMPTS._fingerprint, new=trainer.run_settings["train_dataset"])
    with pytest.raises(ValueError) as raised:
        trainer.train(resume_from_checkpoint=True)
    assert str(raised.value) == (
        f"{run / 'checkpoint-2'} was trained with other settings ({expected}): resuming would mix two runs in one "
        "model, and its card could state only one. Resume with the checkpoint's values, or train in another "
        f"output_dir (model_name_or_path / model {run / 'checkpoint-2'} starts from its weights)."
    )
    assert not (run / "checkpoint-3").exists()


def test_execution_settings_may_change_on_resume(run, tiny_random_model_path):
    """Logging, saving, max_steps and the batch layout (another GPU count: per-device batch x accumulation) are how a
    run is executed, not what it optimizes."""
    trainer = _trainer(
        tiny_random_model_path, run, max_steps=4, logging_steps=2, save_steps=2, per_device_train_batch_size=2,
        gradient_accumulation_steps=2, steps_per_generation=2, dataloader_num_workers=0,
    )  # fmt: skip
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 4


def test_a_checkpoint_saved_before_the_record_resumes_with_one_warning(run, tiny_random_model_path, caplog):
    (run / "checkpoint-2" / "stapo_run.json").unlink()
    trainer = _trainer(tiny_random_model_path, run, max_steps=3, learning_rate=5e-4)
    with caplog.at_level(logging.WARNING):
        trainer.train(resume_from_checkpoint=True)
    lines = [r.getMessage() for r in caplog.records if "stapo_run.json" in r.getMessage()]
    assert lines == [
        f"{run / 'checkpoint-2'} has no stapo_run.json (saved before stapo_trl recorded a run's settings): resumed "
        "without comparing the settings it was trained with to this run's."
    ]
    assert trainer.state.global_step == 3
