"""Tests of `stapo-train` (stapo_trl.cli.train), its metrics file (stapo_trl.runfiles.metrics_log) and `stapo-plot`.

Parser and fail-fast checks run without building a model (a guard fails the test if one is built). The end-to-end
test runs the real demo recipe in-process at a reduced size on the session's tiny-math model, then resumes it.
"""

from __future__ import annotations

import json
import os
import types
from pathlib import Path

import pytest
import torch

from stapo_trl.data import INSTRUCTION


REPO = Path(__file__).resolve().parents[1]
STAPO_RECIPE = str(REPO / "recipes" / "demo" / "stapo.yaml")
GRPO_RECIPE = str(REPO / "recipes" / "demo" / "grpo.yaml")

# Reduced demo for tests: the real recipe, shrunk by command-line overrides (which also checks that they win).
SMALL_RUN = [
    # why: 8 optimizer steps = two rollout batches of 64 completions (steps_per_generation 4)
    "--max_steps", "8",
    # why: as in the recipe, one line per rollout batch (the masks of its 4 optimizer updates pooled)
    "--logging_steps", "4",
    "--save_steps", "4",
    # why: 16 held-out problems x 2 samples keep the before/after evaluation to ~1 s
    "--eval_num_problems", "16",
    "--eval_num_samples", "2",
    "--disable_tqdm", "true",
]  # fmt: skip


def _write_recipe(tmp_path, text: str, base: str = STAPO_RECIPE) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(Path(base).read_text() + "\n" + text)
    return str(path)


# ---------------------------------------------------------------------------------------------------------------
# Recipes and parser errors (no model)
# ---------------------------------------------------------------------------------------------------------------


def test_demo_recipes_parse_into_the_right_classes():
    from trl import ModelConfig

    from stapo_trl import STAPOConfig
    from stapo_trl.cli.args import parse_args
    from stapo_trl.cli.script_args import STAPOScriptArguments

    script_args, stapo_args, model_args = parse_args(["--config", STAPO_RECIPE])
    assert isinstance(script_args, STAPOScriptArguments) and isinstance(model_args, ModelConfig)
    assert type(stapo_args) is STAPOConfig
    assert script_args.trainer == "stapo"
    assert script_args.reward_funcs == ["math_accuracy"]
    assert script_args.eval_before_after is True
    assert model_args.model_name_or_path == "builtin:tiny-math"
    # ENVIRONMENT.md's measured tiny-model RL settings (lr 1e-4: 3e-4 breaks the current builtin's arithmetic).
    assert stapo_args.learning_rate == 1e-4 and stapo_args.lr_scheduler_type == "constant"
    assert stapo_args.per_device_train_batch_size == 16 and stapo_args.num_generations == 8
    assert stapo_args.steps_per_generation == 4 and stapo_args.generation_batch_size == 64
    assert (stapo_args.loss_type, stapo_args.epsilon, stapo_args.epsilon_high, stapo_args.beta) == (
        "dapo",
        0.2,
        0.28,
        0.0,
    )
    assert stapo_args.temperature == 1.0 and stapo_args.use_cpu and not stapo_args.bf16 and stapo_args.report_to == []
    assert (stapo_args.s2t_prob_threshold, stapo_args.s2t_entropy_quantile) == (0.002, 0.75)

    script_args, grpo_args, _ = parse_args(["--config", GRPO_RECIPE])
    # The like-for-like baseline: the same trainer and normaliser with the mask off (issue 10).
    assert script_args.trainer == "stapo" and type(grpo_args) is STAPOConfig and grpo_args.s2t_mode == "off"
    # The same run without the mask: every field equal except the output folder and the mode.
    stapo_dict, grpo_dict = stapo_args.to_dict(), grpo_args.to_dict()
    differing = {k for k in grpo_dict if grpo_dict[k] != stapo_dict[k]}
    assert differing <= {"output_dir", "run_name", "hub_model_id", "s2t_mode"}, differing


def test_every_script_argument_has_help_text_and_a_docstring_entry():
    import dataclasses

    from stapo_trl.cli.script_args import STAPOScriptArguments

    own = {f.name for f in dataclasses.fields(STAPOScriptArguments)} - {
        f.name for f in dataclasses.fields(STAPOScriptArguments.__mro__[1])
    }
    for f in dataclasses.fields(STAPOScriptArguments):
        if f.name in own:
            assert f.metadata.get("help"), f.name
            assert f"        {f.name} (`" in STAPOScriptArguments.__doc__, f.name


def test_command_line_overrides_the_recipe():
    from stapo_trl.cli.args import parse_args

    _, training_args, _ = parse_args(["--config", STAPO_RECIPE, "--max_steps", "7", "--trainer", "stapo"])
    assert training_args.max_steps == 7


def test_grpo_gets_the_paper_objective_defaults_not_trl_defaults(tmp_path):
    # A grpo recipe that does not set epsilon_high still gets STAPOConfig's 0.28 (TRL's default is None), so the two
    # arms of a comparison differ only by the mask.
    from stapo_trl.cli.args import parse_args

    recipe = tmp_path / "r.yaml"
    recipe.write_text("trainer: grpo\nuse_cpu: true\nbf16: false\nreport_to: none\n")
    _, training_args, _ = parse_args(["--config", str(recipe), "--output_dir", str(tmp_path)])
    assert training_args.epsilon_high == 0.28 and training_args.loss_type == "dapo" and training_args.beta == 0.0


@pytest.mark.parametrize(
    "key, expected",
    [
        ("learning_rat: 1.0e-3", "did you mean learning_rate"),
        ("torch_dtype: float32", "`dtype`"),
        ("max_prompt_length: 512", "no longer truncates prompts"),
    ],
)
def test_unknown_recipe_key_fails_with_a_clear_message(tmp_path, key, expected):
    from stapo_trl.cli.args import parse_args

    with pytest.raises(ValueError, match="Unknown key") as excinfo:
        parse_args(["--config", _write_recipe(tmp_path, key)])
    assert key.split(":")[0] in str(excinfo.value) and expected in str(excinfo.value)


def test_unknown_command_line_flag_gets_the_same_message(tmp_path):
    from stapo_trl.cli.args import parse_args

    with pytest.raises(ValueError, match="Unknown key.*the command line") as excinfo:
        parse_args(["--config", _write_recipe(tmp_path, "seed: 1"), "--s2t_prob_treshold", "0.1"])
    assert "did you mean s2t_prob_threshold" in str(excinfo.value)


def test_s2t_keys_are_rejected_with_trainer_grpo(tmp_path):
    from stapo_trl.cli.args import parse_args

    # The demo baseline with plain TRL (`trainer: grpo`) instead of STAPOTrainer with the mask off.
    plain = tmp_path / "plain.yaml"
    lines = Path(GRPO_RECIPE).read_text().replace("trainer: stapo ", "trainer: grpo ").splitlines()
    plain.write_text("\n".join(line for line in lines if not line.startswith("s2t_")))
    with pytest.raises(ValueError, match="s2t_mode: .*plain GRPOTrainer"):
        parse_args(["--config", _write_recipe(tmp_path, 's2t_mode: "off"', base=str(plain))])
    with pytest.raises(ValueError, match="s2t_prob_threshold: .*plain GRPOTrainer"):
        parse_args(["--config", str(plain), "--s2t_prob_threshold", "0.01"])


def test_num_generations_not_dividing_the_generation_batch_lists_valid_values():
    from stapo_trl.cli.args import parse_args

    # Generation batch = 16 completions x 1 process x 4 steps = 64; 7 does not divide it.
    with pytest.raises(ValueError, match="num_generations=7") as excinfo:
        parse_args(["--config", STAPO_RECIPE, "--num_generations", "7"])
    assert "[2, 4, 8, 16, 32, 64]" in str(excinfo.value)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["--reward_funcs", "math_acuracy"], r"Unknown reward 'math_acuracy'.*math_accuracy"),
        (["--model_name_or_path", "./no/such/model"], r"'./no/such/model' does not exist"),
        # the model argument is checked before the dataset is loaded
        (["--model_name_or_path", "./no/model", "--dataset_name", "./no/data.jsonl"], r"'./no/model' does not exist"),
        (["--model_name_or_path", "outputs/no-such"], r"'outputs/no-such' is not a local directory.*HF_HUB_OFFLINE"),
        (["--model_name_or_path", "builtin:huge-math"], r"'builtin:huge-math'.*builtin:tiny-math"),
        (["--dataset_name", "builtin:huge-math"], r"'builtin:huge-math'.*builtin:tiny-math"),
        (["--num_generations", "6"], r"num_generations=6 .*\[2, 4, 8, 16, 32, 64\]"),
        (["--max_steps", "0"], r"max_steps=0 is not a number of optimizer steps"),
        (["--max_steps", "-5"], r"max_steps=-5 is not a number of optimizer steps"),
        (["--torch_num_threads", "0"], r"torch_num_threads=0 must be >= 1"),
        (["--eval_num_problems", "0"], r"eval_num_problems=0 must be >= 1"),  # eval.json held NaN
        (["--output_dir", __file__], r"output_dir='.*test_train.py' is a file: give a folder"),
        (["--s2t_mod", "off"], r"s2t_mod: did you mean s2t_mode"),  # no argparse prefix matching
        (["--learning_rat", "1e-5"], r"learning_rat: did you mean learning_rate"),
        (["--benchmark_eval", "aime99"], r"Unknown benchmark 'aime99'.*aime24"),
    ],
    ids=[
        "unknown-reward",
        "missing-model-path",
        "missing-model-path-before-missing-data",
        "hub-id-looking-path-offline",
        "unknown-builtin-model",
        "unknown-builtin-dataset",
        "num-generations",
        "max-steps-0",
        "max-steps-negative",
        "torch-num-threads-0",
        "eval-num-problems-0",
        "output-dir-is-a-file",
        "abbreviated-flag",
        "abbreviated-flag-2",
        "unknown-benchmark",
    ],
)
def test_cli_fails_fast_with_one_message_before_building_a_model(no_model_built, tmp_path, overrides, match):
    from stapo_trl.cli.train import main

    # The command ends with one "stapo-train: error: ..." line (SystemExit carries it), not a traceback.
    with pytest.raises(SystemExit, match=r"(?s)^stapo-train: error: .*" + match):
        main(["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), *overrides])


def test_malformed_recipe_and_misspelt_config_flag_get_one_line_errors(no_model_built, tmp_path, capsys):
    from stapo_trl.cli.train import main

    broken = _write_recipe(tmp_path, "learning_rate: [1e-4\n")  # an unclosed list at the end of the demo recipe
    with pytest.raises(SystemExit, match=r"^stapo-train: error: Recipe '.*recipe.yaml' is not valid YAML \(line \d+"):
        main(["--config", broken])
    with pytest.raises(SystemExit, match="confg: did you mean config"):
        main(["--confg", STAPO_RECIPE])
    with pytest.raises(SystemExit, match="no recipe: give --config RECIPE.yaml"):
        main([])
    empty = tmp_path / "empty.yaml"
    empty.write_text("# only a comment\n")
    with pytest.raises(
        SystemExit, match=r"^stapo-train: error: Recipe '.*empty.yaml' is empty: write one `field: value`"
    ):
        main(["--config", str(empty)])
    listed = tmp_path / "list.yaml"
    listed.write_text("- learning_rate: 1e-4\n")
    with pytest.raises(SystemExit, match=r"Recipe '.*list.yaml' is a YAML list, not a mapping"):
        main(["--config", str(listed)])


def test_help_names_the_recipe_flag_and_the_other_commands(capsys):
    from stapo_trl.cli.train import main

    with pytest.raises(SystemExit):
        main(["--help"])
    usage = capsys.readouterr().out.split("options:")[0]
    for text in ("--config RECIPE.yaml", "--dry-run", "compare RECIPE_A.yaml", "accelerate launch"):
        assert text in usage, text


def test_dapo_prompts_are_stripped_and_long_prompts_dropped(tmp_path, tiny_math_model_path):
    from stapo_trl.cli.args import parse_args
    from stapo_trl.cli.run import prepare

    # A DAPO-style file: the problem wrapped in its own "Answer:" instruction; one prompt far over the budget.
    dapo = "Solve the following math problem step by step. The last line of your response should be of the form "
    dapo += "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{}\n\n"
    dapo += 'Remember to put your answer on its own line after "Answer:".'
    rows = [
        {"prompt": dapo.format("12+34"), "solution": "46"},
        {"prompt": dapo.format("1+" * 400 + "1"), "solution": "401"},
    ]
    data = tmp_path / "dapo.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--dataset_name", str(data)]
    argv += ["--prompt_column", "prompt", "--solution_column", "solution", "--eval_before_after", "false"]
    argv += ["--strip_dapo_instruction", "true", "--max_prompt_tokens", "128"]
    # why: a one-prompt rollout step (8 completions), so that the one kept prompt fills it (issue 12, item 1)
    argv += ["--per_device_train_batch_size", "8", "--steps_per_generation", "1"]
    run = prepare(*parse_args(argv))
    assert run.train_dataset["prompt"] == [[{"role": "user", "content": "12+34\n" + INSTRUCTION}]]


def test_missing_dataset_column_fails_before_building_a_model(no_model_built, tmp_path):
    from stapo_trl.cli.train import main

    data = tmp_path / "math.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(4)))
    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), "--dataset_name", str(data)]
    with pytest.raises(SystemExit, match=r"Column 'problem' not found.*question"):
        main(argv)


# ---------------------------------------------------------------------------------------------------------------
# metrics.jsonl and plots (no model)
# ---------------------------------------------------------------------------------------------------------------


def _state(step: int):
    return types.SimpleNamespace(is_world_process_zero=True, global_step=step, epoch=0.0)


def test_metrics_callback_writes_strict_json_and_drops_redone_steps_on_resume(tmp_path):
    from stapo_trl.runfiles.callbacks import MetricsLogCallback
    from stapo_trl.runfiles.metrics_log import read_metrics

    args = types.SimpleNamespace(output_dir=str(tmp_path))
    callback = MetricsLogCallback()
    callback.on_train_begin(args, _state(0), None)
    for step in (2, 4, 6):
        callback.on_log(args, _state(step), None, logs={"reward": 0.5, "s2t/entropy_threshold": float("nan")})
    callback.on_log(args, _state(6), None, logs={"train_runtime": 1.0})  # the end-of-training summary: not a step
    callback.on_train_end(args, _state(6), None)
    rows = read_metrics(str(tmp_path))
    assert [r["step"] for r in rows] == [2, 4, 6]
    assert rows[0]["s2t/entropy_threshold"] is None  # NaN is not JSON: written as null

    # Resuming from the step-4 checkpoint: step 6 will be redone, so its old line goes.
    callback = MetricsLogCallback()
    callback.on_train_begin(args, _state(4), None)
    callback.on_log(args, _state(6), None, logs={"reward": 0.75})
    callback.on_train_end(args, _state(6), None)
    assert [(r["step"], r["reward"]) for r in read_metrics(str(tmp_path))] == [(2, 0.5), (4, 0.5), (6, 0.75)]


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


# ---------------------------------------------------------------------------------------------------------------
# End to end: the demo recipe at reduced size, then a resume
# ---------------------------------------------------------------------------------------------------------------


def test_demo_end_to_end_then_resume(tmp_path, tiny_math_model_path, monkeypatch):
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stapo_trl.cli.train import main
    from stapo_trl.runfiles.metrics_log import read_metrics

    resumed_from = []
    original_train = transformers.Trainer.train

    def spy_train(self, *args, **kwargs):
        resumed_from.append(kwargs.get("resume_from_checkpoint"))
        return original_train(self, *args, **kwargs)

    monkeypatch.setattr(transformers.Trainer, "train", spy_train)
    out = tmp_path / "demo"
    argv = [
        "--config",
        STAPO_RECIPE,
        "--model_name_or_path",
        tiny_math_model_path,
        "--output_dir",
        str(out),
        *SMALL_RUN,
    ]

    # First run: 8 steps, checkpoints at steps 4 and 8, everything written; the in-training benchmark evaluation
    # (BenchmarkEvalCallback on the built-in task) at step 8.
    benchmark = ["--benchmark_eval", "tiny-math", "--benchmark_eval_steps", "8", "--benchmark_eval_limit", "8"]
    main([*argv, *benchmark, "--benchmark_eval_samples", "2"])
    assert resumed_from == [None]
    rows = [r for r in read_metrics(str(out)) if "reward" in r]
    assert [r["step"] for r in rows] == [4, 8]
    eval_rows = [r for r in read_metrics(str(out)) if "eval/tiny-math/avg@2" in r]
    assert [r["step"] for r in eval_rows] == [8] and 0.0 <= eval_rows[0]["eval/tiny-math/avg@2"] <= 1.0
    for row in rows:  # the S2T metrics are logged at every logging step (next to TRL's own)
        for key in ("s2t/silenced_ratio", "s2t/candidate_ratio", "s2t/num_silenced", "reward", "entropy", "loss"):
            assert key in row, (key, row)
        assert 0.0 <= row["s2t/silenced_ratio"] <= row["s2t/candidate_ratio"] <= 1.0
    assert os.path.getsize(out / "training_curves.png") > 10_000
    evaluation = json.loads((out / "eval.json").read_text())
    for key in ("accuracy_before", "accuracy_after", "k", "temperature", "top_p", "max_new_tokens", "num_problems"):
        assert key in evaluation, key
    assert evaluation["k"] == 2 and evaluation["num_problems"] == 16 and evaluation["temperature"] == 1.0
    assert 0.0 <= evaluation["accuracy_before"] <= 1.0 and 0.0 <= evaluation["accuracy_after"] <= 1.0
    assert (out / "checkpoint-8").is_dir() and (out / "README.md").is_file()
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    logits = model(**tokenizer(["12+34"], return_tensors="pt")).logits  # (1, T, V)
    assert logits.shape[-1] == model.config.vocab_size

    # Second run, same folder, more steps: it resumes from the last checkpoint and the global step continues. 14 is
    # not a multiple of logging_steps: steps 13-14 (a new rollout batch, so a new mask) are logged by the end-of-run
    # summary, and become step 14's row.
    main([*argv, "--max_steps", "14", "--eval_before_after", "false"])
    assert resumed_from[-1] is not None and resumed_from[-1].endswith("checkpoint-8")
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 14
    rows = [r for r in read_metrics(str(out)) if "reward" in r]
    assert [r["step"] for r in rows] == [4, 8, 12, 14]
    assert "s2t/silenced_ratio" in rows[-1] and "train_runtime" not in rows[-1]
    summary = json.loads((out / "train_results.json").read_text())
    assert None not in summary.values() and "train_runtime" in summary

    # Third run, same folder, same max_steps, as if the last run had stopped after its final checkpoint: nothing
    # left to train; the checkpoint is saved as the final model and the run ends normally at step 14.
    (out / "model.safetensors").unlink()
    main([*argv, "--max_steps", "14", "--eval_before_after", "false"])
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 14
    final = AutoModelForCausalLM.from_pretrained(out).state_dict()
    for name, tensor in AutoModelForCausalLM.from_pretrained(out / "checkpoint-14").state_dict().items():
        assert torch.equal(final[name], tensor), name
    assert [r["step"] for r in read_metrics(str(out)) if "reward" in r] == [4, 8, 12, 14]


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
