"""`stapo-plot` (`stapo_trl.cli.plot`): single runs and folders of seeds, `--out` as a folder or a figure file, and
broken run folders (a corrupt or empty metrics.jsonl, broken token records, an unknown figure extension): one warning
or one error line each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from testing_utils import error_line, write_metrics_run


def test_stapo_plot_draws_single_runs_and_seed_folders(tmp_path):
    from stapo_trl.cli.plot import main as plot_main

    def write_run(folder: Path, offset: float, with_s2t: bool):
        folder.mkdir(parents=True)
        with open(folder / "metrics.jsonl", "w") as f:
            for step in range(4, 44, 4):
                row = {"step": step, "reward": offset + step / 100, "entropy": 0.3 - step / 1000}
                if with_s2t:
                    row["s2t/silenced_ratio"] = 1e-4 if step % 12 == 0 else 0.0
                f.write(json.dumps(row) + "\n")

    for seed in (0, 1):
        write_run(tmp_path / "cmp" / "stapo" / f"seed{seed}", 0.1 * seed, with_s2t=True)
        write_run(tmp_path / "cmp" / "grpo" / f"seed{seed}", 0.1 * seed, with_s2t=False)
    # Two folders of seeds, overlaid (mean with a min/max band): the stapo-train compare layout.
    plot_main([str(tmp_path / "cmp" / "grpo"), str(tmp_path / "cmp" / "stapo"), "--out", str(tmp_path / "c.png")])
    assert os.path.getsize(tmp_path / "c.png") > 10_000
    # One run: the PNG goes next to its metrics.jsonl.
    plot_main([str(tmp_path / "cmp" / "stapo" / "seed0")])
    assert os.path.getsize(tmp_path / "cmp" / "stapo" / "seed0" / "training_curves.png") > 10_000
    # --out FOLDER (not a .png): created, and the curves land inside it as training_curves.png.
    plot_main([str(tmp_path / "cmp" / "stapo" / "seed0"), "--out", str(tmp_path / "figs" / "run0")])
    assert os.path.getsize(tmp_path / "figs" / "run0" / "training_curves.png") > 10_000
    # --out with another figure suffix is a file in that format, not a folder.
    plot_main([str(tmp_path / "cmp" / "stapo" / "seed0"), "--out", str(tmp_path / "curves.svg")])
    assert (tmp_path / "curves.svg").is_file() and (tmp_path / "curves.svg").read_text().lstrip().startswith("<?xml")
    with pytest.raises(SystemExit, match="stapo-plot: error: No metrics.jsonl"):
        plot_main([str(tmp_path)])
    with pytest.raises(SystemExit) as excinfo:  # a window of -3 steps was accepted
        plot_main([str(tmp_path / "cmp" / "stapo" / "seed0"), "--smoothing", "-3"])
    assert excinfo.value.code == 2


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
    from stapo_trl.run_folder.logs import read_metrics

    run = tmp_path / "run"
    _write_lines(run / "metrics.jsonl", [GOOD_ROWS[0], bad_line, GOOD_ROWS[2]])
    main([str(run)])
    assert (run / "training_curves.png").stat().st_size > 10_000
    # One warning for the file (it is read three times: curves, diagnostics, check), with the line number.
    (warning,) = _skipped_warnings(caplog)
    assert warning.startswith(f"{run / 'metrics.jsonl'}: skipped {line_text}, not a metrics row"), warning
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
    line = error_line(capsys, "stapo-plot")
    assert line.startswith(f"stapo-plot: error: {expected.format(file=file)}"), line
    assert "Nothing to draw" in line, line
    assert not (tmp_path / "run" / "training_curves.png").exists()


def test_plot_names_the_seed_whose_metrics_file_is_empty(tmp_path, capsys):
    from stapo_trl.cli.plot import main

    _write_lines(tmp_path / "arm" / "seed0" / "metrics.jsonl", GOOD_ROWS)
    (tmp_path / "arm" / "seed1").mkdir()
    (tmp_path / "arm" / "seed1" / "metrics.jsonl").write_text("")
    with pytest.raises(SystemExit) as excinfo:
        main([str(tmp_path / "arm"), "--out", str(tmp_path / "cmp.png")])
    assert excinfo.value.code == 2
    assert f"stapo-plot: error: {tmp_path / 'arm' / 'seed1' / 'metrics.jsonl'} is empty" in error_line(
        capsys, "stapo-plot"
    )
    assert not (tmp_path / "cmp.png").exists()


@pytest.mark.parametrize("out", ["curves.xyz", "figs/curves.txt", "curves.png.bak"])
def test_plot_refuses_an_out_path_with_an_unknown_extension(tmp_path, capsys, out):
    from stapo_trl.cli.plot import main

    run = write_metrics_run(tmp_path / "run")
    with pytest.raises(SystemExit) as excinfo:
        main([run, "--out", str(tmp_path / out)])
    assert excinfo.value.code == 2
    suffix = os.path.splitext(out)[1]
    line = error_line(capsys, "stapo-plot")
    assert line.startswith(f"stapo-plot: error: --out {tmp_path / out}: {suffix!r} is not a figure format"), line
    assert ".png" in line and ".svg" in line and "folder" in line, line  # the formats, and the folder alternative
    assert not (tmp_path / out).exists()  # no folder named like a file


def test_plot_out_folders_and_figure_files_still_work(tmp_path):
    from stapo_trl.cli.plot import main

    run = write_metrics_run(tmp_path / "run")
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

    run = Path(write_metrics_run(tmp_path / "run"))
    file = _write_lines(run / "spurious_tokens.jsonl", [TOKEN_RECORD, bad_record, TOKEN_RECORD])
    main([str(run)])
    assert (run / "s2t_prob_entropy.png").is_file() and (run / "s2t_top_tokens.png").is_file()
    (warning,) = _skipped_warnings(caplog)
    assert warning.startswith(f"{file}: skipped line 2, not a token record"), warning


def test_plot_says_that_an_empty_token_file_draws_no_token_figure(tmp_path, caplog):
    from stapo_trl.cli.plot import main

    run = Path(write_metrics_run(tmp_path / "run"))
    (run / "spurious_tokens.jsonl").write_text("")
    main([str(run)])
    assert not (run / "s2t_prob_entropy.png").exists()
    (message,) = [r.getMessage() for r in caplog.records if "holds no token record" in r.getMessage()]
    assert message.startswith(f"{run / 'spurious_tokens.jsonl'} holds no token record: no s2t_prob_entropy.png"), (
        message
    )


def test_stapo_plot_prints_the_warning_once_as_one_line(tmp_path):
    run = tmp_path / "run"
    _write_lines(run / "metrics.jsonl", [GOOD_ROWS[0], '{"step": 2, "rew', GOOD_ROWS[2], "not json"])
    env = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    proc = subprocess.run(
        [sys.executable, "-m", "stapo_trl.cli.plot", str(run)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stderr.splitlines()  # once, on one line
    assert line.startswith(f"stapo-plot: warning: {run / 'metrics.jsonl'}: skipped lines 2, 4, not a metrics row"), (
        line
    )
