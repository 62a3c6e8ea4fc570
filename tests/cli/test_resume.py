"""Resuming `stapo-train`: other settings refused before the model, the newest complete checkpoint, no code run."""

import json
import shutil
from pathlib import Path

import pytest
from testing_utils import STAPO_RECIPE, addition_rows, error_line, write_hostile_pickle, write_jsonl

from stapo_trl.cli.dry_run import main as dry_run_main
from stapo_trl.cli.train import interrupted_line, main
from stapo_trl.run_folder.checkpoints import check_checkpoint


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory, tiny_math_model_path):  # checkpoint-1 and -2, data with a second answer column
    folder = tmp_path_factory.mktemp("resume")
    data = write_jsonl(folder / "data.jsonl", [row | {"answer2": "0"} for row in addition_rows(8)])
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--dataset_name", data]
    argv += ["--logging_steps", "1", "--max_steps", "2", "--save_steps", "1", "--eval_before_after", "false"]
    argv += ["--s2t_write_run_files", "false", "--disable_tqdm", "true"]  # why: no run files, so no figures
    main([*argv, "--output_dir", str(folder / "run")])
    return folder / "run", argv


@pytest.fixture
def run_copy(two_step_run, tmp_path):
    return shutil.copytree(two_step_run[0], tmp_path / "run"), two_step_run[1]


def _files(folder):  # the run folder's files but its writer's record
    return {
        p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and not p.is_symlink() and "_writer" not in p.name
    }


SETTINGS = "{out}/checkpoint-1 was trained with other settings ("
HOLDS = "output_dir='{out}' holds a trained model (%s) but no complete checkpoint to resume"


@pytest.mark.parametrize("change, expected", [
        (["--learning_rate", "2e-4"], SETTINGS + "learning_rate 0.0001 -> 0.0002"),
        (["--learning_rate", "5e-4", "--s2t_mode", "all_low_prob"],
         SETTINGS + "s2t_mode 'low_entropy' -> 'all_low_prob', learning_rate 0.0001 -> 0.0005"),
        (["--dataset_name", "{tmp}/mine.jsonl"], SETTINGS + "dataset_name '{data}' -> '{tmp}/mine.jsonl'"),
        (["--reward_funcs", "math_accuracy", "format"],
         SETTINGS + "reward_funcs ['math_accuracy_reward'] -> ['math_accuracy_reward', 'format_reward']"),
        (["--model_name_or_path", "{other}"], SETTINGS + "model '{model}' -> '{other}'"),
        (["--use_peft", "true"], SETTINGS + "peft None -> {{"),
        (["--dtype", "bfloat16"], SETTINGS + "dtype 'float32' -> 'bfloat16'"),  # a float32 run saved in bfloat16
        (["--instruction", ""], SETTINGS + "instruction 'Please reason step by step, and put your final answer "),
        (["--solution_column", "answer2"], SETTINGS + "solution_column 'answer' -> 'answer2'"),
        (["rewrite"], SETTINGS + "dataset_sha256 '"),  # the run's own file, other rows under the same path
        (["--prompt_column", "answer"], SETTINGS + "prompt_column 'problem' -> 'answer'"),
        (["--max_train_samples", "8"], SETTINGS + "max_train_samples None -> 8"),
        (["damaged", "--learning_rate", "2e-4"], SETTINGS + "learning_rate 0.0001 -> 0.0002"),
        (["--dataset_name", "{tmp}/gone.jsonl"], "Dataset file '{tmp}/gone.jsonl' does not exist."),
        (["--dataset_name", "{tmp}/gone"], "Dataset folder '{tmp}/gone' does not exist."),
        (["--dataset_name", "{tmp}/gone.jsonl", "--resume_from_checkpoint", "{out}/checkpoint-1"],
         "Dataset file '{tmp}/gone.jsonl' does not exist."),
        (["link", "README.md"], "{out}/README.md is a symbolic link (to "),
        (["link", "checkpoint-1/config.json"], "{out}/checkpoint-1/config.json is a symbolic link (to "),
        (["cut"], HOLDS % "model.safetensors"),
        (["no-checkpoint"], HOLDS % "model.safetensors"),
        (["adapter"], HOLDS % "adapter_model.safetensors"),  # a LoRA run's folder holds its adapter
])  # fmt: skip
def test_a_resume_that_cannot_work_is_one_line_before_the_data_and_the_model(
    run_copy, tmp_path, no_model_built, monkeypatch, capsys, caplog, tiny_math_model_path, tiny_random_model_path,
    change, expected,
):  # fmt: skip
    monkeypatch.setattr("stapo_trl.cli.prepare.load_prompt_dataset", lambda *a, **k: pytest.fail("dataset read first"))
    out, argv = run_copy
    data = Path(argv[argv.index("--dataset_name") + 1])
    fill = dict(tmp=tmp_path, out=out, data=data, model=tiny_math_model_path, other=tiny_random_model_path)
    write_jsonl(tmp_path / "mine.jsonl", addition_rows(8))
    action, *change = change if not change[0].startswith("--") else ["", *change]
    if action == "damaged":
        (out / "checkpoint-2" / "trainer_state.json").unlink()
        (out / "checkpoint-999").mkdir()
    else:
        shutil.rmtree(out / "checkpoint-2")
    original, weights = data.read_bytes(), "adapter_model.safetensors" if action == "adapter" else "model.safetensors"
    if action == "rewrite":  # put back afterwards
        write_jsonl(data, [row | {"answer2": "1"} for row in addition_rows(8)])
    elif action == "link":
        (out / change[0]).unlink()
        (out / change.pop()).symlink_to(tmp_path / "a-file-of-the-user")
    elif action == "cut":
        (out / "checkpoint-1" / weights).write_bytes((out / "checkpoint-1" / weights).read_bytes()[:20_000])
    elif action in ("no-checkpoint", "adapter"):
        shutil.rmtree(out / "checkpoint-1")
        (out / "model.safetensors").rename(out / weights)
    files = _files(out)
    try:
        with pytest.raises(SystemExit) as excinfo:
            main([*argv, "--output_dir", str(out), "--max_steps", "2", *(a.format(**fill) for a in change)])
    finally:
        data.write_bytes(original)
    line = error_line(capsys, "stapo-train")
    assert excinfo.value.code == 2 and line.startswith(f"stapo-train: error: {expected.format(**fill)}"), line
    assert "Resume with the checkpoint's values" in line or "other settings" not in line, line
    assert "Resuming" not in caplog.text  # said only once every check has passed
    if action == "damaged":
        assert caplog.messages == [
            f"The newest complete checkpoint is {out / 'checkpoint-1'}: skipped checkpoint-999 (empty) and moved it "
            "aside to _damaged-checkpoint-999, checkpoint-2 (no trainer_state.json: its save did not finish) and "
            "moved it aside to _damaged-checkpoint-2."
        ]
        names = sorted(p.name for p in out.glob("*checkpoint-*"))
        assert names == ["_damaged-checkpoint-2", "_damaged-checkpoint-999", "checkpoint-1"]
    elif action == "cut":  # the damaged checkpoint moved aside, the model left as it was
        prefix = f"No complete checkpoint to resume in {out}: skipped checkpoint-1 (model.safetensors"
        assert [m[: len(prefix)] for m in caplog.messages if "No complete checkpoint" in m] == [prefix]
        assert (out / weights).read_bytes() == files[out / weights]
    else:  # nothing in the run folder changed
        assert _files(out) == files


@pytest.mark.slow  # trains a step (~2 s); the settings rule: tests/run_folder/test_checkpoints.py, in-process
def test_resume_with_other_execution_settings_trains_on(run_copy):
    out, argv = run_copy
    main([*argv, "--output_dir", str(out), "--max_steps", "3", "--logging_steps", "2", "--save_steps", "5",
          "--torch_num_threads", "1", "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2",
          "--steps_per_generation", "8"])  # fmt: skip
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 3


@pytest.mark.parametrize("where, expected", [
        ("nowhere", "does not exist"), ("a-file", "is a file"), ("run", "give one of its checkpoints (checkpoint-4)"),
        ("run/checkpoint-8", "is not a complete checkpoint (no trainer_state.json: its save did not finish)"),
        ("run/checkpoint-12", "is not a complete checkpoint (no optimizer state (optimizer.pt))"),
])  # fmt: skip
def test_resume_from_checkpoint_must_be_a_complete_checkpoint(run_copy, no_model_built, tmp_path, capsys, where,
                                                              expected):  # fmt: skip
    run = tmp_path / "run"
    for step, gone in ((4, None), (8, "trainer_state.json"), (12, "optimizer.pt")):  # copies of checkpoint-1
        state = shutil.copytree(run / "checkpoint-1", run / f"checkpoint-{step}") / "trainer_state.json"
        state.write_text(json.dumps(json.loads(state.read_text()) | {"global_step": step}))  # a state says its step
        if gone:
            (run / f"checkpoint-{step}" / gone).unlink()
    (tmp_path / "a-file").write_text("not a checkpoint")
    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), "--resume_from_checkpoint"]
    argv += [str(tmp_path / where), "--max_train_samples", "64"]  # why: the dry run goes on to count the prompts
    assert dry_run_main(argv) == 2 and expected in error_line(capsys, "stapo-train --dry-run")
    with pytest.raises(SystemExit) as excinfo:
        main(argv)
    assert excinfo.value.code == 2
    line = error_line(capsys, "stapo-train")
    assert line.startswith(f"stapo-train: error: resume_from_checkpoint='{tmp_path / where}' ") and expected in line
    check_checkpoint(str(run / "checkpoint-4"), "resume_from_checkpoint")  # a complete one passes (and resumes)


def test_a_hostile_training_args_bin_runs_no_code_on_resume_from_checkpoint(run_copy, tmp_path, no_model_built):
    out, argv = run_copy
    marker = tmp_path / "code-ran"
    write_hostile_pickle(out / "checkpoint-1" / "training_args.bin", marker)
    argv = [*argv, "--output_dir", str(tmp_path / "new"), "--resume_from_checkpoint", str(out / "checkpoint-1")]
    with pytest.raises(AssertionError, match="a trainer was constructed"):
        main([*argv, "--max_steps", "2"])
    assert not marker.exists()


def test_an_interrupt_outside_a_stop_signals_save_tells_what_was_saved(run_copy, tmp_path):
    out, argv = run_copy
    argv = [*argv, "--output_dir", str(out)]
    resume = f"Resume with the same command: stapo-train {' '.join(argv)}"
    saved = f"stapo-train: interrupted: checkpoint saved to {out / 'checkpoint-2'}. {resume}"
    assert interrupted_line(argv, str(out), checkpoint=None) == saved  # this run saved it (a second Ctrl-C)
    assert interrupted_line(argv, str(out), checkpoint=str(out / "checkpoint-1")) == saved  # a resumed run saved it
    before = f"stapo-train: interrupted: nothing saved by this run; the newest checkpoint is {out / 'checkpoint-2'}."
    assert interrupted_line(argv, str(out), checkpoint=str(out / "checkpoint-2")) == f"{before} {resume}"
    assert interrupted_line(argv, str(out)) == f"{before} {resume}"  # before the run chose its checkpoint
    for output_dir in (None, str(tmp_path / "new")):  # before the arguments were read; a new folder
        assert interrupted_line(argv, output_dir, checkpoint=None) == "stapo-train: interrupted: nothing saved."
