"""Resuming a run (`stapo_trl.cli.checkpoints`): a checkpoint trained with other S2T or objective settings is refused
before the model is built, and `resume_from_checkpoint` must name a checkpoint folder."""

from __future__ import annotations

import json
import shutil

import pytest
from testing_utils import STAPO_RECIPE, error_line


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
    ],
    ids=["tau_p", "lr-and-mode", "temperature"],
)
def test_resume_with_other_settings_is_refused_before_the_model(
    one_step_run, tmp_path, no_model_built, changed, expected
):
    """A checkpoint trained with other S2T or objective settings is not resumed (the run would mix them and the card
    would state the new values only)."""
    from stapo_trl.cli.train import main

    run, argv = one_step_run
    out = _copy_of(run, tmp_path)
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


@pytest.mark.parametrize("where", ["nowhere", "a-file", "the-run-folder"])
def test_resume_from_checkpoint_must_be_a_checkpoint(no_model_built, tmp_path, capsys, where):
    # Reported: a path that does not exist passed the dry run, and the run raised transformers' ValueError with a
    # traceback (exit 1) after building the model and evaluating it.
    from stapo_trl.cli.dry_run import main as dry_run_main
    from stapo_trl.cli.train import main

    run = tmp_path / "run"
    (run / "checkpoint-4").mkdir(parents=True)
    (run / "checkpoint-4" / "trainer_state.json").write_text('{"global_step": 4}')
    (tmp_path / "a-file").write_text("not a checkpoint")
    path = {"nowhere": tmp_path / "nowhere", "a-file": tmp_path / "a-file", "the-run-folder": run}[where]
    expected = {"nowhere": "does not exist", "a-file": "is a file", "the-run-folder": "give one of its checkpoints"}
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
    # A checkpoint folder passes this check (the run then resumes it).
    from stapo_trl.cli.checkpoints import check_resume_from_checkpoint

    check_resume_from_checkpoint(type("Args", (), {"resume_from_checkpoint": str(run / "checkpoint-4")})())
