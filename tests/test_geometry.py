"""The batch geometry (`stapo_trl.cli.geometry.BatchGeometry`): hand-computed sizes, the num_generations rule, and
the rows of the recipes/README.md tables."""

from pathlib import Path

from stapo_trl.cli.geometry import BatchGeometry


RECIPES_README = Path(__file__).resolve().parent.parent / "recipes" / "README.md"


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
