"""Input errors of every command (issue 23): one convention for the exit status (2, argparse's, for every input error;
1 for a failure during a run), one line that names what the user wrote, the allowed values and the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[1]
STAPO_RECIPE = str(REPO / "recipes" / "demo" / "stapo.yaml")
GRPO_RECIPE = str(REPO / "recipes" / "demo" / "grpo.yaml")


def _error_line(capsys, prog: str) -> str:
    """The one `PROG: error: ...` line the command printed on stderr (and that it is the only error line)."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{prog}: error: "), err
    assert err.rstrip("\n").endswith(lines[0]), err  # the last thing printed: nothing after it
    return lines[0]


def _metrics_run(folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"step": s, "reward": 0.1 * s, "entropy": 0.5} for s in (1, 2, 3)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(folder)


# ---------------------------------------------------------------------------------------------------------------
# Item 1: exit status 2 for every input error, in every command
# ---------------------------------------------------------------------------------------------------------------


def _train(argv):
    from stapo_trl.cli.train import main

    main(argv)


def _compare(argv):
    from stapo_trl.cli.train import main

    main(["compare", *argv])


def _dry_run(argv):
    from stapo_trl.cli.train import main

    main([*argv, "--dry-run"])


def _eval(argv):
    from stapo_trl.cli.eval import main

    main(argv)


def _plot(argv):
    from stapo_trl.cli.plot import main

    main(argv)


@pytest.mark.parametrize(
    "command, prog, argv, expected",
    [
        # The reported case: a range error exited 1 while type and choice errors exit 2.
        (_train, "stapo-train", ["--s2t_entropy_quantile", "1.5"], "s2t_entropy_quantile=1.5 must be in [0, 1]"),
        (_train, "stapo-train", ["--s2t_entropy_quantile", "abc"], "invalid float value: 'abc'"),
        (_train, "stapo-train", ["--lerning_rate", "1e-4"], "lerning_rate: did you mean learning_rate"),
        (_train, "stapo-train", ["--max_steps", "0"], "max_steps=0 is not a number of optimizer steps"),
        (_dry_run, "stapo-train --dry-run", ["--s2t_entropy_quantile", "1.5"], "s2t_entropy_quantile=1.5"),
        (_compare, "stapo-train compare", [GRPO_RECIPE, "--", "--max_steps", "0"], "max_steps=0 is not a number"),
        (_compare, "stapo-train compare", [GRPO_RECIPE, "--seeds", "0", "0"], "seed(s) 0 given twice"),
        (_eval, "stapo-eval", ["--model", "m", "--samples", "0"], "--samples must be >= 1"),
        (_eval, "stapo-eval", ["--model", "m", "--gpu-memory-utilization", "1.5"], "must be in (0, 1]"),
        (_plot, "stapo-plot", ["{tmp}/no-run"], "No metrics.jsonl in"),
        (_plot, "stapo-plot", ["{run}", "--labels", "a", "b"], "--labels: got 2 label(s) for 1 OUTPUT_DIR(s)"),
        (_plot, "stapo-plot", ["{run}", "--smoothing", "0"], "--smoothing 0: the moving-average window"),
    ],
    ids=[
        "train-range",
        "train-type",
        "train-unknown-key",
        "train-max-steps",
        "dry-run-range",
        "compare-override-range",
        "compare-repeated-seed",
        "eval-samples",
        "eval-memory-share",
        "plot-no-run",
        "plot-labels",
        "plot-smoothing",
    ],
)
def test_every_input_error_exits_2_with_one_line(no_model_built, tmp_path, capsys, command, prog, argv, expected):
    run = _metrics_run(tmp_path / "run")
    argv = [a.format(tmp=tmp_path, run=run) for a in argv]
    if command in (_train, _dry_run):
        argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), *argv]
    if command is _compare:
        argv = [argv[0], STAPO_RECIPE, "--output-dir", str(tmp_path / "cmp"), *argv[1:]]
    with pytest.raises(SystemExit) as excinfo:
        command(argv)
    assert excinfo.value.code == 2
    assert expected in _error_line(capsys, prog)


class _WriteRecorder:
    """A text stream that keeps each `write` call apart: what another process sharing the pipe could cut between."""

    def __init__(self):
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def _ctrl_c(argv):
    from stapo_trl.cli.interrupt import GracefulInterrupt

    GracefulInterrupt()._handle(None, None)


@pytest.mark.parametrize(
    "command, argv, expected",
    [
        # The reported case (CI, two ranks under accelerate launch): the ranks' error lines ran into each other.
        (_train, ["--s2t_entropy_quantile", "1.5"], "stapo-train: error: --s2t_entropy_quantile:"),
        (_dry_run, ["--max_train_samples", "3"], "stapo-train --dry-run: error: 1 check(s) failed"),
        (_plot, ["{tmp}/no-run"], "stapo-plot: error: No metrics.jsonl in"),
        (_ctrl_c, [], "Ctrl-C: saving a checkpoint at the end of this step"),
    ],
    ids=["train-range", "dry-run-checks", "plot-no-run", "ctrl-c"],
)
def test_a_message_line_is_one_write_so_processes_cannot_interleave_it(
    no_model_built, tmp_path, monkeypatch, command, argv, expected
):
    """Every process under `accelerate launch` writes its error line to the same pipe: written as text then newline
    (`print`), two ranks' lines came out as `...error: A.stapo-train: error: A.`; one write is never split."""
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


def test_a_recipe_that_fails_its_dry_run_checks_exits_2(no_model_built, capsys):
    """The dry run's failed checks are input errors too (they exited 1, the same recipe's parse errors 2); stapo-train
    exits 2 on the same recipe."""
    from stapo_trl.cli.dry_run import main as dry_run_main
    from stapo_trl.cli.train import main

    argv = ["--config", STAPO_RECIPE, "--max_train_samples", "3"]
    assert dry_run_main(argv) == 2
    assert "3 prompts with max_train_samples; one rollout step needs 8" in capsys.readouterr().out
    with pytest.raises(SystemExit) as excinfo:
        main(argv)
    assert excinfo.value.code == 2


def test_eval_range_errors_stop_before_the_model_is_loaded(tiny_math_model_path, tmp_path, capsys):
    """`--batch-size 0` reached `generate` and failed there with a traceback (status 1)."""
    from stapo_trl.cli.eval import main

    base = ["--model", tiny_math_model_path, "--benchmarks", "tiny-math", "--backend", "hf", "--limit", "1"]
    base += ["--samples", "1", "--max-new-tokens", "8", "--output", str(tmp_path / "r.json")]
    for flag in ("--batch-size", "--max-model-len", "--tensor-parallel-size"):
        with pytest.raises(SystemExit) as excinfo:
            main([*base, flag, "0"])
        assert excinfo.value.code == 2
        assert _error_line(capsys, "stapo-eval") == f"stapo-eval: error: {flag} must be >= 1, got 0."
    assert not (tmp_path / "r.json").exists()


def test_help_of_every_command_states_the_exit_status(capsys):
    from stapo_trl.cli.dry_run import main as dry_run_main

    expected = "Exit status: 0 on success; 2 on an input error"
    for command, argv in ((_train, ["--help"]), (_compare, ["--help"]), (_eval, ["--help"]), (_plot, ["--help"])):
        with pytest.raises(SystemExit) as excinfo:
            command(argv)
        assert excinfo.value.code == 0
        assert expected in " ".join(capsys.readouterr().out.split()), command.__name__
    assert dry_run_main(["--help"]) == 0
    assert expected in " ".join(capsys.readouterr().out.split())


def test_python_m_train_exits_2_with_one_line(tmp_path):
    """What `accelerate launch` runs on every process: `python -m stapo_trl.cli.train`."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), "--s2t_entropy_quantile", "1.5"]
    proc = subprocess.run(
        [sys.executable, "-m", "stapo_trl.cli.train", *argv], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        "stapo-train: error: --s2t_entropy_quantile: s2t_entropy_quantile=1.5 must be in [0, 1]; the paper: 0.75."
    )
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------------------------------------------
# Item 4: an error about a recipe value names the recipe key and the file
# ---------------------------------------------------------------------------------------------------------------


def _recipe(tmp_path: Path, text: str) -> str:
    """The demo recipe with `text` appended (a repeated key: the last one wins, as PyYAML reads it)."""
    path = tmp_path / "my-recipe.yaml"
    path.write_text(Path(STAPO_RECIPE).read_text() + "\n" + text + "\n")
    return str(path)


FIX = "Fix the value in the recipe, or override it on the command line with --{key}."


@pytest.mark.parametrize(
    "line, expected",
    [
        # The reported case: argparse converts the recipe's string and reported `--s2t_entropy_quantile`.
        (
            "s2t_entropy_quantile: abc",
            "recipe key s2t_entropy_quantile in {recipe}: invalid float value: 'abc' (s2t_entropy_quantile takes a "
            "number). " + FIX.format(key="s2t_entropy_quantile"),
        ),
        (
            "s2t_entropy_quantile: 1.5",
            "recipe key s2t_entropy_quantile in {recipe}: s2t_entropy_quantile=1.5 must be in [0, 1]; the paper: 0.75. "
            + FIX.format(key="s2t_entropy_quantile"),
        ),
        (
            # a choice argparse never checked for a recipe value: transformers' "cosinus is not a valid SchedulerType"
            "lr_scheduler_type: cosinus",
            "recipe key lr_scheduler_type in {recipe}: lr_scheduler_type='cosinus' is not one of the choices: "
            "lr_scheduler_type takes one of 'linear', 'cosine', ",
        ),
        (
            "lerning_rate: 1.0e-4",
            "Unknown key(s) in recipe {recipe}: lerning_rate: did you mean learning_rate, logging_strategy? Every "
            "key must be a field of STAPOScriptArguments, STAPOConfig (GRPOConfig + s2t_*) or ModelConfig",
        ),
        (
            # a YAML float for an integer field reached the divisibility check: "num_generations=8.5 does not divide"
            "num_generations: 8.5",
            "recipe key num_generations in {recipe}: num_generations=8.5 is not an integer: num_generations takes an "
            "integer. " + FIX.format(key="num_generations"),
        ),
        (
            # YAML reads an unquoted `off` as false
            "s2t_mode: off",
            "recipe key s2t_mode in {recipe}: s2t_mode=False is not one of the choices (YAML reads an unquoted "
            "off/on/no/yes as false/true: quote the value): s2t_mode takes one of 'low_entropy', 'high_entropy', "
            "'all_low_prob', 'off'. " + FIX.format(key="s2t_mode"),
        ),
        (
            # failed only when the trainer was built, after the model: "tensorbord is not supported, only ..."
            "report_to: tensorbord",
            "recipe key report_to in {recipe}: report_to='tensorbord': 'tensorbord' is not one of ['none', 'all', ",
        ),
        (
            # failed only in the optimizer, after the model and the first evaluation: "Invalid learning rate: -1"
            "learning_rate: -1",
            "recipe key learning_rate in {recipe}: learning_rate=-1 must be >= 0",
        ),
        (
            # a YAML mapping for an integer field: "TypeError: '<' not supported between 'dict' and 'int'"
            "max_steps: {steps: 10}",
            "recipe key max_steps in {recipe}: max_steps={{'steps': 10}} is a YAML mapping: max_steps takes an "
            "integer. " + FIX.format(key="max_steps"),
        ),
        (
            "trainer: stapoo",
            "recipe key trainer in {recipe}: trainer='stapoo' is not one of ['stapo', 'grpo']. "
            + FIX.format(key="trainer"),
        ),
    ],
    ids=[
        "type",
        "range",
        "choice",
        "unknown-key",
        "float-for-int",
        "unquoted-off",
        "report-to",
        "negative-learning-rate",
        "mapping-for-int",
        "trainer",
    ],
)
def test_recipe_value_errors_name_the_recipe_key_and_the_file(no_model_built, tmp_path, capsys, line, expected):
    from stapo_trl.cli.train import main

    recipe = _recipe(tmp_path, line)
    with pytest.raises(SystemExit) as excinfo:
        main(["--config", recipe, "--output_dir", str(tmp_path / "out")])
    assert excinfo.value.code == 2
    assert _error_line(capsys, "stapo-train").startswith("stapo-train: error: " + expected.format(recipe=recipe))


def test_a_command_line_value_is_named_as_the_flag_not_the_recipe(no_model_built, tmp_path, capsys):
    from stapo_trl.cli.args import parse_args
    from stapo_trl.cli.train import main

    # The command line wins: its value is the one reported, with its flag, and the recipe is not blamed.
    recipe = _recipe(tmp_path, "s2t_entropy_quantile: 0.5")
    with pytest.raises(SystemExit):
        main(["--config", recipe, "--s2t_entropy_quantile", "1.5"])
    assert _error_line(capsys, "stapo-train").startswith(
        "stapo-train: error: --s2t_entropy_quantile: s2t_entropy_quantile=1.5 must be in [0, 1]"
    )
    with pytest.raises(SystemExit):
        main(["--config", recipe, "--s2t_entropy_quantile", "abc"])
    assert _error_line(capsys, "stapo-train") == (
        "stapo-train: error: --s2t_entropy_quantile: invalid float value: 'abc' (s2t_entropy_quantile takes a "
        "number). See `stapo-train --help` for every field."
    )
    # A bad recipe value that the command line overrides is never read.
    bad = _recipe(tmp_path, "s2t_entropy_quantile: abc\nnum_generations: 8.5")
    _, training_args, _ = parse_args(
        ["--config", bad, "--s2t_entropy_quantile", "0.5", "--num_generations", "8", "--output_dir", str(tmp_path)]
    )
    assert training_args.s2t_entropy_quantile == 0.5 and training_args.num_generations == 8


# The new-user pass after issue 23: a range error in a command-line value read "the recipe does not parse: X=..." in
# the dry run and named no flag in either; the README says a command-line value is named by its flag.
@pytest.mark.parametrize(
    "flag, value",
    [("s2t_entropy_quantile", "1.5"), ("max_steps", "0"), ("num_generations", "1"), ("temperature", "-1")],
)
@pytest.mark.parametrize("command, prog", [(_train, "stapo-train"), (_dry_run, "stapo-train --dry-run")])
def test_a_range_error_in_a_flag_names_the_flag(no_model_built, tmp_path, capsys, command, prog, flag, value):
    with pytest.raises(SystemExit) as excinfo:
        command(["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), f"--{flag}", value])
    assert excinfo.value.code == 2
    line = _error_line(capsys, prog)
    assert line.startswith(f"{prog}: error: --{flag}: {flag}="), line
    assert "recipe" not in line.split(":", 3)[2], line  # not "the recipe does not parse", not "recipe key"


@pytest.mark.parametrize(
    "flag, value, expected",
    [
        ("learning_rate", "-1e-4", "learning_rate=-0.0001 must be >= 0"),  # the reported case
        ("temperature", "-5E-1", "temperature=-0.5 must be > 0"),
        ("s2t_entropy_quantile", "-2.5e+0", "s2t_entropy_quantile=-2.5 must be in [0, 1]"),
    ],
)
def test_a_negative_number_in_exponent_form_is_read_as_a_value(
    no_model_built, tmp_path, capsys, flag, value, expected
):
    # argparse took `-1e-4` for an option: "--learning_rate: expected one argument", though a number was given.
    with pytest.raises(SystemExit) as excinfo:
        _train(["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), f"--{flag}", value])
    assert excinfo.value.code == 2
    assert _error_line(capsys, "stapo-train").startswith(f"stapo-train: error: --{flag}: {expected}")


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--dataset_name", "{empty}"], "dataset file '{empty}' is empty"),
        (["--model_name_or_path", "{tmp}/no-model"], "Model directory '{tmp}/no-model' does not exist"),
        (["--reward_funcs", "math_acuracy"], "Unknown reward 'math_acuracy'"),
    ],
    ids=["empty-dataset", "missing-model", "unknown-reward"],
)
def test_a_dry_run_that_fails_its_checks_ends_with_one_error_line(no_model_built, tmp_path, capsys, argv, expected):
    # The plan listed the failed checks on stdout only: no `PROG: error:` line, unlike every other input error.
    from stapo_trl.cli.dry_run import main as dry_run_main

    (tmp_path / "empty.jsonl").write_text("")
    fill = {"tmp": tmp_path, "empty": tmp_path / "empty.jsonl"}
    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), *(a.format(**fill) for a in argv)]
    assert dry_run_main(argv) == 2
    line = _error_line(capsys, "stapo-train --dry-run")
    assert "check(s) failed (the plan above lists them)" in line and expected.format(**fill) in line, line


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
    assert expected[where] in _error_line(capsys, "stapo-train --dry-run")
    with pytest.raises(SystemExit) as excinfo:
        main(argv)
    assert excinfo.value.code == 2
    line = _error_line(capsys, "stapo-train")
    assert line.startswith(f"stapo-train: error: resume_from_checkpoint='{path}' ") and expected[where] in line, line
    if where == "the-run-folder":
        assert "(checkpoint-4)" in line
    # A checkpoint folder passes this check (the run then resumes it).
    from stapo_trl.cli.checkpoints import check_resume_from_checkpoint

    check_resume_from_checkpoint(type("Args", (), {"resume_from_checkpoint": str(run / "checkpoint-4")})())


@pytest.mark.parametrize(
    "command, prog, argv, expected",
    [
        (_train, "stapo-train", ["--config", "{tmp}"], "is a folder: give the path of a recipe YAML file in it"),
        (_dry_run, "stapo-train --dry-run", ["--config", "{tmp}"], "is a folder"),
        (_compare, "stapo-train compare", [STAPO_RECIPE], "compare trains two recipes on the same seeds"),
        (_compare, "stapo-train compare", [], "0 given (none)"),
        (_compare, "stapo-train compare", [STAPO_RECIPE, GRPO_RECIPE, STAPO_RECIPE], "3 given"),
    ],
    ids=["config-folder", "dry-run-config-folder", "compare-one-recipe", "compare-none", "compare-three"],
)
def test_what_the_user_gave_is_what_the_message_names(no_model_built, tmp_path, capsys, command, prog, argv, expected):
    # `--config /tmp` said "does not exist"; `compare` with one recipe said "the following arguments are required".
    with pytest.raises(SystemExit) as excinfo:
        command([a.format(tmp=tmp_path) for a in argv])
    assert excinfo.value.code == 2
    assert expected in _error_line(capsys, prog)


def test_dry_run_refuses_zero_processes_by_its_flag(capsys):
    from stapo_trl.cli.dry_run import main as dry_run_main

    assert dry_run_main(["--config", STAPO_RECIPE, "--num-processes", "0"]) == 2
    assert _error_line(capsys, "stapo-train --dry-run").startswith(
        "stapo-train --dry-run: error: --num-processes: 0 is not a number of training processes"
    )


# ---------------------------------------------------------------------------------------------------------------
# Item 2: stapo-plot on a broken run folder (metrics.jsonl, spurious_tokens.jsonl, --out)
# ---------------------------------------------------------------------------------------------------------------

GOOD_ROWS = [{"step": s, "epoch": 0.1 * s, "reward": 0.1 * s, "entropy": 0.5} for s in (1, 2, 3)]
TOKEN_RECORD = {"step": 1, "kind": "silenced", "prob": 0.001, "entropy": 0.05, "token": "9", "token_id": 40}


def _write_lines(path: Path, lines: list) -> Path:
    """Write JSON lines (dicts and lists are dumped; str and bytes are written as they are)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = b""
    for line in lines:
        if isinstance(line, (dict, list)):
            line = json.dumps(line)
        data += (line if isinstance(line, bytes) else line.encode()) + b"\n"
    path.write_bytes(data)
    return path


def _skipped_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "skipped line" in r.getMessage()]


@pytest.mark.parametrize(
    "bad_line, line_text",
    [
        ('{"step": 2, "rew', "line 2"),  # the reported case: a line that is not JSON (cut or edited)
        (b'{"step": 2, "reward": "\xff\xfe"}', "line 2"),  # bytes that are not UTF-8: the whole file failed
        ('{"step": 2, "reward": "n/a"}', "line 2"),  # JSON, not a metrics row: float('n/a') failed the drawing
    ],
    ids=["not-json", "not-utf8", "not-a-number"],
)
def test_plot_skips_a_corrupt_metrics_line_with_one_warning(tmp_path, caplog, bad_line, line_text):
    from stapo_trl.cli.plot import main
    from stapo_trl.runfiles.metrics_log import read_metrics

    run = tmp_path / "run"
    _write_lines(run / "metrics.jsonl", [GOOD_ROWS[0], bad_line, GOOD_ROWS[2]])
    main([str(run)])
    assert (run / "training_curves.png").stat().st_size > 10_000
    # One warning for the file (it is read three times: curves, diagnostics, check), with the line number.
    assert _skipped_warnings(caplog) == [
        f"{run / 'metrics.jsonl'}: skipped {line_text}, not a metrics row (a JSON object with an integer step and "
        "numbers): a run killed mid-write cuts its last line short; other lines were edited or corrupted. The figures "
        "leave it out."
    ]
    assert [row["step"] for row in read_metrics(str(run))] == [1, 3]


@pytest.mark.parametrize(
    "lines, expected",
    [
        # the reported case: an empty file drew a blank figure and exited 0
        ([], "{file} is empty: the run has not reached its first logging step (logging_steps) yet, or stopped"),
        (["", "   "], "{file} is empty: the run has not reached its first logging step"),
        (['{"step": 1, "rew', "[1, 2]"], "{file} holds no metrics row (see the warning above for its lines)."),
        ([{"step": 1, "epoch": 0.1}], "{file} holds no logged metric, only steps."),
    ],
    ids=["empty", "blank-lines", "only-corrupt-lines", "only-steps"],
)
def test_plot_refuses_a_metrics_file_without_a_logged_step(tmp_path, capsys, lines, expected):
    from stapo_trl.cli.plot import main

    file = _write_lines(tmp_path / "run" / "metrics.jsonl", lines)
    if not lines:
        file.write_text("")
    with pytest.raises(SystemExit) as excinfo:
        main([str(tmp_path / "run")])
    assert excinfo.value.code == 2
    line = _error_line(capsys, "stapo-plot")
    assert line.startswith(f"stapo-plot: error: {expected.format(file=file)}"), line
    assert line.endswith("Nothing to draw: plot a run folder that logged at least one step, or leave this one out.")
    assert not (tmp_path / "run" / "training_curves.png").exists()


def test_plot_names_the_seed_whose_metrics_file_is_empty(tmp_path, capsys):
    from stapo_trl.cli.plot import main

    _write_lines(tmp_path / "arm" / "seed0" / "metrics.jsonl", GOOD_ROWS)
    (tmp_path / "arm" / "seed1").mkdir()
    (tmp_path / "arm" / "seed1" / "metrics.jsonl").write_text("")
    with pytest.raises(SystemExit) as excinfo:
        main([str(tmp_path / "arm"), "--out", str(tmp_path / "cmp.png")])
    assert excinfo.value.code == 2
    assert f"stapo-plot: error: {tmp_path / 'arm' / 'seed1' / 'metrics.jsonl'} is empty" in _error_line(
        capsys, "stapo-plot"
    )
    assert not (tmp_path / "cmp.png").exists()


@pytest.mark.parametrize("out", ["curves.xyz", "figs/curves.txt", "curves.png.bak"])
def test_plot_refuses_an_out_path_with_an_unknown_extension(tmp_path, capsys, out):
    from stapo_trl.cli.plot import main

    run = _metrics_run(tmp_path / "run")
    with pytest.raises(SystemExit) as excinfo:
        main([run, "--out", str(tmp_path / out)])
    assert excinfo.value.code == 2
    suffix = os.path.splitext(out)[1]
    assert _error_line(capsys, "stapo-plot") == (
        f"stapo-plot: error: --out {tmp_path / out}: {suffix!r} is not a figure format (.png, .pdf, .svg, .jpg, "
        ".jpeg): name a file with one of these extensions, or a folder (a path without an extension) for every figure."
    )
    assert not (tmp_path / out).exists()  # no folder named like a file


def test_plot_out_folders_and_figure_files_still_work(tmp_path):
    from stapo_trl.cli.plot import main

    run = _metrics_run(tmp_path / "run")
    main([run, "--out", str(tmp_path / "upper.PNG")])
    assert (tmp_path / "upper.PNG").is_file()
    (tmp_path / "runs.v2").mkdir()  # an existing folder with a dot in its name is a folder
    main([run, "--out", str(tmp_path / "runs.v2")])
    assert (tmp_path / "runs.v2" / "training_curves.png").is_file()


@pytest.mark.parametrize(
    "bad_record",
    [
        {"kind": "silenced"},  # no prob, entropy, token: the scatter raised KeyError: 'prob'
        {"step": 1, "prob": 0.01, "entropy": 0.2, "token": "x"},  # no kind: KeyError: 'kind'
        '{"step": 1, "kind": "silenced", "prob": 0.0',  # cut short
    ],
    ids=["missing-fields", "missing-kind", "cut-short"],
)
def test_plot_skips_a_broken_token_record_with_one_warning(tmp_path, caplog, bad_record):
    from stapo_trl.cli.plot import main

    run = Path(_metrics_run(tmp_path / "run"))
    file = _write_lines(run / "spurious_tokens.jsonl", [TOKEN_RECORD, bad_record, TOKEN_RECORD])
    main([str(run)])
    assert (run / "s2t_prob_entropy.png").is_file() and (run / "s2t_top_tokens.png").is_file()
    assert _skipped_warnings(caplog) == [
        f"{file}: skipped line 2, not a token record (a JSON object with kind, step, prob, entropy and token): a run "
        "killed mid-write cuts its last line short; other lines were edited or corrupted. The figures leave it out."
    ]


def test_plot_says_that_an_empty_token_file_draws_no_token_figure(tmp_path, caplog):
    from stapo_trl.cli.plot import main

    run = Path(_metrics_run(tmp_path / "run"))
    (run / "spurious_tokens.jsonl").write_text("")
    main([str(run)])
    assert not (run / "s2t_prob_entropy.png").exists()
    assert [r.getMessage() for r in caplog.records if "holds no token record" in r.getMessage()] == [
        f"{run / 'spurious_tokens.jsonl'} holds no token record: no s2t_prob_entropy.png or s2t_top_tokens.png from "
        "it (the run logged no positive-advantage token, or the file was cut)."
    ]


def test_stapo_plot_prints_the_warning_once_as_one_line(tmp_path):
    run = tmp_path / "run"
    _write_lines(run / "metrics.jsonl", [GOOD_ROWS[0], '{"step": 2, "rew', GOOD_ROWS[2], "not json"])
    env = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    proc = subprocess.run(
        [sys.executable, "-m", "stapo_trl.cli.plot", str(run)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        f"stapo-plot: warning: {run / 'metrics.jsonl'}: skipped lines 2, 4, not a metrics row (a JSON object with an "
        "integer step and numbers): a run killed mid-write cuts its last line short; other lines were edited or "
        "corrupted. The figures leave them out."
    ]
