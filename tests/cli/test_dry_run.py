"""`stapo-train --dry-run` (`stapo_trl.cli.dry_run`): the batch geometry, hand-computed; the numbers it prints, the
valid values it lists when the geometry does not fit, a dataset too small for one rollout step, the trainer's own
construction warnings, a local dataset's columns, what cannot run under a launch line's ZeRO-3, and its command line.
The recipes' own dry runs are in `tests/recipes/`."""

from __future__ import annotations

import pytest
from testing_utils import RECIPES_DIR, STAPO_RECIPE, addition_rows, error_line, tiny_stapo_config, write_jsonl

from stapo_trl.cli.dry_run import DryRunReport


def test_paper_geometry_of_the_1_7b_recipe_on_4_processes():
    # 2 completions x 4 processes = 8 per micro-step; x 64 accumulation steps = 512 per update (64 prompts x 8);
    # x 256 steps per generation = 2048 per rollout step (256 prompts x 8): STAPO Sec. 4.1, 4 updates per rollout.
    geometry = DryRunReport(2, 4, 64, 8, steps_per_generation=256)
    assert geometry.global_micro_batch == 8
    assert geometry.generation_batch_size == 2048 and geometry.prompts_per_rollout_step == 256
    assert geometry.completions_per_optimizer_step == 512 and geometry.prompts_per_optimizer_step == 64
    assert geometry.optimizer_steps_per_rollout_step == 4
    assert "| 4 | 2 | 64 | 256 |" in (RECIPES_DIR / "README.md").read_text()


def test_steps_per_generation_defaults_to_gradient_accumulation_and_a_fixed_batch_wins():
    # 3 x 1 process x 2 steps (steps_per_generation unset -> gradient_accumulation_steps) = 6 completions: groups of
    # 4 do not fit; the config's check lists the divisors of 6 from 2.
    geometry = DryRunReport(3, 1, 2, 4)
    assert geometry.steps_per_generation == 2 and geometry.generation_batch_size == 6
    with pytest.raises(ValueError, match=r"Valid num_generations for this batch: \[2, 3, 6\]"):
        tiny_stapo_config("unused", num_generations=4, per_device_train_batch_size=3, gradient_accumulation_steps=2)
    # generation_batch_size 48 on 4 x 2 = 8 completions per micro-step: 6 micro-steps per rollout whatever
    # steps_per_generation says; 48 completions = 8 prompts of 6; 6 micro-steps / 3 accumulation steps = 2 updates.
    fixed = DryRunReport(4, 2, 3, 6, steps_per_generation=9, generation_batch_size=48)
    assert fixed.steps_per_generation == 6 and fixed.prompts_per_rollout_step == 8
    assert fixed.optimizer_steps_per_rollout_step == 2


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


def test_dry_run_refuses_zero_processes_by_its_flag(capsys):
    from stapo_trl.cli.dry_run import main as dry_run_main

    assert dry_run_main(["--config", STAPO_RECIPE, "--num-processes", "0"]) == 2
    assert error_line(capsys, "stapo-train --dry-run").startswith(
        "stapo-train --dry-run: error: --num-processes: 0 is not a number of training processes"
    )


DEMO = ["--config", str(RECIPES_DIR / "demo" / "stapo.yaml")]


def test_dry_run_lists_valid_values_when_the_generation_batch_does_not_fit(tmp_path):
    from stapo_trl.cli.dry_run import dry_run_recipe

    # A recipe that fixes generation_batch_size = 64 with 16 completions per device: 3 processes give a global
    # micro-batch of 48, which does not divide 64; 1, 2 or 4 processes would.
    recipe = tmp_path / "fixed_generation_batch.yaml"
    text = (RECIPES_DIR / "demo" / "stapo.yaml").read_text()
    text = "\n".join(line for line in text.splitlines() if not line.startswith(("steps_per_generation", "   ")))
    recipe.write_text(text + "\ngeneration_batch_size: 64\n")
    assert dry_run_recipe(["--config", str(recipe)], 2).ok
    report = dry_run_recipe(["--config", str(recipe)], 3)
    assert not report.ok
    assert "Valid process counts for this batch: [1, 2, 4]" in report.errors[0], report.errors


def test_dry_run_reports_bad_rewards_and_temperature():
    from stapo_trl.cli.dry_run import dry_run_recipe
    from stapo_trl.rewards import REWARDS

    report = dry_run_recipe([*DEMO, "--temperature", "0.7", "--reward_funcs", "math_accuracy", "no_such_reward"], 1)
    assert not report.ok
    assert any("no_such_reward" in e and str(sorted(REWARDS)) in e for e in report.errors), report.errors
    assert any("temperature=0.7" in w and "1.0" in w for w in report.warnings), report.warnings


@pytest.mark.parametrize(
    "flags",
    [
        ("--loss_type", "dr_grpo"),
        ("--loss_type", "vespo"),
        ("--entropy_coef", "0.01"),
        ("--temperature", "0.7", "--top_entropy_quantile", "0.2"),
    ],
)
def test_dry_run_prints_exactly_the_trainers_construction_warnings(flags):
    # One source: the dry run used to repeat one of the trainer's warnings, so a dr_grpo recipe passed it quietly.
    # Every message the trainer warns at construction (the core's and the product's) is in the dry run's report.
    from stapo_trl import STAPOConfig
    from stapo_trl.cli.args import parse_args
    from stapo_trl.cli.dry_run import dry_run_recipe
    from stapo_trl.core.stapo_config import s2t_settings, s2t_warnings

    _, args, _ = parse_args([*DEMO, *flags])
    expected = s2t_warnings(args, s2t_settings(args, STAPOConfig._s2t_modes))
    assert expected  # each of these settings has something to say
    report = dry_run_recipe([*DEMO, *flags], 1)
    assert [w for w in report.warnings if w in expected] == expected, report.warnings


def test_dry_run_opens_a_local_dataset_file_and_checks_its_columns(tmp_path):
    from stapo_trl.cli.dry_run import dry_run_recipe

    data = tmp_path / "train.jsonl"
    # 8 rows: one rollout step of the demo (64 completions / 8 per prompt)
    data.write_text("".join(f'{{"question": "{i}+1", "answer": "{i + 1}"}}\n' for i in range(8)))
    report = dry_run_recipe([*DEMO, "--dataset_name", str(data)], 1)  # the demo's columns: problem -> solution
    assert not report.ok
    assert any("Column 'problem' not found" in e and "['question', 'answer']" in e for e in report.errors)
    report = dry_run_recipe([*DEMO, "--dataset_name", str(data), "--prompt_column", "question"], 1)
    assert report.ok, report.errors
    assert "checked: 8 rows" in report.summary()


def test_dry_run_numbers_for_the_demo():
    from stapo_trl.cli.dry_run import dry_run_recipe

    report = dry_run_recipe(DEMO, 2)
    # 16 completions per device x 2 processes x steps_per_generation 4 = 128 completions = 16 prompts of 8.
    assert report.generation_batch_size == 128 and report.prompts_per_rollout_step == 16
    assert report.completions_per_optimizer_step == 32 and report.optimizer_steps_per_rollout_step == 4
    # no max_prompt_tokens: the model's 512 positions less max_completion_length 48 bound a prompt (longer ones are
    # dropped), so 32 completions x (464 + 48) tokens per update
    assert dict(report.lines)["prompt length"].endswith("exceed 464 tokens and will be dropped")
    assert dict(report.lines)["max tokens"].startswith(
        "16,384 per optimizer update = 32 x (464 prompt + 48 completion)"
    )
    report = dry_run_recipe([*DEMO, "--model_name_or_path", "Qwen/Qwen3-1.7B-Base"], 2)  # a Hub id: not counted here
    assert dict(report.lines)["max tokens"] == "unbounded prompts; completions alone up to 1,536 per update"
    summary = report.summary()
    for text in ("rollout step", "optimizer update", "updates / rollout", "max tokens", "2 training process(es): OK"):
        assert text in summary, summary


def test_dry_run_checks_benchmark_eval_for_the_launch_lines_processes():
    from stapo_trl.cli.dry_run import dry_run_recipe

    # TRL's evaluation generates on every rank: benchmark_eval runs under the 8B recipe's ZeRO-3 as under ZeRO-2. Its
    # samples per problem must divide the global eval batch of the launch line's processes (8 x 8 = 64 completions).
    for model, launch in (("Qwen3-8B", "zero3"), ("Qwen3-1.7B", "zero2")):
        recipe = RECIPES_DIR / model / "stapo.yaml"
        assert f"accelerate_config={launch} " in recipe.read_text()
        assert dry_run_recipe(["--config", str(recipe), "--benchmark_eval", "aime24"]).ok
    recipe = str(RECIPES_DIR / "Qwen3-8B" / "stapo.yaml")
    report = dry_run_recipe(["--config", recipe, "--benchmark_eval", "aime24", "--benchmark_eval_samples", "3"])
    (error,) = report.errors
    assert error.startswith("benchmark_eval_samples=3 must divide the global eval batch (per_device_eval_batch_size ")
    assert "set per_device_eval_batch_size to a multiple of 3." in error and "\n" not in error, error


def test_dry_run_cli_paths(capsys):
    from stapo_trl.cli.dry_run import main as dry_run_main
    from stapo_trl.cli.train import main as train_main

    recipe = str(RECIPES_DIR / "Qwen3-8B" / "stapo.yaml")
    assert dry_run_main(["--config", recipe, "--num-processes", "16", "--gradient_accumulation_steps", "32",
                         "--steps_per_generation", "128"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "for 16 training process(es): OK" in out and "256 prompts x 8 generations" in out
    assert "8,388,608 per optimizer update" in out  # 512 x (1024 + 15360)
    # stapo-train --dry-run goes to the same function and exits with its status.
    with pytest.raises(SystemExit) as exit_info:
        train_main(["--config", recipe, "--dry-run"])
    assert exit_info.value.code == 0
    assert "for 8 training process(es): OK" in capsys.readouterr().out
    # An unknown key does not parse: status 2 with the parser's message.
    assert dry_run_main(["--config", recipe, "--no_such_key", "1"]) == 2
    assert "no_such_key" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, path",
    [
        (("--steps_per_generation", "1", "--gradient_accumulation_steps", "1"), "loss"),
        (("--steps_per_generation", "2", "--gradient_accumulation_steps", "2"), "extra_forward"),
        (("--steps_per_generation", "4", "--gradient_accumulation_steps", "1"), "old_logps"),
        (("--steps_per_generation", "2", "--gradient_accumulation_steps", "2", "--num_iterations", "2"), "old_logps"),
    ],
)
def test_dry_run_says_where_p_and_h_come_from_as_the_trainer_decides(flags, path):
    from stapo_trl.cli.args import parse_args
    from stapo_trl.cli.dry_run import S2T_PATHS, dry_run_recipe
    from stapo_trl.core.stapo_config import s2t_path

    _, args, _ = parse_args([*DEMO, *flags])
    assert s2t_path(args) == path  # the trainer's decision (`STAPOTrainer._s2t_path`)
    report = dry_run_recipe([*DEMO, *flags], 1)
    assert dict(report.lines)["S2T p and H"] == S2T_PATHS[path]


@pytest.mark.parametrize(
    "flags, expected",
    [
        (
            ["--dataset_name", "builtin:no-such-task"],
            "No built-in dataset 'builtin:no-such-task' with a split 'train'; built-in datasets: builtin:tiny-math",
        ),
        (["--dataset_train_split", "validation"], "No built-in dataset 'builtin:tiny-math' with a split 'validation'"),
    ],
    ids=["unknown-task", "unknown-split"],
)
def test_dry_run_reads_a_builtin_dataset_as_stapo_train_does(flags, expected):
    # The dry run loads the training prompts with stapo-train's own loader: an unknown split of a built-in task is
    # refused (it was counted as no rows and passed), with the loader's message behind the field.
    from stapo_trl.cli.dry_run import dry_run_recipe

    report = dry_run_recipe([*DEMO, *flags], 1)
    (error,) = report.errors
    assert error.startswith("dataset_name='builtin:") and expected in error, error


@pytest.mark.parametrize(
    "case, expected",
    [
        # The dry run re-implemented the run's checks and missed these: it passed what the run then refused.
        ("user-files", "holds files that are not a run's (notes.txt)"),
        ("reward-column", "Column 'difficulty' not found in dataset 'builtin:tiny-math'"),
        ("dataset-folder", "b.jsonl line 2 is not a JSON object"),
    ],
)
def test_the_dry_run_refuses_what_the_run_refuses_before_the_model(
    no_model_built, tmp_path, monkeypatch, capsys, case, expected
):
    from stapo_trl.cli.dry_run import main as dry_run_main
    from stapo_trl.cli.train import main

    monkeypatch.chdir(tmp_path)
    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out")]
    if case == "user-files":
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "notes.txt").write_text("mine")
    elif case == "reward-column":
        (tmp_path / "my_rewards.py").write_text(
            "def hard(completions, difficulty, **kwargs):\n    return difficulty\n"
        )
        argv += ["--reward_funcs", "my_rewards.hard"]
    else:
        (tmp_path / "data").mkdir()
        write_jsonl(tmp_path / "data" / "a.jsonl", addition_rows(8))
        (tmp_path / "data" / "b.jsonl").write_text('{"problem": "1+1", "answer": "2"}\nnot json\n')
        argv += ["--dataset_name", str(tmp_path / "data")]
    with pytest.raises(SystemExit) as excinfo:
        main(argv)
    assert excinfo.value.code == 2 and expected in error_line(capsys, "stapo-train")
    assert dry_run_main(argv) == 2
    assert expected in error_line(capsys, "stapo-train --dry-run")
