"""Resuming a run (`stapo_trl.cli.checkpoints`): a checkpoint trained with other S2T or objective settings, or on
another model, dataset or reward, is refused before the model is built; `resume_from_checkpoint` must name a complete
checkpoint; the newest complete checkpoint is resumed, in one line that names those skipped, before any model."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
from testing_utils import STAPO_RECIPE, addition_rows, error_line, write_jsonl


@pytest.fixture(scope="module")
def one_step_run(tmp_path_factory, tiny_math_model_path):
    """A real one-step `stapo-train` run of the demo recipe that saved checkpoint-1: (its folder, its argv without
    `--output_dir`). Each test resumes a copy of it."""
    from stapo_trl.cli.train import main

    out = tmp_path_factory.mktemp("resume") / "run"
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path]
    argv += ["--max_steps", "1", "--save_steps", "1", "--eval_before_after", "false", "--disable_tqdm", "true"]
    main([*argv, "--output_dir", str(out)])
    assert (out / "checkpoint-1").is_dir()
    return out, argv


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory, tiny_math_model_path):
    """A real two-step `stapo-train` run with checkpoint-1 and checkpoint-2: (its folder, its argv without
    `--output_dir`)."""
    from stapo_trl.cli.train import main

    out = tmp_path_factory.mktemp("resume2") / "run"
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--logging_steps", "1"]
    argv += ["--max_steps", "2", "--save_steps", "1", "--eval_before_after", "false", "--disable_tqdm", "true"]
    main([*argv, "--output_dir", str(out)])
    assert (out / "checkpoint-2").is_dir()
    return out, argv


def _copy_of(run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


@pytest.mark.parametrize(
    "changed, expected",
    [
        (["--s2t_prob_threshold", "0.01"], "s2t_prob_threshold 0.002 -> 0.01"),
        (["--learning_rate", "5e-4", "--s2t_mode", "all_low_prob"], "s2t_mode 'low_entropy' -> 'all_low_prob'"),
        (["--temperature", "0.7"], "temperature 1.0 -> 0.7"),
        # Reported: the README's own-data command, run after `make demo` without its own output_dir, resumed the
        # finished demo run, trained nothing on the user's data and exited 0 with the demo model's accuracy.
        (["--dataset_name", "DATA"], "dataset_name 'builtin:tiny-math' -> 'DATA'"),
        (
            ["--reward_funcs", "math_accuracy", "format"],
            "reward_funcs ['math_accuracy'] -> ['math_accuracy', 'format']",
        ),
        (["--model_name_or_path", "OTHER_MODEL"], "model_name_or_path 'MODEL' -> 'OTHER_MODEL'"),
    ],
    ids=["tau_p", "lr-and-mode", "temperature", "dataset", "reward", "model"],
)
def test_resume_with_other_settings_is_refused_before_the_model(
    one_step_run, tmp_path, no_model_built, tiny_math_model_path, tiny_random_model_path, changed, expected
):
    """A checkpoint trained with other S2T or objective settings, or on another model, dataset or reward, is not
    resumed (the run would mix them and the card would state the new values only)."""
    from stapo_trl.cli.train import main

    run, argv = one_step_run
    out = _copy_of(run, tmp_path)
    data = write_jsonl(tmp_path / "mine.jsonl", addition_rows(8))
    names = {"DATA": data, "OTHER_MODEL": tiny_random_model_path, "MODEL": tiny_math_model_path}
    changed = [names.get(word, word) for word in changed]
    for word, name in names.items():
        expected = expected.replace(f"'{word}'", repr(name))
    card = (out / "README.md").read_text()
    with pytest.raises(SystemExit) as excinfo:
        main([*argv, "--output_dir", str(out), "--max_steps", "2", *changed])
    message = str(excinfo.value)
    assert message.startswith(f"stapo-train: error: {out} holds checkpoint-1, trained with other settings ("), message
    assert expected in message and "Use another output_dir" in message and "\n" not in message, message
    assert (out / "README.md").read_text() == card and not (out / "checkpoint-2").exists()


def test_resume_with_the_same_settings_trains_on(one_step_run, tmp_path):
    """More steps and the same settings resume from the checkpoint (what the refusals above must not catch)."""
    from stapo_trl.cli.train import main

    run, argv = one_step_run
    out = _copy_of(run, tmp_path)
    main([*argv, "--output_dir", str(out), "--max_steps", "2"])
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 2


def _checkpoint(folder, step, *, without=()):
    """A checkpoint folder with the files `Trainer._save_checkpoint` writes (`without` some of them)."""
    folder.mkdir(parents=True)
    for name in {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth"} - set(without):
        (folder / name).write_bytes(b"")
    if "trainer_state.json" not in without:
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return folder


@pytest.mark.parametrize("where", ["nowhere", "a-file", "the-run-folder", "cut-short", "no-optimizer"])
def test_resume_from_checkpoint_must_be_a_complete_checkpoint(no_model_built, tmp_path, capsys, where):
    # Reported: a path that does not exist passed the dry run, and the run raised transformers' ValueError with a
    # traceback (exit 1) after building the model and evaluating it; a checkpoint without optimizer.pt resumed with a
    # fresh optimizer, silently.
    from stapo_trl.cli.dry_run import main as dry_run_main
    from stapo_trl.cli.train import main

    run = tmp_path / "run"
    _checkpoint(run / "checkpoint-4", 4)
    _checkpoint(run / "checkpoint-8", 8, without=["trainer_state.json"])
    _checkpoint(run / "checkpoint-12", 12, without=["optimizer.pt"])
    (tmp_path / "a-file").write_text("not a checkpoint")
    path = {"nowhere": tmp_path / "nowhere", "a-file": tmp_path / "a-file", "the-run-folder": run}.get(where)
    path = path or run / {"cut-short": "checkpoint-8", "no-optimizer": "checkpoint-12"}[where]
    expected = {"nowhere": "does not exist", "a-file": "is a file", "the-run-folder": "give one of its checkpoints"}
    expected |= {"cut-short": "is not a complete checkpoint (no trainer_state.json: its save did not finish)"}
    expected |= {"no-optimizer": "is not a complete checkpoint (no optimizer state (optimizer.pt))"}
    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), "--resume_from_checkpoint", str(path)]
    assert dry_run_main(argv) == 2
    assert expected[where] in error_line(capsys, "stapo-train --dry-run")
    with pytest.raises(SystemExit) as excinfo:
        main(argv)
    assert excinfo.value.code == 2
    line = error_line(capsys, "stapo-train")
    assert line.startswith(f"stapo-train: error: resume_from_checkpoint='{path}' ") and expected[where] in line, line
    if where == "the-run-folder":
        assert "(checkpoint-4)" in line
    # A complete checkpoint passes this check (the run then resumes it).
    from stapo_trl.cli.checkpoints import check_resume_from_checkpoint

    check_resume_from_checkpoint(
        SimpleNamespace(resume_from_checkpoint=str(run / "checkpoint-4"), save_only_model=False)
    )


@pytest.mark.parametrize("damage", ["no-trainer-state", "empty-stray", "no-rng-state"])
def test_stapo_train_resumes_the_newest_complete_checkpoint_in_one_line_before_the_model(
    two_step_run, tmp_path, no_model_built, caplog, damage
):
    # Reported: each rerun took the highest-numbered folder (a save cut short by a kill or a full disk, an empty
    # checkpoint-999/) and died after the model was built and evaluated; the complete checkpoint beside it was unused.
    from stapo_trl.cli.train import main

    run, argv = two_step_run
    out = _copy_of(run, tmp_path)
    if damage == "empty-stray":
        (out / "checkpoint-999").mkdir()
        skipped = "checkpoint-999 (empty)"
    else:
        (out / "checkpoint-2" / ("trainer_state.json" if damage == "no-trainer-state" else "rng_state.pth")).unlink()
        skipped = (
            "checkpoint-2 ("
            + (
                "no trainer_state.json: its save did not finish"
                if damage == "no-trainer-state"
                else "no RNG state (rng_state.pth)"
            )
            + ")"
        )
    newest = out / ("checkpoint-2" if damage == "empty-stray" else "checkpoint-1")
    with pytest.raises(AssertionError, match="a trainer was constructed"):  # the line comes before any model
        main([*argv, "--output_dir", str(out), "--max_steps", "3"])
    lines = [r.getMessage() for r in caplog.records if "Resuming training" in r.getMessage()]
    assert lines == [f"Resuming training from {newest}, the newest complete checkpoint; skipped {skipped}."]


def test_an_unreadable_training_args_bin_is_said_in_one_line(one_step_run, tmp_path, no_model_built, caplog):
    # Reported: an unreadable training_args.bin silently turned off the check against other S2T settings.
    from stapo_trl.cli.train import main

    run, argv = one_step_run
    out = _copy_of(run, tmp_path)
    (out / "checkpoint-1" / "training_args.bin").write_bytes(b"not a pickle")
    with pytest.raises(AssertionError, match="a trainer was constructed"):
        main([*argv, "--output_dir", str(out), "--max_steps", "2"])
    (line,) = [r.getMessage() for r in caplog.records if "training_args.bin cannot be read" in r.getMessage()]
    assert line.startswith(f"{out / 'checkpoint-1'}/training_args.bin cannot be read (UnpicklingError: ")
    assert line.endswith("the S2T and objective settings of this run are not compared with those it was trained with.")
