"""A run's results: eval.json is never replaced; the console and the card name what the evaluation measured."""

from __future__ import annotations

import json
import logging
import warnings
from types import SimpleNamespace

import pytest
from testing_utils import STAPO_RECIPE, LogRecords

from stapo_trl.cli.run import evaluation_kind, print_summary
from stapo_trl.cli.script_args import STAPOScriptArguments
from stapo_trl.cli.train import main
from stapo_trl.data import evaluation_split
from stapo_trl.run_folder.card import _summary


@pytest.mark.slow  # three stapo-train runs with evaluations: 13-40 s on 2 cores, with the load
def test_rerun_into_a_finished_run_keeps_its_eval_json(tmp_path, tiny_math_model_path, caplog):
    out = tmp_path / "run"
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--output_dir", str(out)]
    # why: 1-2 steps and 4 problems x 1 sample keep each run to a few seconds
    argv += ["--max_steps", "1", "--save_steps", "1", "--eval_num_problems", "4", "--eval_num_samples", "1"]
    argv += ["--disable_tqdm", "true"]
    main(argv)
    first = (out / "eval.json").read_bytes()
    assert json.loads(first)["global_step"] == 1
    # A rerun with more steps: the new results go beside the first, without the tied lm_head's "missing keys" line
    # and the is_gradient_checkpointing FutureWarning (every resume printed both).
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


# The console and the card name what the evaluation measured: a local file's is training prompts, not held out.
@pytest.mark.parametrize("dataset_name, kind, line, card", [
        ("my_problems.jsonl", "training (not held-out)", "Training (not held-out) avg@4 on 40 problems (T=1.0",
         "Accuracy on training prompts (not held out)"),
        ("builtin:tiny-math", "held-out", "Held-out avg@4 on 40 problems (T=1.0", "Held-out accuracy"),
        ("some-org/math", "held-out", "Held-out avg@4 on 40 problems (T=1.0", "Held-out accuracy"),
])  # fmt: skip
def test_the_console_and_the_card_name_what_the_evaluation_measured(capsys, dataset_name, kind, line, card):
    split, warning = evaluation_split(dataset_name, "test")
    assert evaluation_kind(split) == kind and (warning is None) == (kind == "held-out")
    record = {"metric": "avg@4", "num_problems": 40, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 48}
    record |= {"accuracy_before": 0.25, "accuracy_after": 0.5, "split": split}
    print_summary(STAPOScriptArguments(), "out", 10, None, record, 48, {"train": 1.0})
    (printed,) = [text for text in capsys.readouterr().out.splitlines() if "avg@4 on 40 problems" in text]
    assert printed.startswith(line), printed
    trainer = SimpleNamespace(state=SimpleNamespace(global_step=4, log_history=[]))
    (written,) = [text for text in _summary(trainer, None, record) if "avg@4 over 40" in text]
    assert written.startswith(f"- **{card}** (avg@4 over 40 problems of the `{split}` split"), written
