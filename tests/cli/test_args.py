"""Parsing `stapo-train`: the recipe read once, the flags that win, one set of value checks behind the flag or key."""

from __future__ import annotations

import builtins
import dataclasses
import os
import warnings
from pathlib import Path

import pytest
from testing_utils import GRPO_RECIPE, STAPO_RECIPE, write_recipe

from stapo_trl import STAPOConfig
from stapo_trl.cli.args import parse_args
from stapo_trl.cli.script_args import STAPOScriptArguments
from stapo_trl.cli.train import main


def _cli_error(argv) -> str:
    with pytest.raises(ValueError) as excinfo:
        parse_args(argv)
    return str(excinfo.value)


def test_every_script_argument_has_help_text_and_a_docstring_entry():
    inherited = {f.name for f in dataclasses.fields(STAPOScriptArguments.__mro__[1])}
    for f in [f for f in dataclasses.fields(STAPOScriptArguments) if f.name not in inherited]:
        assert f.metadata.get("help") and f"        {f.name} (`" in STAPOScriptArguments.__doc__, f.name


def test_the_recipe_is_read_once_the_command_line_wins_and_its_env_block_is_set(tmp_path, monkeypatch):
    monkeypatch.delenv("STAPO_TEST_VARIABLE", raising=False)
    recipe, opened, real_open = write_recipe(tmp_path, "env:\n  STAPO_TEST_VARIABLE: 3"), [], builtins.open
    monkeypatch.setattr(builtins, "open", lambda file, *a, **k: opened.append(str(file)) or real_open(file, *a, **k))
    _, training_args, _ = parse_args(["--config", recipe, "--max_steps", "7", "--trainer", "stapo"])
    assert training_args.max_steps == 7 and training_args.learning_rate == 1e-4  # the flag, and the recipe's value
    assert opened.count(recipe) == 1 and os.environ["STAPO_TEST_VARIABLE"] == "3", opened


def test_grpo_gets_the_paper_objective_defaults_not_trl_defaults(tmp_path):
    # A grpo recipe that does not set epsilon_high still gets STAPOConfig's 0.28 (TRL's default is None), so the two
    # arms of a comparison differ only by the mask.
    recipe = tmp_path / "r.yaml"
    recipe.write_text("trainer: grpo\nuse_cpu: true\nbf16: false\nreport_to: none\n")
    _, training_args, _ = parse_args(["--config", str(recipe), "--output_dir", str(tmp_path)])
    assert type(training_args).__name__ == "GRPOConfig"
    assert training_args.epsilon_high == 0.28 and training_args.loss_type == "dapo" and training_args.beta == 0.0


@pytest.mark.parametrize("key, expected", [
        ("learning_rat: 1.0e-3", "did you mean learning_rate"),
        ("torch_dtype: float32", "`dtype`"),
        ("max_prompt_length: 512", "no longer truncates prompts"),
])  # fmt: skip
def test_unknown_recipe_key_fails_with_a_clear_message(tmp_path, key, expected):
    recipe = write_recipe(tmp_path, key)
    message = _cli_error(["--config", recipe])
    assert message.startswith(f"Unknown key(s) in recipe {recipe}: {key.split(':')[0]}: "), message
    assert expected in message and "(recipe key" not in message, message


@pytest.mark.parametrize(
    "typo, field", [("learning_rat", "learning_rate"), ("num_generation", "num_generations"),
                    ("s2t_prob_treshold", "s2t_prob_threshold")],
)  # fmt: skip
def test_a_flag_typo_names_the_flag_and_the_recipe_key_it_resembles(tmp_path, typo, field):
    message = _cli_error(["--config", STAPO_RECIPE, "--output_dir", str(tmp_path), f"--{typo}", "1"])
    assert message.startswith(f"Unknown key(s) in the command line: --{typo}: did you mean {field}"), message
    assert f"{field} is a key of the recipe {STAPO_RECIPE} too: the flag --{field} overrides it" in message


def test_s2t_keys_are_rejected_with_trainer_grpo(tmp_path):
    # The demo baseline with plain TRL (`trainer: grpo`) instead of STAPOTrainer with the mask off.
    plain = tmp_path / "plain.yaml"
    lines = Path(GRPO_RECIPE).read_text().replace("trainer: stapo ", "trainer: grpo ").splitlines()
    plain.write_text("\n".join(line for line in lines if not line.startswith("s2t_")))
    message = _cli_error(["--config", write_recipe(tmp_path, 's2t_mode: "off"', base=str(plain))])
    assert "s2t_mode: STAPO field(s), and trainer='grpo' builds a plain GRPOTrainer" in message
    message = _cli_error(["--config", str(plain), "--s2t_prob_threshold", "0.01"])
    assert "--s2t_prob_threshold: STAPO field(s), and trainer='grpo' builds a plain GRPOTrainer" in message
    # Reported: the STAPO recipe with --trainer grpo said the same sentence once per s2t_ key, then "correct or remove".
    message = _cli_error(["--config", STAPO_RECIPE, "--trainer", "grpo", "--s2t_mode", "off"])
    assert message.count("trainer='grpo'") == 1 and "Every key must be" not in message, message
    assert "s2t_prob_threshold, s2t_entropy_quantile, s2t_mode: STAPO field(s)" in message, message


# (field, command-line value, Python value, the message both give)
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
IDS = ["batch-size", "accumulation", "steps-per-generation", "one-generation", "learning-rate", "report-to",
       "max-steps", "temperature", "seed", "generation-batch"]  # fmt: skip


def _config_error(**settings) -> str:
    # The demo recipe's geometry, so that the generation batch reads the same as on the command line.
    base = dict(output_dir="unused", report_to=[], per_device_train_batch_size=16, steps_per_generation=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError) as excinfo:
            STAPOConfig(**{**base, **settings})
    return str(excinfo.value)


@pytest.mark.parametrize("field, flag_value, value, message", CASES, ids=IDS)
def test_the_api_and_the_cli_give_the_same_message_behind_the_flag(tmp_path, field, flag_value, value, message):
    api = _config_error(**{field: value})
    assert api.startswith(message), api
    cli = _cli_error(["--config", STAPO_RECIPE, "--output_dir", str(tmp_path), f"--{field}", flag_value])
    # the flag, then the same message (an error of several values also names the recipe keys of the others)
    assert cli.startswith(f"--{field}") and cli.endswith(f": {api}"), cli


def test_trainer_grpo_gets_the_same_checks(tmp_path):
    # A plain GRPOConfig has none of STAPOConfig's checks: the parser runs the same function on its raw values; where
    # GRPOConfig refuses a value itself (num_generations), its own words stand, without STAPOConfig's fix.
    plain = tmp_path / "plain.yaml"
    lines = Path(STAPO_RECIPE).read_text().splitlines()
    plain.write_text("\n".join(line for line in lines if not line.startswith(("s2t_", "trainer"))) + "\ntrainer: grpo")
    for field, flag_value, _value, message in CASES:
        cli = _cli_error(["--config", str(plain), "--output_dir", str(tmp_path), f"--{field}", flag_value])
        if field == "num_generations":
            assert message.split(". ")[0] in cli and "paper uses 8" not in cli and "Valid" not in cli, cli
        else:
            assert cli.startswith(f"--{field}") and f": {message}" in cli, cli


def test_a_generation_batch_error_names_the_flags_that_caused_it(tmp_path):
    # The reported case: read "recipe key num_generations in recipes/demo/stapo.yaml: ..." (the recipe's 8 is fine).
    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path)]
    cli = _cli_error(argv + ["--per_device_train_batch_size", "12", "--steps_per_generation", "1"])
    assert cli.startswith("--per_device_train_batch_size and --steps_per_generation (with recipe key num_generations "
                          f"in {STAPO_RECIPE}): generation_batch_size (12) must be divisible by num_generations (8). "
                          "The generation batch is per_device_train_batch_size 12 x 1 process(es) x "
                          "steps_per_generation 1 = 12 completions"), cli  # fmt: skip
    recipe = tmp_path / "recipe.yaml"  # no steps_per_generation: TRL takes gradient_accumulation_steps
    recipe.write_text("".join(f"{line}\n" for line in Path(STAPO_RECIPE).read_text().splitlines()
                              if not line.startswith("steps_per_generation")))  # fmt: skip
    cli = _cli_error(
        ["--config", str(recipe), "--gradient_accumulation_steps", "3", "--per_device_train_batch_size", "4"]
    )
    assert cli.startswith("--per_device_train_batch_size and --gradient_accumulation_steps (with recipe key "
                          f"num_generations in {recipe}): generation_batch_size (12) must be divisible by "
                          "num_generations (8). The generation batch is per_device_train_batch_size 4 x 1 process(es) "
                          "x gradient_accumulation_steps 3 = 12 completions"), cli  # fmt: skip


def test_a_generation_batch_error_from_the_recipe_names_its_keys(tmp_path):
    recipe = write_recipe(tmp_path, "per_device_train_batch_size: 12\nsteps_per_generation: 1")
    cli = _cli_error(["--config", recipe, "--output_dir", str(tmp_path)])
    assert cli.startswith("recipe keys num_generations, per_device_train_batch_size, steps_per_generation in "
                          f"{recipe}: generation_batch_size (12) must be divisible by num_generations (8). The "
                          "generation batch is"), cli  # fmt: skip
    assert cli.endswith("Fix the values in the recipe, or override them on the command line."), cli


def test_malformed_recipe_and_misspelt_config_flag_get_one_line_errors(no_model_built, tmp_path):
    broken = write_recipe(tmp_path, "learning_rate: [1e-4\n")  # an unclosed list at the end of the demo recipe
    with pytest.raises(SystemExit, match=r"^stapo-train: error: Recipe '.*recipe.yaml' is not valid YAML \(line \d+"):
        main(["--config", broken])
    with pytest.raises(SystemExit, match="confg: did you mean config"):
        main(["--confg", STAPO_RECIPE])
    with pytest.raises(SystemExit, match="no recipe: give --config RECIPE.yaml"):
        main([])
    empty = tmp_path / "empty.yaml"
    empty.write_text("# only a comment\n")
    with pytest.raises(SystemExit, match=r"^stapo-train: error: Recipe '.*empty.yaml' is empty: write one `field: "):
        main(["--config", str(empty)])
    listed = tmp_path / "list.yaml"
    listed.write_text("- learning_rate: 1e-4\n")
    with pytest.raises(SystemExit, match=r"Recipe '.*list.yaml' is a YAML list, not a mapping"):
        main(["--config", str(listed)])
