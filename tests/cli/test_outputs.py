"""Where a run's files go (`stapo_trl.cli.outputs`): a finished run's eval.json is never replaced, by a resumed run
nor by a rerun with nothing left to train."""

from __future__ import annotations

import json
import logging
import warnings

import pytest
from testing_utils import STAPO_RECIPE, LogRecords


def test_eval_results_path_never_replaces_existing_results(tmp_path):
    from stapo_trl.cli.outputs import eval_results_path

    assert eval_results_path(str(tmp_path), 8) == str(tmp_path / "eval.json")
    (tmp_path / "eval.json").write_text("{}")
    assert eval_results_path(str(tmp_path), 8) == str(tmp_path / "eval-step8.json")
    (tmp_path / "eval-step8.json").write_text("{}")
    (tmp_path / "eval-step8-2.json").write_text("{}")
    assert eval_results_path(str(tmp_path), 8) == str(tmp_path / "eval-step8-3.json")
    assert eval_results_path(str(tmp_path), 14) == str(tmp_path / "eval-step14.json")


@pytest.mark.slow  # three stapo-train runs with evaluations: 13-40 s on 2 cores, with the load
def test_rerun_into_a_finished_run_keeps_its_eval_json(tmp_path, tiny_math_model_path, caplog):
    from stapo_trl.cli.train import main

    out = tmp_path / "run"
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--output_dir", str(out)]
    # why: 1-2 steps and 4 problems x 1 sample keep each run to a few seconds
    argv += ["--max_steps", "1", "--save_steps", "1", "--eval_num_problems", "4", "--eval_num_samples", "1"]
    argv += ["--disable_tqdm", "true"]
    main(argv)
    first = (out / "eval.json").read_bytes()
    assert json.loads(first)["global_step"] == 1
    # Rerun with another max_steps: it resumes and trains on; the first results stay, the new ones go beside them.
    # The resume shows neither known-harmless upstream message (every resume printed both): the tied lm_head's
    # "missing keys" and the is_gradient_checkpointing FutureWarning.
    records = LogRecords()
    handler = records.handler()
    logging.getLogger("transformers.trainer").addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            main([*argv, "--max_steps", "2"])
    finally:
        logging.getLogger("transformers.trainer").removeHandler(handler)
    assert not [r for r in records if "missing keys" in r], records
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]
    assert (out / "eval.json").read_bytes() == first
    assert json.loads((out / "eval-step2.json").read_text())["global_step"] == 2
    assert "already holds eval.json from an earlier run" in caplog.text and "eval-step2.json" in caplog.text
    # The same settings again (nothing left to train, re-evaluated): a third file, nothing replaced.
    second = (out / "eval-step2.json").read_bytes()
    main([*argv, "--max_steps", "2"])
    assert (out / "eval.json").read_bytes() == first and (out / "eval-step2.json").read_bytes() == second
    assert json.loads((out / "eval-step2-2.json").read_text())["global_step"] == 2
