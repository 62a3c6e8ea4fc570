"""Input errors of every command: exit status 2 and one line, written in one piece, naming what the user wrote."""

from __future__ import annotations

import errno
import signal
import sys

import pytest
from safetensors import SafetensorError
from testing_utils import GRPO_RECIPE, STAPO_RECIPE, error_line, write_metrics_run, write_recipe
from transformers import Trainer

from stapo_trl.cli import eval as stapo_eval
from stapo_trl.cli import plot as stapo_plot
from stapo_trl.cli import train as stapo_train
from stapo_trl.cli.args import parse_args
from stapo_trl.cli.callbacks import SaveOnSignal
from stapo_trl.cli.dry_run import main as dry_run_main
from stapo_trl.cli.errors import InputError, full_disk_in_one_line
from stapo_trl.run_folder.logs import MetricsLogCallback


_train, _eval, _plot = stapo_train.main, stapo_eval.main, stapo_plot.main


def _dry_run(argv):
    stapo_train.main([*argv, "--dry-run"])


PROGS = {_train: "stapo-train", _dry_run: "stapo-train --dry-run", _eval: "stapo-eval", _plot: "stapo-plot"}


@pytest.mark.parametrize("command, argv, expected", [
        # The reported case: a range error exited 1 while type and choice errors exit 2.
        (_train, ["--s2t_entropy_quantile", "1.5"], "s2t_entropy_quantile=1.5 must be in [0, 1]"),
        (_train, ["--s2t_entropy_quantile", "abc"], "invalid float value: 'abc'"),
        (_eval, ["--model", "m", "--samples", "0"], "--samples must be >= 1"),
        (_eval, ["--model", "m", "--gpu-memory-utilization", "1.5"], "must be in (0, 1]"),
        (_plot, ["{tmp}/no-run"], "No metrics.jsonl in"),
        (_plot, ["{run}", "--labels", "a", "b"], "--labels: got 2 label(s) for 1 OUTPUT_DIR(s)"),
        (_plot, ["{run}", "--smoothing", "0"], "--smoothing 0: the moving-average window"),
        # A range error in a flag read "the recipe does not parse: X=..." in the dry run, naming no flag in either.
        (_train, ["--temperature", "-1"], "error: --temperature: temperature="),
        (_dry_run, ["--s2t_entropy_quantile", "1.5"], "error: --s2t_entropy_quantile: s2t_entropy_quantile="),
        (_dry_run, ["--temperature", "-1"], "error: --temperature: temperature="),
        # argparse took `-1e-4` for an option: "--learning_rate: expected one argument" (reported: the first).
        (_train, ["--learning_rate", "-1e-4"], "error: --learning_rate: learning_rate=-0.0001 must be >= 0"),
        (_train, ["--temperature", "-5E-1"], "error: --temperature: temperature=-0.5 must be > 0"),
        (_train, ["--s2t_entropy_quantile", "-2.5e+0"], "error: --s2t_entropy_quantile: s2t_entropy_quantile=-2.5 "),
        # What the user gave is what the message names: `--config /tmp` said "does not exist".
        (_train, ["--config", "{tmp}"], "is a folder: give the path of a recipe YAML file in it"),
        (_dry_run, ["--config", "{tmp}"], "is a folder"),
        (_train, ["compare", GRPO_RECIPE, STAPO_RECIPE], "`stapo-train compare` is gone: train each"),
], ids=["train-range", "train-type", "eval-samples", "eval-memory-share", "plot-no-run",
        "plot-labels", "plot-smoothing", "flag-range", "dry-run-flag-range", "dry-run-flag-range-2", "exponent",
        "exponent-upper", "exponent-plus", "config-folder", "dry-run-config-folder", "compare-is-gone"])  # fmt: skip
def test_every_input_error_exits_2_with_one_line(no_model_built, tmp_path, capsys, command, argv, expected):
    run = write_metrics_run(tmp_path / "run")
    argv = [a.format(tmp=tmp_path, run=run) for a in argv]
    if command in (_train, _dry_run) and "--config" not in argv and argv[0] != "compare":
        argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), *argv]
    with pytest.raises(SystemExit) as excinfo:
        command(argv)
    assert excinfo.value.code == 2
    assert expected in error_line(capsys, PROGS[command])


class _WriteRecorder:
    def __init__(self):
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def _ctrl_c(argv):
    SaveOnSignal()._handle(signal.SIGINT, None)


@pytest.mark.parametrize("command, argv, expected", [
        # The reported case (CI, two ranks under accelerate launch): the ranks' error lines ran into each other.
        (_train, ["--s2t_entropy_quantile", "1.5"], "stapo-train: error: --s2t_entropy_quantile:"),
        (_dry_run, ["--max_train_samples", "3"], "stapo-train --dry-run: error: 1 check(s) failed"),
        (_plot, ["{tmp}/no-run"], "stapo-plot: error: No metrics.jsonl in"),
        (_ctrl_c, [], "Ctrl-C: saving a checkpoint at the end of this step"),
], ids=["train-range", "dry-run-checks", "plot-no-run", "ctrl-c"])  # fmt: skip
def test_a_message_line_is_one_write_so_processes_cannot_interleave_it(
    no_model_built, tmp_path, monkeypatch, command, argv, expected
):
    argv = [a.format(tmp=tmp_path) for a in argv]
    if command in (_train, _dry_run):
        argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), *argv]
    stderr = _WriteRecorder()
    monkeypatch.setattr(sys, "stderr", stderr)
    try:
        command(argv)
    except SystemExit as e:
        assert e.code == 2
    lines = [w for w in stderr.writes if expected in w]
    assert len(lines) == 1, stderr.writes
    assert lines[0].endswith("\n") and lines[0].count("\n") == 1, stderr.writes


def test_help_of_every_command_states_the_exit_status(capsys):
    expected = "Exit status: 0 on success; 2 on an input error"
    for command, argv in ((_train, ["--help"]), (_eval, ["--help"]), (_plot, ["--help"])):
        with pytest.raises(SystemExit) as excinfo:
            command(argv)
        assert excinfo.value.code == 0
        assert expected in " ".join(capsys.readouterr().out.split()), command.__name__
    assert dry_run_main(["--help"]) == 0
    assert expected in " ".join(capsys.readouterr().out.split())


KEY = "recipe key {key} in {recipe}: "
FIX = " Fix the value in the recipe, or override it on the command line with --{key}."


@pytest.mark.parametrize(
    "line, message",
    [
        # The reported case: argparse converts the recipe's string and reported `--s2t_entropy_quantile`.
        ("s2t_entropy_quantile: abc", KEY + "invalid float value: 'abc' (s2t_entropy_quantile takes a number)." + FIX),
        ("s2t_entropy_quantile: 1.5", KEY + "s2t_entropy_quantile=1.5 must be in [0, 1]; the paper: 0.75." + FIX),
        # a choice argparse never checks for a recipe value: transformers' "cosinus is not a valid SchedulerType"
        ("lr_scheduler_type: cosinus", KEY + "lr_scheduler_type='cosinus' is not one of 'linear', 'cosine', "),
        ("lerning_rate: 1.0e-4", "Unknown key(s) in recipe {recipe}: lerning_rate: did you mean learning_rate"),
        # a YAML float for an integer field reached the divisibility check: "num_generations=8.5 does not divide"
        ("num_generations: 8.5", KEY + "num_generations=8.5 is not an integer." + FIX),
        # YAML reads an unquoted `off` as false
        ("s2t_mode: off", KEY + "s2t_mode=False is not one of 'low_entropy', "),
        # failed only when the trainer was built, after the model: "tensorbord is not supported, only ..."
        ("report_to: tensorbord", KEY + "report_to='tensorbord': tensorbord is not supported, only azure_ml, "),
        # failed only in the optimizer, after the model and the first evaluation: "Invalid learning rate: -1"
        ("learning_rate: -1", KEY + "learning_rate=-1 must be >= 0"),
        # a YAML mapping for an integer field: "TypeError: '<' not supported between 'dict' and 'int'"
        ("max_steps: {steps: 10}", KEY + "max_steps={'steps': 10} is not an integer." + FIX),
        ("trainer: stapoo", KEY + "trainer='stapoo' is not one of 'stapo', 'grpo'." + FIX),
    ],
    ids=["type", "range", "choice", "unknown-key", "float-for-int", "unquoted-off", "report-to",
         "negative-learning-rate", "mapping-for-int", "trainer"],
)  # fmt: skip
def test_recipe_value_errors_name_the_recipe_key_and_the_file(no_model_built, tmp_path, capsys, line, message):
    recipe = write_recipe(tmp_path, line)
    with pytest.raises(SystemExit) as excinfo:
        _train(["--config", recipe, "--output_dir", str(tmp_path / "out")])
    assert excinfo.value.code == 2
    line_printed = error_line(capsys, "stapo-train")
    expected = "stapo-train: error: " + message.replace("{key}", line.split(":")[0]).replace("{recipe}", recipe)
    assert line_printed.startswith(expected), line_printed
    assert "YAML reads an unquoted off/on/no/yes as false/true: quote it" in line_printed or "off" not in line


def test_a_command_line_value_is_named_as_the_flag_not_the_recipe(no_model_built, tmp_path, capsys):
    recipe = write_recipe(tmp_path, "s2t_entropy_quantile: 0.5")
    with pytest.raises(SystemExit):
        _train(["--config", recipe, "--s2t_entropy_quantile", "abc"])
    message = error_line(capsys, "stapo-train")
    assert message.startswith("stapo-train: error: --s2t_entropy_quantile: invalid float value: 'abc'"), message
    assert "stapo-train --help" in message and "recipe" not in message, message
    bad = write_recipe(tmp_path, "s2t_entropy_quantile: abc\nnum_generations: 8.5")
    _, training_args, _ = parse_args(
        ["--config", bad, "--s2t_entropy_quantile", "0.5", "--num_generations", "8", "--output_dir", str(tmp_path)]
    )
    assert training_args.s2t_entropy_quantile == 0.5 and training_args.num_generations == 8


@pytest.mark.parametrize("argv, expected", [
        (["--dataset_name", "{empty}"], "dataset file '{empty}' is empty"),
        (["--model_name_or_path", "{tmp}/no-model"], "Model directory '{tmp}/no-model' does not exist"),
        (["--reward_funcs", "math_acuracy"], "Unknown reward 'math_acuracy'"),
], ids=["empty-dataset", "missing-model", "unknown-reward"])  # fmt: skip
def test_a_dry_run_that_fails_its_checks_ends_with_one_error_line(no_model_built, tmp_path, capsys, argv, expected):
    # The plan listed the failed checks on stdout only: no `PROG: error:` line, unlike every other input error.
    (tmp_path / "empty.jsonl").write_text("")
    fill = {"tmp": tmp_path, "empty": tmp_path / "empty.jsonl"}
    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), *(a.format(**fill) for a in argv)]
    assert dry_run_main([*argv, "--max_train_samples", "64"]) == 2
    line = error_line(capsys, "stapo-train --dry-run")
    assert "check(s) failed (the plan above lists them)" in line and expected.format(**fill) in line, line


def test_a_full_disk_is_one_line_naming_the_folder_and_what_a_rerun_resumes(tmp_path):
    for error, cause in [
        (OSError(errno.ENOSPC, "No space left on device"), "OSError: [Errno 28] No space left on device"),
        (SafetensorError("I/O error: No space left on device (os error 28)"), "SafetensorError: I/O error: No space"),
    ]:
        with pytest.raises(InputError) as raised, full_disk_in_one_line("stapo-train", str(tmp_path)):
            raise error
        assert raised.value.code == 1 and str(raised.value).startswith(
            f"stapo-train: error: no space left on the disk of output_dir={str(tmp_path)!r} ({cause}"
        )
        assert str(raised.value).endswith(
            "rerun the same command: it resumes from the start (no complete checkpoint)."
        )
    with pytest.raises(OSError, match="Permission denied"), full_disk_in_one_line("stapo-train", str(tmp_path)):
        raise OSError(errno.EACCES, "Permission denied")  # another failure keeps its traceback


@pytest.mark.slow  # trains, fails, trains again; the line alone: the test above
@pytest.mark.parametrize("where", ["metrics-write", "safetensors-save"])
def test_a_full_disk_ends_the_run_with_one_line_and_the_rerun_resumes(
    tmp_path, tiny_math_model_path, monkeypatch, capsys, caplog, where
):
    # Reported: a 38-line traceback ending in `OSError: [Errno 28]`, and no line naming the folder.
    out = tmp_path / "disk" / "run"
    (tmp_path / "disk").mkdir()
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--output_dir", str(out)]
    argv += ["--max_steps", "3", "--save_steps", "1", "--logging_steps", "1", "--eval_before_after", "false"]
    argv += ["--disable_tqdm", "true", "--save_total_limit", "5"]
    full = OSError(errno.ENOSPC, "No space left on device")
    if where == "safetensors-save":
        full = SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    method, owner = ("write_rows", MetricsLogCallback) if where == "metrics-write" else ("save_model", Trainer)
    original, calls = getattr(owner, method), []

    def full_at_the_second(self, *args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise full
        return original(self, *args, **kwargs)

    monkeypatch.setattr(owner, method, full_at_the_second)
    with pytest.raises(SystemExit) as excinfo:
        _train(argv)
    assert excinfo.value.code == 1
    line = error_line(capsys, "stapo-train")
    assert line.startswith(f"stapo-train: error: no space left on the disk of output_dir={str(out)!r} ("), line
    assert line.endswith(f"rerun the same command: it resumes from {out / 'checkpoint-1'}."), line
    monkeypatch.undo()
    _train(argv)
    assert f"Resuming training from {out / 'checkpoint-1'}." in caplog.text
