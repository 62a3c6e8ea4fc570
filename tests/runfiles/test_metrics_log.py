"""metrics.jsonl (`stapo_trl.run_files`): a fresh run in a used folder keeps the earlier run's files aside,
and a resume killed while it rewrites the file loses no row."""

from __future__ import annotations

import pytest
from testing_utils import STAPO_RECIPE


@pytest.mark.slow  # three stapo-train runs: 12-35 s on 2 cores, with the load
def test_fresh_run_keeps_an_earlier_runs_metrics_aside(tmp_path, tiny_math_model_path, caplog):
    """A run without checkpoints (save_strategy no) started again in its folder: the earlier metrics.jsonl and
    spurious_tokens.jsonl are moved aside (metrics.1.jsonl, then .2), never overwritten."""
    from stapo_trl.cli.train import main
    from stapo_trl.run_files import read_jsonl

    out = tmp_path / "run"
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--output_dir", str(out)]
    argv += ["--max_steps", "2", "--logging_steps", "1", "--save_strategy", "no", "--eval_before_after", "false"]
    argv += ["--disable_tqdm", "true"]
    main(argv)
    first = (out / "metrics.jsonl").read_text()
    assert [row["step"] for row in read_jsonl(out / "metrics.jsonl")] == [1, 2]
    main([*argv, "--max_steps", "1"])
    assert (out / "metrics.1.jsonl").read_text() == first
    assert [row["step"] for row in read_jsonl(out / "metrics.jsonl")] == [1]
    assert "metrics.jsonl held an earlier run's records: kept as metrics.1.jsonl" in caplog.text
    main([*argv, "--max_steps", "1"])
    assert (out / "metrics.1.jsonl").read_text() == first and (out / "metrics.2.jsonl").exists()


class Killed(Exception):
    """Stands for the SIGKILL that stops the rewrite at one of its rows."""


@pytest.mark.parametrize("row", [1, 3, 6])
def test_a_resume_killed_while_it_rewrites_the_file_loses_no_row(tmp_path, monkeypatch, row):
    # Reported: a kill while a resumed run rewrote metrics.jsonl (open(path, "w")) left it empty; the next run exited 0
    # with the rows after the checkpoint only.
    import json

    from stapo_trl import run_files as metrics_log

    path = tmp_path / "metrics.jsonl"
    rows = [{"step": step, "reward": step / 10} for step in range(1, 9)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 9, "rew')  # a last line cut short
    written = path.read_text()
    dumps, calls = json.dumps, []

    def dumps_until_killed(obj, **kwargs):
        calls.append(obj)
        if len(calls) == row:
            raise Killed(obj)
        return dumps(obj, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(metrics_log.json, "dumps", dumps_until_killed)
        with pytest.raises(Killed):
            metrics_log.open_jsonl_for_run(str(path), global_step=6)  # resuming from checkpoint-6
    assert path.read_text() == written  # every row written so far is still there
    file, kept = metrics_log.open_jsonl_for_run(str(path), global_step=6)
    file.write(json.dumps({"step": 7, "reward": 0.7}) + "\n")
    file.close()
    # The rows after the checkpoint's step (to be redone) and the cut line are gone; the new row is whole.
    assert [r["step"] for r in metrics_log.read_jsonl(path)] == [1, 2, 3, 4, 5, 6, 7] and len(kept) == 6
