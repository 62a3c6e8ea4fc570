"""`stapo-train compare` (`stapo_trl.cli.compare`): both recipes trained on the same seeds, one figure, and a table
whose silenced ratio is pooled over the run."""

from __future__ import annotations

import json
import os

import pytest
from testing_utils import GRPO_RECIPE, STAPO_RECIPE


def test_compare_runs_both_recipes_and_draws_one_figure(tmp_path, tiny_math_model_path, capsys):
    from stapo_trl.cli.train import main

    out = tmp_path / "cmp"
    overrides = ["--model_name_or_path", tiny_math_model_path, "--max_steps", "4", "--logging_steps", "4"]
    overrides += [
        "--save_strategy",
        "no",
        "--eval_num_problems",
        "8",
        "--eval_num_samples",
        "2",
        "--disable_tqdm",
        "true",
    ]
    main(["compare", GRPO_RECIPE, STAPO_RECIPE, "--seeds", "0", "--output-dir", str(out), "--", *overrides])
    assert os.path.getsize(out / "compare.png") > 10_000
    summary = json.loads((out / "compare.json").read_text())
    assert set(summary["runs"]) == {"grpo", "stapo"}
    for label in ("grpo", "stapo"):
        assert (out / label / "seed0" / "metrics.jsonl").is_file()
        assert summary["runs"][label][0]["eval"]["accuracy_after"] is not None
    # The baseline arm is STAPOTrainer with the mask off: its counts are logged, and it silences nothing.
    assert summary["runs"]["grpo"][0]["s2t"]["num_silenced"] == 0
    assert "mean_silenced_ratio" in summary["runs"]["stapo"][0]["s2t"]
    table = capsys.readouterr().out
    assert "avg@2 before" in table and "stapo" in table and "grpo" in table


def test_compare_table_reports_the_pooled_silenced_ratio():
    """`make compare`'s table: Σ silenced / Σ loss tokens over the run (the README's definition), not the mean of the
    rows' ratios (which weighs a short row like a long one)."""
    from stapo_trl.cli.compare import _accuracy_table
    from stapo_trl.cli.outputs import summarize_s2t

    rows = [
        {"step": 4, "s2t/silenced_ratio": 0.01, "s2t/num_silenced": 1, "s2t/num_candidates": 3, "s2t/num_loss_tokens": 100},
        {"step": 8, "s2t/silenced_ratio": 0.0, "s2t/num_silenced": 0, "s2t/num_candidates": 0, "s2t/num_loss_tokens": 300},
    ]  # fmt: skip
    s2t = summarize_s2t(rows)
    assert s2t["mean_silenced_ratio"] == pytest.approx(5e-3) and s2t["silenced_ratio"] == pytest.approx(2.5e-3)
    evaluation = {"metric": "avg@4", "accuracy_before": 0.4, "accuracy_after": 0.6}
    table, _ = _accuracy_table({"stapo": [{"seed": 0, "eval": evaluation, "s2t": s2t}]})
    (row,) = [line for line in table.splitlines() if line.startswith("stapo") and " 0 " in line]
    assert row.rstrip().endswith("2.50e-03"), row
