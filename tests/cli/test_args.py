"""Parsing a `stapo-train` command line (`stapo_trl.cli.args`, `stapo_trl.cli.script_args`,
`stapo_trl.cli.recipe_parser`): the recipe and the flags that override it, the script arguments' help, the defaults a
`trainer: grpo` recipe gets, and one-line errors for unknown keys, misspelt flags and malformed recipes. No model is
built."""

from __future__ import annotations

from pathlib import Path

import pytest
from testing_utils import GRPO_RECIPE, STAPO_RECIPE, write_recipe


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
        parse_args(["--config", write_recipe(tmp_path, key)])
    assert key.split(":")[0] in str(excinfo.value) and expected in str(excinfo.value)


def test_unknown_command_line_flag_gets_the_same_message(tmp_path):
    from stapo_trl.cli.args import parse_args

    with pytest.raises(ValueError, match="Unknown key.*the command line") as excinfo:
        parse_args(["--config", write_recipe(tmp_path, "seed: 1"), "--s2t_prob_treshold", "0.1"])
    assert "did you mean s2t_prob_threshold" in str(excinfo.value)


def test_s2t_keys_are_rejected_with_trainer_grpo(tmp_path):
    from stapo_trl.cli.args import parse_args

    # The demo baseline with plain TRL (`trainer: grpo`) instead of STAPOTrainer with the mask off.
    plain = tmp_path / "plain.yaml"
    lines = Path(GRPO_RECIPE).read_text().replace("trainer: stapo ", "trainer: grpo ").splitlines()
    plain.write_text("\n".join(line for line in lines if not line.startswith("s2t_")))
    with pytest.raises(ValueError, match="s2t_mode: .*plain GRPOTrainer"):
        parse_args(["--config", write_recipe(tmp_path, 's2t_mode: "off"', base=str(plain))])
    with pytest.raises(ValueError, match="s2t_prob_threshold: .*plain GRPOTrainer"):
        parse_args(["--config", str(plain), "--s2t_prob_threshold", "0.01"])


def test_num_generations_not_dividing_the_generation_batch_lists_valid_values():
    from stapo_trl.cli.args import parse_args

    # Generation batch = 16 completions x 1 process x 4 steps = 64; 7 does not divide it.
    with pytest.raises(ValueError, match="num_generations=7") as excinfo:
        parse_args(["--config", STAPO_RECIPE, "--num_generations", "7"])
    assert "[2, 4, 8, 16, 32, 64]" in str(excinfo.value)


def test_malformed_recipe_and_misspelt_config_flag_get_one_line_errors(no_model_built, tmp_path, capsys):
    from stapo_trl.cli.train import main

    broken = write_recipe(tmp_path, "learning_rate: [1e-4\n")  # an unclosed list at the end of the demo recipe
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
