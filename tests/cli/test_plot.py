"""`stapo-plot`: runs and seed folders, `--out`, and broken lines skipped with one warning (refusals: test_errors)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from testing_utils import write_metrics_run

from stapo_trl.cli import figures
from stapo_trl.cli.plot import main


def test_stapo_plot_draws_seed_folders_and_writes_where_out_says(tmp_path, capsys):
    for arm, seed in [(arm, seed) for arm in ("grpo", "stapo") for seed in (0, 1)]:
        rows = [{"step": s, "reward": 0.1 * seed + s / 100, "entropy": 0.3 - s / 1000} for s in range(4, 44, 4)]
        for row in rows if arm == "stapo" else []:
            row["s2t/silenced_ratio"] = 1e-4 if row["step"] % 12 == 0 else 0.0
        _write_lines(tmp_path / "cmp" / arm / f"seed{seed}" / "metrics.jsonl", rows)
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
    assert figures._curves_file([run], str(tmp_path / "runs.v2")) == str(tmp_path / "runs.v2" / "training_curves.png")
    assert figures._curves_file([run], "upper.PNG") == "upper.PNG"
    assert figures._curves_file([run, run], None) == "./training_curves.png"


GOOD_ROWS = [{"step": s, "epoch": 0.1 * s, "reward": 0.1 * s, "entropy": 0.5} for s in (1, 2, 3)]
TOKEN_RECORD = {"step": 1, "kind": "silenced", "prob": 0.001, "entropy": 0.05, "token": "9", "token_id": 40}


def _write_lines(path: Path, lines: list) -> Path:  # dicts and lists dumped, str and bytes as they are
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(x) if isinstance(x, dict | list) else x for x in lines]
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))
    return path


def _warnings(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and text in r.getMessage()]


@pytest.mark.parametrize("name, bad_line", [
        ("metrics.jsonl", '{"step": 2, "rew'),  # the reported case: a line that is not JSON (cut or edited)
        ("metrics.jsonl", b'{"step": 2, "reward": "\xff\xfe"}'),  # bytes that are not UTF-8: the whole file failed
        ("metrics.jsonl", '{"step": 2, "reward": "n/a"}'),  # JSON, not a metrics row: float('n/a') failed the drawing
        ("spurious_tokens.jsonl", {"kind": "silenced"}),  # no prob, entropy, token: the scatter raised KeyError
        ("spurious_tokens.jsonl", {"step": 1, "prob": 0.01, "entropy": 0.2, "token": "x"}),  # no kind: KeyError
        ("spurious_tokens.jsonl", '{"step": 1, "kind": "silenced", "prob": 0.0'),  # cut short
])  # fmt: skip
def test_plot_skips_a_broken_line_with_one_warning(tmp_path, caplog, name, bad_line):
    run = Path(write_metrics_run(tmp_path / "run"))
    good = GOOD_ROWS if name == "metrics.jsonl" else [TOKEN_RECORD] * 3
    file = _write_lines(run / name, [good[0], bad_line, good[2]])
    if name == "metrics.jsonl":
        assert [[row["step"] for row in rows] for rows in figures.load_run(str(run), require_steps=True)] == [[1, 3]]
        main([str(run)])  # the command draws the rest, with one warning for the file (read once)
        assert (run / "training_curves.png").stat().st_size > 10_000
    else:
        records = {"run": figures.load_token_records(run)}
        assert records["run"] == [TOKEN_RECORD, TOKEN_RECORD]
        assert None not in (figures.plot_prob_entropy_scatter(records), figures.plot_top_tokens(records))  # drawn
    (warning,) = _warnings(caplog, "skipped line")
    kind = "metrics row" if good == GOOD_ROWS else "token record"
    assert warning.startswith(f"{file}: skipped line 2, not a {kind}")
    if good != GOOD_ROWS:  # an empty token file draws no token figure, and says so
        file.write_text("")
        assert figures.plot_diagnostics([run], run) == []
        (message,) = _warnings(caplog, "holds no token record")
        assert message.startswith(f"{file} holds no token record: no s2t_prob_entropy.png")


@pytest.mark.slow  # a new Python process
def test_stapo_plot_prints_the_warning_once_as_one_line(tmp_path):
    run = tmp_path / "run"
    _write_lines(run / "metrics.jsonl", [GOOD_ROWS[0], '{"step": 2, "rew', GOOD_ROWS[2], "not json"])
    env = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    proc = subprocess.run([sys.executable, "-m", "stapo_trl.cli.plot", str(run)], cwd=tmp_path, env=env,
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stderr.splitlines()  # once, on one line
    assert line.startswith(f"stapo-plot: warning: {run / 'metrics.jsonl'}: skipped lines 2, 4, not a metrics row")
