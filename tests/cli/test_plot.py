"""`stapo-plot`: runs and seed folders, `--out`, and broken run folders (one warning or one error line each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from testing_utils import error_line, write_jsonl, write_metrics_run

from stapo_trl.cli.figures import (
    _curves_file,
    load_run,
    load_token_records,
    plot_diagnostics,
    plot_prob_entropy_scatter,
    plot_top_tokens,
)
from stapo_trl.cli.plot import main


def test_stapo_plot_draws_seed_folders_and_writes_where_out_says(tmp_path, capsys):
    for arm, seed in [(arm, seed) for arm in ("grpo", "stapo") for seed in (0, 1)]:
        rows = [
            {"step": step, "reward": 0.1 * seed + step / 100, "entropy": 0.3 - step / 1000} for step in range(4, 44, 4)
        ]
        for row in rows if arm == "stapo" else []:
            row["s2t/silenced_ratio"] = 1e-4 if row["step"] % 12 == 0 else 0.0
        (tmp_path / "cmp" / arm / f"seed{seed}").mkdir(parents=True)
        write_jsonl(tmp_path / "cmp" / arm / f"seed{seed}" / "metrics.jsonl", rows)
    # Two folders of seeds, overlaid (mean with a min/max band): the stapo-train compare layout.
    main([str(tmp_path / "cmp" / "grpo"), str(tmp_path / "cmp" / "stapo"), "--out", str(tmp_path / "c.png")])
    assert os.path.getsize(tmp_path / "c.png") > 10_000 and (tmp_path / "s2t_ratios.png").is_file()
    assert capsys.readouterr().out.splitlines() == [f"Wrote {tmp_path / name}" for name in ("c.png", "s2t_ratios.png")]
    run = write_metrics_run(tmp_path / "run")
    main([run])  # one run: the PNG goes next to its metrics.jsonl
    assert os.path.getsize(tmp_path / "run" / "training_curves.png") > 10_000
    main([run, "--out", str(tmp_path / "figs" / "run0")])  # a folder (no suffix): created, the curves inside
    assert (tmp_path / "figs" / "run0" / "training_curves.png").is_file()
    main([run, "--out", str(tmp_path / "curves.svg")])  # another figure suffix: a file in that format
    assert (tmp_path / "curves.svg").read_text().lstrip().startswith("<?xml")
    (tmp_path / "runs.v2").mkdir()  # an existing folder with a dot in its name is a folder
    assert _curves_file([run], str(tmp_path / "runs.v2")) == str(tmp_path / "runs.v2" / "training_curves.png")
    assert (
        _curves_file([run], "upper.PNG") == "upper.PNG" and _curves_file([run, run], None) == "./training_curves.png"
    )
    with pytest.raises(SystemExit, match="stapo-plot: error: No metrics.jsonl"):
        main([str(tmp_path / "cmp")])
    with pytest.raises(SystemExit) as excinfo:  # a window of -3 steps was accepted
        main([run, "--smoothing", "-3"])
    assert excinfo.value.code == 2


GOOD_ROWS = [{"step": s, "epoch": 0.1 * s, "reward": 0.1 * s, "entropy": 0.5} for s in (1, 2, 3)]
TOKEN_RECORD = {"step": 1, "kind": "silenced", "prob": 0.001, "entropy": 0.05, "token": "9", "token_id": 40}


def _write_lines(path: Path, lines: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)  # dicts and lists dumped, str and bytes as they are
    lines = [json.dumps(x) if isinstance(x, dict | list) else x for x in lines]
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))
    return path


def _skipped_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "skipped line" in r.getMessage()]


@pytest.mark.parametrize("bad_line, kind", [
        ('{"step": 2, "rew', "not-json"),  # the reported case: a line that is not JSON (cut or edited)
        (b'{"step": 2, "reward": "\xff\xfe"}', "not-utf8"),  # bytes that are not UTF-8: the whole file failed
        ('{"step": 2, "reward": "n/a"}', "not-a-number"),  # JSON, not a metrics row: float('n/a') failed the drawing
], ids=["not-json", "not-utf8", "not-a-number"])  # fmt: skip
def test_plot_skips_a_corrupt_metrics_line_with_one_warning(tmp_path, caplog, bad_line, kind):
    run = tmp_path / "run"
    _write_lines(run / "metrics.jsonl", [GOOD_ROWS[0], bad_line, GOOD_ROWS[2]])
    assert [[row["step"] for row in rows] for rows in load_run(str(run), require_steps=True)] == [[1, 3]]
    if kind == "not-json":  # the command draws the rest, with one warning for the file (read once)
        main([str(run)])
        assert (run / "training_curves.png").stat().st_size > 10_000
    (warning,) = _skipped_warnings(caplog)
    assert warning.startswith(f"{run / 'metrics.jsonl'}: skipped line 2, not a metrics row"), warning


@pytest.mark.parametrize("lines, expected", [
        # the reported case: an empty file drew a blank figure and exited 0
        ([], "{file} is empty: the run has not reached its first logging step (logging_steps) yet, or stopped"),
        (["", "   "], "{file} is empty: the run has not reached its first logging step"),
        (['{"step": 1, "rew', "[1, 2]"], "{file} holds no metrics row (see the warning above for its lines)."),
        ([{"step": 1, "epoch": 0.1}], "{file} holds no logged metric, only steps."),
], ids=["empty", "blank-lines", "only-corrupt-lines", "only-steps"])  # fmt: skip
def test_plot_refuses_a_metrics_file_without_a_logged_step(tmp_path, capsys, lines, expected):
    file = _write_lines(tmp_path / "run" / "metrics.jsonl", lines)
    if not lines:
        file.write_text("")
    with pytest.raises(SystemExit) as excinfo:
        main([str(tmp_path / "run")])
    assert excinfo.value.code == 2
    line = error_line(capsys, "stapo-plot")
    assert line.startswith(f"stapo-plot: error: {expected.format(file=file)}"), line
    assert "Nothing to draw" in line, line
    assert not (tmp_path / "run" / "training_curves.png").exists()


def test_plot_names_the_seed_whose_metrics_file_is_empty(tmp_path, capsys):
    _write_lines(tmp_path / "arm" / "seed0" / "metrics.jsonl", GOOD_ROWS)
    (tmp_path / "arm" / "seed1").mkdir()
    (tmp_path / "arm" / "seed1" / "metrics.jsonl").write_text("")
    with pytest.raises(SystemExit) as excinfo:
        main([str(tmp_path / "arm"), "--out", str(tmp_path / "cmp.png")])
    assert excinfo.value.code == 2
    line = error_line(capsys, "stapo-plot")
    assert line.startswith(f"stapo-plot: error: {tmp_path / 'arm' / 'seed1' / 'metrics.jsonl'} is empty"), line
    assert not (tmp_path / "cmp.png").exists()


@pytest.mark.parametrize("out", ["curves.xyz", "figs/curves.txt", "curves.png.bak"])
def test_plot_refuses_an_out_path_with_an_unknown_extension(tmp_path, capsys, out):
    run = write_metrics_run(tmp_path / "run")
    with pytest.raises(SystemExit) as excinfo:
        main([run, "--out", str(tmp_path / out)])
    assert excinfo.value.code == 2
    suffix = os.path.splitext(out)[1]
    line = error_line(capsys, "stapo-plot")
    assert line.startswith(f"stapo-plot: error: --out {tmp_path / out}: {suffix!r} is not a figure format"), line
    assert ".png" in line and ".svg" in line and "folder" in line, line  # the formats, and the folder alternative
    assert not (tmp_path / out).exists()  # no folder named like a file


@pytest.mark.parametrize("bad_record", [
        {"kind": "silenced"},  # no prob, entropy, token: the scatter raised KeyError: 'prob'
        {"step": 1, "prob": 0.01, "entropy": 0.2, "token": "x"},  # no kind: KeyError: 'kind'
        '{"step": 1, "kind": "silenced", "prob": 0.0',  # cut short
], ids=["missing-fields", "missing-kind", "cut-short"])  # fmt: skip
def test_plot_skips_a_broken_token_record_with_one_warning(tmp_path, caplog, bad_record):
    run = Path(write_metrics_run(tmp_path / "run"))
    file = _write_lines(run / "spurious_tokens.jsonl", [TOKEN_RECORD, bad_record, TOKEN_RECORD])
    records = {"run": load_token_records(run)}
    assert records["run"] == [TOKEN_RECORD, TOKEN_RECORD]
    assert plot_prob_entropy_scatter(records) is not None and plot_top_tokens(records) is not None  # drawn
    (warning,) = _skipped_warnings(caplog)
    assert warning.startswith(f"{file}: skipped line 2, not a token record"), warning


def test_plot_says_that_an_empty_token_file_draws_no_token_figure(tmp_path, caplog):
    run = Path(write_metrics_run(tmp_path / "run"))
    (run / "spurious_tokens.jsonl").write_text("")
    assert plot_diagnostics([run], run) == []
    (message,) = [r.getMessage() for r in caplog.records if "holds no token record" in r.getMessage()]
    assert message.startswith(f"{run / 'spurious_tokens.jsonl'} holds no token record: no s2t_prob_entropy.png")


@pytest.mark.slow  # a new Python process
def test_stapo_plot_prints_the_warning_once_as_one_line(tmp_path):
    run = tmp_path / "run"
    _write_lines(run / "metrics.jsonl", [GOOD_ROWS[0], '{"step": 2, "rew', GOOD_ROWS[2], "not json"])
    env = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    proc = subprocess.run(
        [sys.executable, "-m", "stapo_trl.cli.plot", str(run)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stderr.splitlines()  # once, on one line
    assert line.startswith(f"stapo-plot: warning: {run / 'metrics.jsonl'}: skipped lines 2, 4, not a metrics row")
