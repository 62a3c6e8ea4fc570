"""One set of value checks for the Python API and `stapo-train`: `STAPOConfig(...)` refuses what the command line
refuses, with the same message (before TRL's own checks); the command line puts the flag or the recipe key around it,
and names every flag that made an error caused by several values (the generation batch). A flag typo names the flag
and the recipe key it resembles, plainly."""

import warnings
from pathlib import Path

import pytest
from testing_utils import STAPO_RECIPE, write_recipe

from stapo_trl import STAPOConfig


# (field, command-line value, Python value, the message both give)
CASES = [
    (
        "per_device_train_batch_size",
        "-4",
        -4,
        "per_device_train_batch_size=-4 must be >= 1 (completions per process per micro-step; the CPU demo uses 16).",
    ),
    (
        "gradient_accumulation_steps",
        "0",
        0,
        "gradient_accumulation_steps=0 must be >= 1 (micro-steps per optimizer update; the CPU demo uses 1).",
    ),
    ("steps_per_generation", "0", 0, "steps_per_generation=0 must be >= 1, or unset (None) for TRL's default."),
    (
        "num_generations",
        "1",
        1,
        "num_generations=1 must be >= 2: GRPO's advantage compares the completions of one prompt (the paper uses 8).",
    ),
    ("learning_rate", "-1e-4", -1e-4, "learning_rate=-0.0001 must be >= 0 (the paper uses 1e-6, the CPU demo 1e-4)."),
    ("report_to", "tensorbord", "tensorbord", "report_to='tensorbord': 'tensorbord' is not one of ['none', 'all', "),
    ("max_steps", "-5", -5, "max_steps=-5 is not a number of optimizer steps: give a positive number, or -1"),
    (
        "num_generations",
        "7",
        7,
        "num_generations=7 does not divide the generation batch (per_device_train_batch_size 16 x 1 process(es) x "
        "steps_per_generation 4 = 64 completions): each prompt needs a whole group of num_generations completions. "
        "Valid num_generations for this batch: [2, 4, 8, 16, 32, 64].",
    ),
]
IDS = ["batch-size", "accumulation", "steps-per-generation", "one-generation", "learning-rate", "report-to",
       "max-steps", "generation-batch"]  # fmt: skip


def _config_error(**settings) -> str:
    # The demo recipe's geometry, so that the generation batch reads the same as on the command line.
    base = dict(output_dir="unused", report_to=[], per_device_train_batch_size=16, steps_per_generation=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError) as excinfo:
            STAPOConfig(**{**base, **settings})
    return str(excinfo.value)


def _cli_error(argv) -> str:
    from stapo_trl.cli.args import parse_args

    with pytest.raises(ValueError) as excinfo:
        parse_args(argv)
    return str(excinfo.value)


@pytest.mark.parametrize("field, flag_value, value, message", CASES, ids=IDS)
def test_the_api_and_the_cli_give_the_same_message(tmp_path, field, flag_value, value, message):
    api = _config_error(**{field: value})
    assert api.startswith(message), api
    cli = _cli_error(["--config", STAPO_RECIPE, "--output_dir", str(tmp_path), f"--{field}", flag_value])
    # the flag, then the same message (an error of several values also names the recipe keys of the others)
    assert cli.startswith(f"--{field}") and cli.endswith(f": {api}"), cli


@pytest.mark.parametrize("field, flag_value, value, message", CASES[:3], ids=IDS[:3])
def test_a_recipe_value_gets_the_same_message_behind_its_key(tmp_path, field, flag_value, value, message):
    recipe = Path(write_recipe(tmp_path, f"{field}: {flag_value}"))
    cli = _cli_error(["--config", str(recipe), "--output_dir", str(tmp_path)])
    assert cli.startswith(f"recipe key {field} in {recipe}: {message}"), cli


def test_trainer_grpo_gets_the_same_checks(tmp_path):
    # A plain GRPOConfig has none of STAPOConfig's checks: the parser runs the same set on its values.
    plain = tmp_path / "plain.yaml"
    lines = Path(STAPO_RECIPE).read_text().splitlines()
    plain.write_text(
        "\n".join(line for line in lines if not line.startswith(("s2t_", "trainer"))) + "\ntrainer: grpo\n"
    )
    for field, flag_value, _value, message in CASES:
        cli = _cli_error(["--config", str(plain), "--output_dir", str(tmp_path), f"--{field}", flag_value])
        assert cli.startswith(f"--{field}") and f": {message}" in cli, cli


def test_the_duplicated_cli_checks_are_gone():
    from stapo_trl.cli import recipe_parser

    assert not hasattr(recipe_parser, "check_counts") and not hasattr(recipe_parser, "check_generation_batch")


# An error made by several values names the flags that set them, not only the reported field's recipe key.


def test_a_generation_batch_error_names_the_flags_that_caused_it(tmp_path):
    # The reported case: read "recipe key num_generations in recipes/demo/stapo.yaml: ..." (the recipe's 8 is fine).
    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path)]
    cli = _cli_error(argv + ["--per_device_train_batch_size", "12", "--steps_per_generation", "1"])
    assert cli.startswith(
        f"--per_device_train_batch_size and --steps_per_generation (with recipe key num_generations in "
        f"{STAPO_RECIPE}): num_generations=8 does not divide the generation batch (per_device_train_batch_size 12 x 1 "
        "process(es) x steps_per_generation 1 = 12 completions)"
    ), cli
    assert "Fix the value in the recipe" not in cli


def test_a_generation_batch_error_names_the_accumulation_flag_when_it_sets_the_batch(tmp_path):
    recipe = tmp_path / "recipe.yaml"  # no steps_per_generation: TRL takes gradient_accumulation_steps
    recipe.write_text("".join(f"{line}\n" for line in Path(STAPO_RECIPE).read_text().splitlines()
                              if not line.startswith("steps_per_generation")))  # fmt: skip
    cli = _cli_error(["--config", str(recipe), "--output_dir", str(tmp_path), "--gradient_accumulation_steps", "3",
                      "--per_device_train_batch_size", "4"])  # fmt: skip
    assert cli.startswith(
        f"--per_device_train_batch_size and --gradient_accumulation_steps (with recipe key num_generations in "
        f"{recipe}): num_generations=8 does not divide the generation batch (per_device_train_batch_size 4 x 1 "
        "process(es) x gradient_accumulation_steps 3 = 12 completions)"
    ), cli


def test_a_generation_batch_error_from_the_recipe_names_its_keys(tmp_path):
    recipe = Path(write_recipe(tmp_path, "per_device_train_batch_size: 12\nsteps_per_generation: 1"))
    cli = _cli_error(["--config", str(recipe), "--output_dir", str(tmp_path)])
    assert cli.startswith(
        f"recipe keys per_device_train_batch_size, num_generations, steps_per_generation in {recipe}: "
        "num_generations=8 does not divide"
    ) or cli.startswith(
        f"recipe keys num_generations, per_device_train_batch_size, steps_per_generation in {recipe}: "
    )
    assert cli.endswith("Fix the values in the recipe, or override them on the command line."), cli


# A flag typo: which flag is unknown, and which recipe key it resembles, without a "(recipe key(s) ...)" note.


@pytest.mark.parametrize(
    "typo, field",
    [
        ("learning_rat", "learning_rate"),
        ("num_generation", "num_generations"),
        ("s2t_prob_treshold", "s2t_prob_threshold"),
    ],
)
def test_a_flag_typo_names_the_flag_and_the_recipe_key_it_resembles(tmp_path, typo, field):
    cli = _cli_error(["--config", STAPO_RECIPE, "--output_dir", str(tmp_path), f"--{typo}", "1"])
    assert "(recipe key(s)" not in cli, cli
    assert f"--{typo}: did you mean {field}" in cli, cli
    assert f"{field} is a key of the recipe {STAPO_RECIPE} too: the flag --{field} overrides it" in cli, cli


def test_an_unknown_recipe_key_gets_no_note_about_the_recipe_keys_it_mentions(tmp_path):
    recipe = Path(write_recipe(tmp_path, "logging_strategy: steps\nlerning_rate: 1.0e-4"))
    cli = _cli_error(["--config", str(recipe), "--output_dir", str(tmp_path)])
    assert cli.startswith(f"Unknown key(s) in recipe {recipe}: lerning_rate: did you mean learning_rate"), cli
    assert "(recipe key(s)" not in cli, cli
