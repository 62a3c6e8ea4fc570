"""`stapo-train` end to end: the demo recipe, its evaluation, resumes (its one-line input errors: test_errors.py)."""

import json
import logging
import os
import shlex
import shutil
import warnings

import pytest
import torch
from safetensors.torch import load_file
from testing_utils import STAPO_RECIPE, write_recipe
from transformers import AutoModelForCausalLM, AutoTokenizer

from stapo_trl.cli.eval import main as stapo_eval
from stapo_trl.cli.train import main
from stapo_trl.run_folder.logs import read_metrics


# The demo recipe shrunk: two rollout batches, one log line each, 16 held-out problems x 2 samples.
SMALL_RUN = ["--max_steps", "8", "--logging_steps", "4", "--save_steps", "4", "--eval_num_problems", "16",
             "--eval_num_samples", "2", "--disable_tqdm", "true"]  # fmt: skip


def _steps(out):
    return [r["step"] for r in read_metrics(str(out)) if "reward" in r]


@pytest.mark.slow  # three runs of 8, 6 and 0 steps with their figures and evaluations, two stapo-eval calls
def test_demo_end_to_end_then_resume(tmp_path, tiny_math_model_path, monkeypatch, capsys, caplog):
    out = tmp_path / "demo"
    # Tokens on the command line and in the recipe's env: block, in every run, are written nowhere in the folder.
    tokens = ["hf_" + "Qm4xT8vW2kZ9" * 3, "hf_" + "Lp7sR3nY6bJ1" * 3]
    monkeypatch.setenv("HF_TOKEN", "")  # restored after the test: the recipe's env: block sets it in this process
    recipe = write_recipe(tmp_path, f"env:\n  HF_TOKEN: {tokens[1]}")
    argv = ["--config", recipe, "--model_name_or_path", tiny_math_model_path, "--output_dir", str(out), *SMALL_RUN]
    argv += ["--hub_token", tokens[0]]

    # First run: 8 steps, checkpoints at 4 and 8, TRL's in-training benchmark evaluation at step 8.
    benchmark = ["--benchmark_eval", "tiny-math", "--benchmark_eval_steps", "8", "--benchmark_eval_limit", "8"]
    main([*argv, *benchmark, "--benchmark_eval_samples", "2"])
    assert "Resuming training" not in caplog.text and _steps(out) == [4, 8]
    accuracy = "eval_rewards/math_accuracy_reward/mean"  # avg@2 of the 8 problems
    (eval_row,) = [r for r in read_metrics(str(out)) if accuracy in r]
    assert eval_row["step"] == 8 and 0.0 <= eval_row[accuracy] <= 1.0
    for row in [r for r in read_metrics(str(out)) if "reward" in r]:  # the S2T metrics at every logging step
        assert {"s2t/silenced_ratio", "s2t/candidate_ratio", "s2t/num_silenced", "entropy", "loss"} <= set(row), row
        assert 0.0 <= row["s2t/silenced_ratio"] <= row["s2t/candidate_ratio"] <= 1.0
    assert os.path.getsize(out / "training_curves.png") > 10_000
    assert (out / "checkpoint-8").is_dir() and (out / "README.md").is_file()
    model, tokenizer = AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    assert model(**tokenizer(["12+34"], return_tensors="pt")).logits.shape[-1] == model.config.vocab_size  # (1, T, V)
    evaluation = json.loads((out / "eval.json").read_text())  # its settings, which stapo-eval reproduces exactly
    assert evaluation["num_problems"] == 16 and evaluation["k"] == 2 and 0.0 < evaluation["accuracy_before"] < 1.0
    assert {k: evaluation[k] for k in ("temperature", "backend", "dtype", "batch_size", "threads", "seed")} == {
        "temperature": 1.0, "backend": "hf", "dtype": "float32", "batch_size": 128, "threads": 1, "seed": 0
    } and evaluation["max_new_tokens"] == 48  # fmt: skip
    for when, path in (("before", tiny_math_model_path), ("after", str(out))):
        command = evaluation["stapo_eval_command"][when]
        assert command.startswith(f"stapo-eval --model {path} --benchmarks tiny-math --limit 16 --decoding t1.0-p1.0")
        results = tmp_path / f"stapo_eval_{when}.json"
        assert stapo_eval([*shlex.split(command)[1:], "--output", str(results)]) == 0
        table = json.loads(results.read_text())["results"]["t1.0-p1.0"]["tiny-math"]
        assert (table["avg@2"], table["pass@k"]["2"]) == (evaluation[f"accuracy_{when}"], evaluation[f"pass@2_{when}"])
    first = capsys.readouterr()
    assert f"The same numbers from stapo-eval: {command}" in first.out

    # Second run: resumed from checkpoint-8; steps 13-14 become step 14's row; its evaluation goes beside eval.json,
    # without the tied lm_head's "missing keys" line or a FutureWarning.
    monkeypatch.setattr(logging.getLogger("transformers"), "propagate", True)  # into caplog
    eval_json = (out / "eval.json").read_bytes()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main([*argv, "--max_steps", "14"])
    assert "already holds eval.json from an earlier run" in caplog.text and "eval-step14.json" in caplog.text
    assert "missing keys" not in caplog.text and "is_gradient_checkpointing" not in str([w.message for w in caught])
    assert json.loads((out / "eval-step14.json").read_text())["global_step"] == 14
    assert f"Resuming training from {out / 'checkpoint-8'}." in caplog.text
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 14 and _steps(out) == [4, 8, 12, 14]
    last = [r for r in read_metrics(str(out)) if "reward" in r][-1]
    assert "s2t/silenced_ratio" in last and "train_runtime" not in last
    summary = json.loads((out / "train_results.json").read_text())
    assert None not in summary.values() and "train_runtime" in summary

    # Third run, stopped after its final checkpoint: nothing to train, the checkpoint is the final model, a third eval.
    (out / "model.safetensors").unlink()
    second = (out / "eval-step14.json").read_bytes()
    main([*argv, "--max_steps", "14"])
    assert (out / "eval.json").read_bytes() == eval_json and (out / "eval-step14.json").read_bytes() == second
    assert json.loads((out / "eval-step14-2.json").read_text())["global_step"] == 14
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 14 and _steps(out) == [4, 8, 12, 14]
    final = load_file(out / "model.safetensors")
    checkpoint = load_file(out / "checkpoint-14" / "model.safetensors")
    assert final.keys() == checkpoint.keys() and all(torch.equal(final[k], checkpoint[k]) for k in final)
    files = [path for path in out.rglob("*") if path.is_file()]
    assert [str(p.relative_to(out)) for p in files if any(t.encode() in p.read_bytes() for t in tokens)] == []
    warning = "stapo-train: warning: --hub_token on the command line is visible to every user of this machine (ps, "
    assert (first.err + capsys.readouterr().err).count(warning) == 3  # one line per run


@pytest.mark.slow  # two stapo-train runs of 6 steps, with the command's files and figures (~20 s on 2 cores)
def test_a_resume_inside_a_rollout_batch_ends_as_the_uninterrupted_run(tmp_path, tiny_math_model_path):
    # Checkpoint-2 is inside a rollout batch: the resumed run trains on the saved rollout and ends bitwise equal.
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, *SMALL_RUN]
    argv += ["--max_steps", "6", "--save_steps", "2", "--save_total_limit", "3", "--eval_before_after", "false"]
    main([*argv, "--output_dir", str(tmp_path / "run")])
    stopped = tmp_path / "stopped"  # what a run stopped after checkpoint-2 leaves
    shutil.copytree(tmp_path / "run" / "checkpoint-2", stopped / "checkpoint-2")
    for name in ("metrics.jsonl", "spurious_tokens.jsonl"):
        shutil.copy(tmp_path / "run" / name, stopped / name)
    main([*argv, "--output_dir", str(stopped)])
    folders = (tmp_path / "run", stopped)
    expected, resumed = (load_file(folder / "model.safetensors") for folder in folders)
    assert expected.keys() == resumed.keys() and all(torch.equal(expected[k], resumed[k]) for k in expected)
    timing = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")
    rows = [[{k: v for k, v in r.items() if k not in timing} for r in read_metrics(str(f))] for f in folders]
    assert rows[0] == rows[1] and [r["step"] for r in rows[0]] == [4, 6]
