"""`stapo-train --dry-run`: the batch geometry by hand, the plan's numbers, and what the run refuses it refuses."""

from __future__ import annotations

import pytest
from testing_utils import RECIPES_DIR, STAPO_RECIPE, addition_rows, error_line, write_jsonl

from stapo_trl import STAPOConfig
from stapo_trl.cli.args import parse_args
from stapo_trl.cli.dry_run import S2T_PATHS, DryRunReport, dry_run_recipe
from stapo_trl.cli.dry_run import main as dry_run_main
from stapo_trl.cli.train import main
from stapo_trl.core.stapo_config import s2t_path, s2t_settings, s2t_warnings
from stapo_trl.rewards import REWARDS


DEMO = ["--config", STAPO_RECIPE, "--max_train_samples", "64"]  # why: 64 prompts are counted in a blink, 7,800 not
QWEN3_8B = str(RECIPES_DIR / "Qwen3-8B" / "stapo.yaml")  # launch line: 8 processes, ZeRO-3


# The demo recipe: 16 completions x steps_per_generation 4 = 64 per rollout step, 8 per prompt: 8 prompts per step.
@pytest.mark.parametrize("num_rows, extra, match", [
        (7, [], r"7 prompts in the train split; one rollout step needs 8 "),
        (20, ["--max_train_samples", "3"], r"3 prompts with max_train_samples; one rollout step needs 8 "),
        # 2 processes' worth of rollout: per_device 16 x steps_per_generation 8 = 128 completions = 16 prompts
        (10, ["--steps_per_generation", "8"], r"10 prompts in the train split; one rollout step needs 16 "),
])  # fmt: skip
def test_too_few_prompts_fail_in_the_run_and_the_dry_run(no_model_built, tmp_path, num_rows, extra, match, capsys):
    data = write_jsonl(tmp_path / "few.jsonl", addition_rows(num_rows))
    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), "--dataset_name", data, *extra]
    with pytest.raises(SystemExit, match=r"^stapo-train: error: " + match) as excinfo:
        main(argv)
    assert excinfo.value.code == 2 and not (tmp_path / "out").exists()
    assert dry_run_main(argv) == 2  # a failed check is an input error: status 2
    assert len([line for line in capsys.readouterr().out.splitlines() if "one rollout step needs" in line]) == 1


@pytest.mark.parametrize("case, expected", [
        ("user-files", "holds files that are not a run's (notes.txt)"),
        ("reward-column", "Column 'difficulty' not found in dataset 'builtin:tiny-math'"),
        ("dataset-folder", "b.jsonl line 2 is not a JSON object"),
])  # fmt: skip
def test_the_dry_run_refuses_what_the_run_refuses_before_the_model(
    no_model_built, tmp_path, monkeypatch, capsys, case, expected
):
    monkeypatch.chdir(tmp_path)
    argv = [*DEMO, "--output_dir", str(tmp_path / "out")]
    if case == "user-files":
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "notes.txt").write_text("mine")
    elif case == "reward-column":
        (tmp_path / "my_rewards.py").write_text("def hard(completions, difficulty, **kwargs):\n    return difficulty")
        argv += ["--reward_funcs", "my_rewards.hard"]
    else:
        write_jsonl((tmp_path / "data").mkdir() or tmp_path / "data" / "a.jsonl", addition_rows(8))
        (tmp_path / "data" / "b.jsonl").write_text('{"problem": "1+1", "answer": "2"}\nnot json\n')
        argv += ["--dataset_name", str(tmp_path / "data")]
    with pytest.raises(SystemExit) as excinfo:
        main(argv)
    assert excinfo.value.code == 2 and expected in error_line(capsys, "stapo-train")
    assert dry_run_main(argv) == 2 and expected in error_line(capsys, "stapo-train --dry-run")


def test_the_plans_numbers_by_hand_and_the_valid_values_of_a_batch_that_does_not_fit(tmp_path, capsys):
    report = dry_run_recipe(DEMO, 2)  # 16 completions x 2 processes x steps_per_generation 4 = 16 prompts of 8
    assert (report.generation_batch_size, report.prompts_per_rollout_step) == (128, 16)
    assert (report.completions_per_optimizer_step, report.optimizer_steps_per_rollout_step) == (32, 4)
    # no max_prompt_tokens: 512 positions - max_completion_length 48 bound a prompt: 32 x (464 + 48) tokens per update
    rows = dict(report.lines)
    assert rows["prompt length"] == "0 of 64 training prompts exceed 464 tokens and will be dropped"
    assert rows["max tokens"].startswith("16,384 per optimizer update = 32 x (464 prompt + 48 completion)")
    assert "builtin:tiny-math split train, columns 'problem' -> 'answer' (checked: 64 rows)" in rows["data"]
    report = dry_run_recipe([*DEMO, "--model_name_or_path", "Qwen/Qwen3-1.7B-Base"], 2)  # a Hub id: not counted
    assert dict(report.lines)["max tokens"] == "unbounded prompts; completions alone up to 1,536 per update"
    assert all(label in report.summary() for label in ("rollout step", "optimizer update", "updates / rollout", "OK"))
    unset = DryRunReport(3, 1, 2, 4)  # steps_per_generation unset: gradient_accumulation_steps, 3 x 1 x 2
    assert (unset.steps_per_generation, unset.generation_batch_size, unset.prompts_per_rollout_step) == (2, 6, 1.5)
    # a fixed generation_batch_size 48 on 4 x 2 completions wins: 6 micro-steps of 8 prompts, 6 / 3 = 2 updates
    fixed = DryRunReport(4, 2, 3, 6, steps_per_generation=9, generation_batch_size=48)
    assert (fixed.steps_per_generation, fixed.prompts_per_rollout_step, fixed.optimizer_steps_per_rollout_step) == (
        6, 8, 2)  # fmt: skip
    # generation_batch_size 64 with 16 completions per device: 3 processes (48) do not divide it; 1, 2 or 4 would.
    fixed = tmp_path / "fixed_generation_batch.yaml"
    text = [line for line in open(STAPO_RECIPE).read().splitlines() if not line.startswith(("steps_per", "   "))]
    fixed.write_text("\n".join([*text, "generation_batch_size: 64", "max_train_samples: 64"]))
    assert dry_run_recipe(["--config", str(fixed)], 2).ok
    assert "Valid process counts for this batch: [1, 2, 4]" in dry_run_recipe(["--config", str(fixed)], 3).errors[0]
    # the CLI: a bad --num-processes, then the 8B recipe on 2 nodes (the recipe's launch line: 8 processes)
    assert dry_run_main([*DEMO, "--num-processes", "0"]) == 2
    line = error_line(capsys, "stapo-train --dry-run")
    assert line.startswith("stapo-train --dry-run: error: --num-processes: 0 is not a number of training processes")
    argv = ["--config", QWEN3_8B, "--num-processes", "16", "--gradient_accumulation_steps", "32"]
    assert dry_run_main([*argv, "--steps_per_generation", "128"]) == 0
    out = capsys.readouterr().out
    assert "for 16 training process(es): OK" in out and "256 prompts x 8 generations" in out
    assert "8,388,608 per optimizer update" in out  # 512 x (1024 + 15360)
    # TRL's evaluation generates on every rank: samples per problem divide the launch line's 8 x 8 eval completions.
    argv = ["--config", QWEN3_8B, "--benchmark_eval", "aime24"]
    assert (report := dry_run_recipe(argv)).ok and report.num_processes == 8, report.summary()
    (error,) = dry_run_recipe([*argv, "--benchmark_eval_samples", "3"]).errors
    assert error.startswith("benchmark_eval_samples=3 must divide the global eval batch (per_device_eval_batch_size ")
    assert "set per_device_eval_batch_size to a multiple of 3." in error and "\n" not in error, error


@pytest.mark.parametrize("flags, path, warns", [
        (("--loss_type", "dr_grpo"), "old_logps", True),
        (("--loss_type", "vespo", "--entropy_coef", "0.01"), "old_logps", True),
        (("--temperature", "0.7", "--top_entropy_quantile", "0.2"), "old_logps", True),
        (("--steps_per_generation", "1", "--gradient_accumulation_steps", "1"), "loss", False),
        (("--steps_per_generation", "2", "--gradient_accumulation_steps", "2"), "extra_forward", False),
        (("--steps_per_generation", "2", "--gradient_accumulation_steps", "2", "--num_iterations", "2"), "old_logps",
         False),
])  # fmt: skip
def test_dry_run_gives_the_trainers_warnings_and_where_p_and_h_come_from(flags, path, warns):
    # Every warning of the trainer's construction is in the plan, and the mask's source is the trainer's decision.
    _, args, _ = parse_args([*DEMO, *flags])
    expected = s2t_warnings(args, s2t_settings(args, STAPOConfig._s2t_modes))
    assert bool(expected) == warns and s2t_path(args) == path  # the trainer's decision (`STAPOTrainer._s2t_path`)
    report = dry_run_recipe([*DEMO, *flags], 1)
    assert [w for w in report.warnings if w in expected] == expected, report.warnings
    assert dict(report.lines)["S2T p and H"] == S2T_PATHS[path]
    if flags[:2] == ("--temperature", "0.7"):  # and with a reward that does not exist, every failure at once
        report = dry_run_recipe([*DEMO, *flags, "--reward_funcs", "math_accuracy", "no_such_reward"], 1)
        assert any("no_such_reward" in e and str(sorted(REWARDS)) in e for e in report.errors), report.errors
        assert any("temperature=0.7" in w and "1.0" in w for w in report.warnings), report.warnings


@pytest.mark.parametrize("flags, expected", [
        (["--prompt_column", "question"], "Column 'problem' not found in dataset"),
        (["--dataset_name", "builtin:no-such-task"], "No built-in dataset 'builtin:no-such-task' with a split"),
        (["--dataset_train_split", "validation"], "No built-in dataset 'builtin:tiny-math' with a split 'validation'"),
])  # fmt: skip
def test_dry_run_reads_the_data_as_stapo_train_does(tmp_path, flags, expected):
    data = write_jsonl(tmp_path / "train.jsonl", [{"question": f"{i}+1", "answer": str(i + 1)} for i in range(8)])
    local = flags[0] == "--prompt_column"  # the demo's columns are problem -> answer: the file's question -> answer
    (error,) = dry_run_recipe([*DEMO, *(["--dataset_name", data] if local else flags)], 1).errors
    assert error.startswith("dataset_name=") and expected in error and ("['question', 'answer']" in error or not local)
    if local:
        report = dry_run_recipe([*DEMO, "--dataset_name", data, *flags], 1)
        assert report.ok and "checked: 8 rows" in report.summary(), report.errors
