"""A run's results: the console and the card name what the evaluation measured (eval.json kept: test_train.py)."""

from types import SimpleNamespace

import pytest

from stapo_trl.cli.run import evaluation_kind, print_summary
from stapo_trl.cli.script_args import STAPOScriptArguments
from stapo_trl.data import evaluation_split
from stapo_trl.run_folder.card import _summary


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
