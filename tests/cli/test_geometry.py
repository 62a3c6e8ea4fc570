"""The batch geometry (`stapo_trl.cli.geometry.BatchGeometry`): hand-computed sizes, the num_generations rule, the
rows of the recipes/README.md tables, and a dataset too small for one rollout step, refused before any model is
built."""

import pytest
from testing_utils import RECIPES_DIR, STAPO_RECIPE, addition_rows, write_jsonl

from stapo_trl.cli.geometry import BatchGeometry


RECIPES_README = RECIPES_DIR / "README.md"


def test_paper_geometry_of_the_1_7b_recipe_on_4_processes():
    # 2 completions x 4 processes = 8 per micro-step; x 64 accumulation steps = 512 per update (64 prompts x 8);
    # x 256 steps per generation = 2048 per rollout step (256 prompts x 8): STAPO Sec. 4.1, 4 updates per rollout.
    geometry = BatchGeometry(
        per_device_train_batch_size=2,
        num_processes=4,
        gradient_accumulation_steps=64,
        num_generations=8,
        steps_per_generation=256,
    )
    assert geometry.global_micro_batch == 8
    assert geometry.generation_batch == 2048 and geometry.prompts_per_rollout_step == 256
    assert geometry.completions_per_optimizer_step == 512 and geometry.prompts_per_optimizer_step == 64
    assert geometry.optimizer_steps_per_rollout_step == 4
    assert geometry.holds_whole_groups and geometry.is_paper_geometry()
    assert geometry.readme_row() == "| 4 | 2 | 64 | 256 |"
    assert geometry.readme_row() in RECIPES_README.read_text()


def test_steps_per_generation_defaults_to_gradient_accumulation_and_lists_valid_group_sizes():
    # 3 x 1 process x 2 steps (steps_per_generation unset -> gradient_accumulation_steps) = 6 completions:
    # groups of 4 do not fit; the divisors of 6 from 2 do.
    geometry = BatchGeometry(
        per_device_train_batch_size=3, num_processes=1, gradient_accumulation_steps=2, num_generations=4
    )
    assert geometry.micro_steps_per_generation == 2 and geometry.generation_batch == 6
    assert not geometry.holds_whole_groups
    assert geometry.valid_num_generations() == [2, 3, 6]
    assert not geometry.is_paper_geometry()


def test_a_fixed_generation_batch_size_wins_over_steps_per_generation():
    # generation_batch_size 48 on 4 x 2 = 8 completions per micro-step: 6 micro-steps per rollout whatever
    # steps_per_generation says; 48 completions hold groups of 6 (8 prompts) but not of 5.
    fixed = dict(per_device_train_batch_size=4, num_processes=2, gradient_accumulation_steps=3, steps_per_generation=9)
    assert BatchGeometry(**fixed, num_generations=6, generation_batch_size=48).micro_steps_per_generation == 6
    assert BatchGeometry(**fixed, num_generations=6, generation_batch_size=48).prompts_per_rollout_step == 8
    five = BatchGeometry(**fixed, num_generations=5, generation_batch_size=48)
    assert not five.holds_whole_groups
    assert five.valid_num_generations() == [2, 3, 4, 6, 8, 12, 16, 24, 48]
    assert five.optimizer_steps_per_rollout_step == 2  # 6 micro-steps / 3 accumulation steps


# The demo recipe: 16 completions per micro-step x steps_per_generation 4 = 64 completions per rollout step, 8 per
# prompt, so one rollout step takes 64 / 8 = 8 prompts; TRL's sampler drops a partial rollout batch (0 steps).
@pytest.mark.parametrize(
    "num_rows, extra, match",
    [
        (1, [], r"1 prompt in the train split; one rollout step needs 8 "),
        (7, [], r"7 prompts in the train split; one rollout step needs 8 "),
        # 20 rows, 3 kept: max_train_samples counts
        (20, ["--max_train_samples", "3"], r"3 prompts with max_train_samples; one rollout step needs 8 "),
        # 2 processes' worth of rollout: per_device 16 x steps_per_generation 8 = 128 completions = 16 prompts
        (10, ["--steps_per_generation", "8"], r"10 prompts in the train split; one rollout step needs 16 "),
    ],
    ids=["one-row", "seven-rows", "max-train-samples", "bigger-rollout"],
)
def test_too_few_prompts_fail_before_the_model_and_in_the_dry_run(
    no_model_built, tmp_path, num_rows, extra, match, capsys
):
    from stapo_trl.cli.dry_run import main as dry_run_main
    from stapo_trl.cli.train import main

    data = write_jsonl(tmp_path / "few.jsonl", addition_rows(num_rows))
    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), "--dataset_name", data, *extra]
    with pytest.raises(SystemExit, match=r"^stapo-train: error: " + match):
        main(argv)
    assert not (tmp_path / "out").exists()
    assert dry_run_main(argv) == 2  # a failed check is an input error: status 2
    assert len([line for line in capsys.readouterr().out.splitlines() if "one rollout step needs" in line]) == 1
