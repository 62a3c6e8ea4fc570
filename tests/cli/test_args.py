"""Parsing `stapo-train`: the recipe read once, the flags that win, one set of value checks behind the flag or key."""

from __future__ import annotations

import builtins
import dataclasses
import os
import warnings
from pathlib import Path

import pytest
from testing_utils import STAPO_RECIPE, write_recipe

from stapo_trl import STAPOConfig
from stapo_trl.cli.args import parse_args
from stapo_trl.cli.script_args import STAPOScriptArguments
from stapo_trl.cli.train import main


def _cli_error(argv) -> str:
    with pytest.raises(ValueError) as excinfo:
        parse_args(argv)
    return str(excinfo.value)


def test_the_recipe_is_read_once_the_command_line_wins_and_its_env_block_is_set(tmp_path, monkeypatch):
    inherited = {f.name for f in dataclasses.fields(STAPOScriptArguments.__mro__[1])}  # and each field has a help
    for f in [f for f in dataclasses.fields(STAPOScriptArguments) if f.name not in inherited]:
        assert f.metadata.get("help") and f"        {f.name} (`" in STAPOScriptArguments.__doc__, f.name
    monkeypatch.delenv("STAPO_TEST_VARIABLE", raising=False)
    recipe, opened, real_open = write_recipe(tmp_path, "env:\n  STAPO_TEST_VARIABLE: 3"), [], builtins.open
    monkeypatch.setattr(builtins, "open", lambda file, *a, **k: opened.append(str(file)) or real_open(file, *a, **k))
    _, training_args, _ = parse_args(["--config", recipe, "--max_steps", "7", "--trainer", "stapo"])
    assert training_args.max_steps == 7 and training_args.learning_rate == 1e-4  # the flag, and the recipe's value
    assert opened.count(recipe) == 1 and os.environ["STAPO_TEST_VARIABLE"] == "3", opened


@pytest.mark.parametrize("recipe_line, flag, expected", [
        ("learning_rat: 1.0e-3", None, "recipe RECIPE: learning_rat: did you mean learning_rate"),
        ("torch_dtype: float32", None, "recipe RECIPE: torch_dtype: use `dtype`"),
        ("max_prompt_length: 512", None, "recipe RECIPE: max_prompt_length: use nothing: TRL 1.x no longer truncates"),
        (None, "learning_rat", "the command line: --learning_rat: did you mean learning_rate"),
        (None, "num_generation", "the command line: --num_generation: did you mean num_generations"),
        (None, "s2t_prob_treshold", "the command line: --s2t_prob_treshold: did you mean s2t_prob_threshold"),
])  # fmt: skip
def test_an_unknown_key_or_flag_names_itself_and_the_field_it_resembles(tmp_path, recipe_line, flag, expected):
    recipe = write_recipe(tmp_path, recipe_line) if recipe_line else STAPO_RECIPE
    message = _cli_error(["--config", recipe, "--output_dir", str(tmp_path), *([f"--{flag}", "1"] if flag else [])])
    assert message.startswith("Unknown key(s) in " + expected.replace("RECIPE", recipe)), message
    assert "(recipe key" not in message, message
    if flag:  # the flag resembles a key the recipe sets
        field = expected.split()[-1]
        assert f"{field} is a key of the recipe {recipe} too: the flag --{field} overrides it" in message, message


def _grpo_recipe(tmp_path) -> str:  # the demo recipe with a plain GRPOTrainer (no s2t_ keys)
    lines = [line for line in Path(STAPO_RECIPE).read_text().splitlines() if not line.startswith(("s2t_", "trainer"))]
    (tmp_path / "plain.yaml").write_text("\n".join(lines) + "\ntrainer: grpo")
    return str(tmp_path / "plain.yaml")


def test_trainer_grpo_gets_the_paper_objective_and_refuses_s2t_keys(tmp_path):
    # epsilon_high unset: STAPOConfig's 0.28, not TRL's None, so the two arms of a comparison differ by the mask alone
    (tmp_path / "r.yaml").write_text("trainer: grpo\nuse_cpu: true\nbf16: false\nreport_to: none\n")
    _, training_args, _ = parse_args(["--config", str(tmp_path / "r.yaml"), "--output_dir", str(tmp_path)])
    assert type(training_args).__name__ == "GRPOConfig" and training_args.epsilon_high == 0.28
    assert training_args.loss_type == "dapo" and training_args.beta == 0.0
    message = _cli_error(["--config", write_recipe(tmp_path, 's2t_mode: "off"', base=_grpo_recipe(tmp_path))])
    assert "s2t_mode: STAPO field(s), and trainer='grpo' builds a plain GRPOTrainer" in message
    message = _cli_error(["--config", _grpo_recipe(tmp_path), "--s2t_prob_threshold", "0.01"])
    assert "--s2t_prob_threshold: STAPO field(s), and trainer='grpo' builds a plain GRPOTrainer" in message
    # once for all s2t_ keys, without "correct or remove"
    message = _cli_error(["--config", STAPO_RECIPE, "--trainer", "grpo", "--s2t_mode", "off"])
    assert message.count("trainer='grpo'") == 1 and "Every key must be" not in message, message
    assert "s2t_prob_threshold, s2t_entropy_quantile, s2t_mode: STAPO field(s)" in message, message


CASES = [
    ("per_device_train_batch_size", "-4", -4,
     "per_device_train_batch_size=-4 must be >= 1 (completions per process per micro-step; the CPU demo uses 16)."),
    ("gradient_accumulation_steps", "0", 0,
     "gradient_accumulation_steps=0 must be >= 1 (micro-steps per optimizer update; the CPU demo uses 1)."),
    ("steps_per_generation", "0", 0, "steps_per_generation=0 must be >= 1 (or unset (None) for TRL's default)."),
    ("num_generations", "1", 1, "GRPO requires at least 2 generations per prompt to calculate the advantages. You "
     "provided 1, which is less than the minimum required. Set num_generations to 2 or more (the paper uses 8)."),
    ("learning_rate", "-1e-4", -1e-4, "learning_rate=-0.0001 must be >= 0 (the paper uses 1e-6, the CPU demo 1e-4)."),
    ("report_to", "tensorbord", "tensorbord", "report_to='tensorbord': tensorbord is not supported, only azure_ml, "),
    ("max_steps", "-5", -5, "max_steps=-5 is not a number of optimizer steps: give a positive number, or -1"),
    ("temperature", "0", 0.0, "temperature=0.0 must be > 0: GRPO samples its rollouts"),
    ("seed", str(2**32), 2**32, "seed=4294967296 must be in [0, 2**32 - 1] (numpy's seed range)."),
    ("num_generations", "7", 7,
     "generation_batch_size (64) must be divisible by num_generations (7). The generation batch is "
     "per_device_train_batch_size 16 x 1 process(es) x steps_per_generation 4 = 64 completions, and each prompt needs "
     "a whole group of num_generations completions. Valid num_generations for this batch: [2, 4, 8, 16, 32, 64]."),
]  # fmt: skip


@pytest.mark.parametrize("field, flag_value, value, message", CASES, ids=[case[0] for case in CASES])
def test_the_api_the_cli_and_trainer_grpo_give_the_same_message(tmp_path, field, flag_value, value, message):
    # the demo recipe's geometry, so that the generation batch reads the same as on the command line
    base = {"output_dir": "unused", "report_to": [], "per_device_train_batch_size": 16, "steps_per_generation": 4}
    with warnings.catch_warnings(), pytest.raises(ValueError) as excinfo:
        warnings.simplefilter("ignore")
        STAPOConfig(**{**base, field: value})
    assert (api := str(excinfo.value)).startswith(message), api
    cli = _cli_error(["--config", STAPO_RECIPE, "--output_dir", str(tmp_path), f"--{field}", flag_value])
    # the flag, then the same message (an error of several values also names the recipe keys of the others)
    assert cli.startswith(f"--{field}") and cli.endswith(f": {api}"), cli
    # trainer: grpo (no STAPOConfig) gets the same checks; where GRPOConfig refuses a value itself, its words stand
    cli = _cli_error(["--config", _grpo_recipe(tmp_path), "--output_dir", str(tmp_path), f"--{field}", flag_value])
    if field == "num_generations":
        assert message.split(". ")[0] in cli and "paper uses 8" not in cli and "Valid" not in cli, cli
    else:
        assert cli.startswith(f"--{field}") and f": {message}" in cli, cli


BATCH = ("generation_batch_size (12) must be divisible by num_generations (8). The generation batch is "
         "per_device_train_batch_size {} x 1 process(es) x {} = 12 completions")  # fmt: skip


@pytest.mark.parametrize("recipe_text, flags, expected", [  # the reported case: read "recipe key num_generations ..."
        (None, ["--per_device_train_batch_size", "12", "--steps_per_generation", "1"],
         "--per_device_train_batch_size and --steps_per_generation (with recipe key num_generations in {recipe}): "
         + BATCH.format(12, "steps_per_generation 1")),
        ("steps_per_generation: null", ["--gradient_accumulation_steps", "3", "--per_device_train_batch_size", "4"],
         "--per_device_train_batch_size and --gradient_accumulation_steps (with recipe key num_generations in "
         "{recipe}): " + BATCH.format(4, "gradient_accumulation_steps 3")),  # unset: gradient_accumulation_steps
        ("per_device_train_batch_size: 12\nsteps_per_generation: 1", [], "recipe keys num_generations, per_device_"
         "train_batch_size, steps_per_generation in {recipe}: " + BATCH.format(12, "steps_per_generation 1")),
])  # fmt: skip
def test_a_generation_batch_error_names_the_flags_or_keys_that_caused_it(tmp_path, recipe_text, flags, expected):
    recipe = write_recipe(tmp_path, recipe_text) if recipe_text else STAPO_RECIPE
    cli = _cli_error(["--config", recipe, "--output_dir", str(tmp_path), *flags])
    assert cli.startswith(expected.format(recipe=recipe)), cli
    assert flags or cli.endswith("Fix the values in the recipe, or override them on the command line."), cli


@pytest.mark.parametrize("text, argv, match", [
        ("learning_rate: 1e-4\n  max_steps: [\n", ["--config", "RECIPE"],
         r"^stapo-train: error: Recipe '.*recipe.yaml' is not valid YAML \(line \d+"),
        (None, ["--confg", STAPO_RECIPE], "confg: did you mean config"),
        (None, [], "no recipe: give --config RECIPE.yaml"),
        ("# only a comment\n", ["--config", "RECIPE"], r"Recipe '.*recipe.yaml' is empty: write one `field: "),
        ("- learning_rate: 1e-4\n", ["--config", "RECIPE"], r"Recipe '.*recipe.yaml' is a YAML list, not a mapping"),
])  # fmt: skip
def test_malformed_recipe_and_misspelt_config_flag_get_one_line_errors(no_model_built, tmp_path, text, argv, match):
    if text is not None:
        (tmp_path / "recipe.yaml").write_text(text)
    with pytest.raises(SystemExit, match=match):
        main([str(tmp_path / "recipe.yaml") if a == "RECIPE" else a for a in argv])
