"""`--help`, `--version` and the input errors that need no model answer at once (no torch import), with nothing but
their own output. Reported: `stapo-train --config /nonexistent.yaml` imported the training stack (~10 s) first."""

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import stapo_trl
from stapo_trl.cli.args import SHORT_HELP, fields_help
from stapo_trl.cli.train import main


REPO_ROOT = Path(__file__).resolve().parents[2]
# Runs a command's module as `python -m` does, and writes at exit whether torch was imported.
RUNNER = ("import atexit, runpy, sys\nreport = sys.argv.pop(1)\n"
          "atexit.register(lambda: open(report, 'w').write(str('torch' in sys.modules)))\n"
          "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)\n")  # fmt: skip
MODULES = {command: f"stapo_trl.cli.{command[6:]}" for command in ("stapo-train", "stapo-eval", "stapo-plot")}


@pytest.mark.slow  # a new Python process per case (in-process: below, test_args.py and tests/cli/test_errors.py)
@pytest.mark.parametrize("command, args, expected", [
        ("stapo-train", ["--help"], "usage:"),
        ("stapo-train", ["--version"], "stapo-train (stapo_trl "),
        ("stapo-train", ["--dry-run", "--help"], "Dry run of a recipe"),
        ("stapo-eval", ["--version"], "stapo-eval (stapo_trl "),
        ("stapo-plot", ["--help"], "usage: stapo-plot"),
        ("stapo-plot", ["--version"], "stapo-plot (stapo_trl "),
        ("stapo-train", ["--config", "/none.yaml"], "stapo-train: error: Recipe '/none.yaml' does not exist."),
        ("stapo-train", [], "stapo-train: error: no recipe: give --config RECIPE.yaml"),
        ("stapo-train", ["--config", "/none.yaml", "--dry-run"], "stapo-train --dry-run: error: Recipe"),
        ("stapo-train", ["compare", "a.yaml", "b.yaml"], "stapo-train: error: `stapo-train compare` is gone"),
        ("stapo-plot", ["/nonexistent"], "stapo-plot: error: No metrics.jsonl in '/nonexistent'"),
        ("stapo-eval", ["--model", "/nonexistent"], "stapo-eval: error: Model directory '/nonexistent' does not"),
        # An error that needs the config classes imports TRL (seconds), but prints nothing else: no DeepSpeed line.
        ("stapo-train", ["--config", "DEMO", "--s2t_entropy_quantile", "1.5"], "stapo-train: error: "
         "--s2t_entropy_quantile: s2t_entropy_quantile=1.5 must be in [0, 1]; the paper: 0.75."),
], ids=lambda value: " ".join(value) if isinstance(value, list) else None)  # fmt: skip
def test_a_fresh_process_answers_at_once_with_its_own_output_only(tmp_path, command, args, expected):
    args = [str(REPO_ROOT / "recipes" / "demo" / "stapo.yaml") if a == "DEMO" else a for a in args]
    report = tmp_path / ".imported"
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, str(report), MODULES[command], *args], cwd=tmp_path, capture_output=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)}, text=True, timeout=300,
    )  # fmt: skip
    error = expected.startswith(f"{command}") and ": error: " in expected
    assert proc.returncode == (2 if error else 0), proc.stderr
    assert (proc.stdout if error else proc.stderr) == "", proc.stdout + proc.stderr
    assert (proc.stderr if error else proc.stdout.lstrip()).startswith(expected), proc.stdout[:500] + proc.stderr
    assert not error or len(proc.stderr.splitlines()) == 1, proc.stderr
    assert report.read_text() == str("s2t_entropy_quantile" in " ".join(args)), "torch imported"


@pytest.mark.parametrize("command", ["stapo-train", "stapo-eval", "stapo-plot"])
def test_version_in_process(capsys, command):
    with pytest.raises(SystemExit) as excinfo:
        importlib.import_module(MODULES[command]).main(["--version"])
    out, err = capsys.readouterr()
    assert excinfo.value.code in (0, None) and err == "", err
    assert re.fullmatch(
        rf"{command} \(stapo_trl {stapo_trl.__version__}; trl \S+, transformers \S+, torch \S+\)\n", out
    )


def test_short_help_names_fields_that_exist_and_help_fields_filters_them(capsys):
    # each common field of the short `--help` is one `--help-fields` prints (all of them: test_public_surface.py)
    assert "--help-fields" in SHORT_HELP and "Exit status: 0 on success" in " ".join(SHORT_HELP.split())
    usage = SHORT_HELP.split("options:")[0]
    assert all(text in usage for text in ("--config RECIPE.yaml", "--dry-run", "--num-processes", "accelerate launch"))
    fields = set(re.findall(r"--(\w+)", SHORT_HELP.split("Common fields")[1].split("options:")[0]))
    every = fields_help()
    assert len(fields) >= 15 and all(f"--{name} " in every or f"--{name}," in every for name in fields), fields
    with pytest.raises(SystemExit):
        main(["--help-fields", "s2t_"])
    matching = capsys.readouterr().out
    assert "--s2t_mode" in matching and "--learning_rate" not in matching and len(matching) < len(every) / 5
