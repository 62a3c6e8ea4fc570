"""The benchmark evaluation during training (`benchmark_eval`): TRL's own `eval_strategy` on the benchmark's problems,
logged at the schedule asked for with the accuracy the model has; what TRL's evaluation cannot honour exactly is one
line before a model is built."""

import json
from types import SimpleNamespace

import pytest
from testing_utils import STAPO_RECIPE


ACCURACY = "eval_rewards/math_accuracy_reward/mean"


@pytest.mark.slow  # 4 steps and two evaluations of 128 completions: ~17 s
def test_benchmark_eval_logs_trls_evaluation_at_its_steps(tiny_math_model_path, tmp_path):
    from stapo_trl.cli.train import main

    out = tmp_path / "run"
    main([
        "--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--output_dir", str(out),
        # why: one rollout batch (4 updates), a log row every 2; no checkpoint, no before/after evaluation
        "--max_steps", "4", "--logging_steps", "2", "--save_strategy", "no", "--eval_before_after", "false",
        "--disable_tqdm", "true",
        # why: 32 problems x 4 samples in 8 full eval batches of 16 completions, at steps 2 and 4
        "--benchmark_eval", "tiny-math", "--benchmark_eval_steps", "2", "--benchmark_eval_limit", "32",
        "--benchmark_eval_samples", "4", "--per_device_eval_batch_size", "16",
    ])  # fmt: skip
    evals = [row for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if ACCURACY in row]
    history = [e for e in json.loads((out / "trainer_state.json").read_text())["log_history"] if ACCURACY in e]
    assert [row["step"] for row in evals] == [entry["step"] for entry in history] == [2, 4]
    for row, entry in zip(evals, history, strict=True):
        # avg@4 of the tiny model (~45 % sampled accuracy): 128 samples put it well inside [0.2, 0.75]; every
        # multiple of 1/128 is a possible avg@4 over full batches.
        assert 0.2 <= row[ACCURACY] <= 0.75 and (row[ACCURACY] * 128) == pytest.approx(round(row[ACCURACY] * 128))
        assert row[ACCURACY] == entry[ACCURACY] == row["eval_reward"]  # the one reward: eval_reward is avg@4
        assert row["eval_completions/mean_length"] > 10  # real completions of the addition, ~30 tokens


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["--benchmark_eval_limit", "31"], "31 problems x 4 samples do not fill whole eval batches of 8 completions"),
        (["--benchmark_eval_samples", "0"], "benchmark_eval_samples=0 must be >= 1"),
        (["--benchmark_eval", "aime99"], "Unknown benchmark 'aime99'. Valid benchmarks: aime24, "),
    ],
    ids=["partial-batch", "samples-0", "unknown"],
)  # fmt: skip
def test_what_trls_evaluation_cannot_honour_is_one_line_before_a_model(no_model_built, tmp_path, overrides, message):
    from stapo_trl.cli.train import main

    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), "--benchmark_eval", "tiny-math"]
    with pytest.raises(SystemExit) as excinfo:
        main([*argv, *overrides])
    assert str(excinfo.value).startswith("stapo-train: error: ") and message in str(excinfo.value), excinfo.value
    assert "\n" not in str(excinfo.value)


def test_the_refusals_name_the_setting_that_fills_the_batches():
    from stapo_trl.cli.dry_run import benchmark_eval_error

    script = SimpleNamespace(benchmark_eval="olympiadbench", benchmark_eval_samples=4, benchmark_eval_steps=None)
    config = SimpleNamespace(num_generations_eval=None, eval_strategy="no", per_device_eval_batch_size=8)
    # 675 x 4 = 2,700 completions in batches of 8 x 2 processes = 16: 675 problems need a multiple of 4 -> 672.
    error = benchmark_eval_error(script, config, 2, num_problems=675)
    assert error.endswith("set benchmark_eval_limit to a multiple of 4 (e.g. 672)."), error
    assert benchmark_eval_error(script, config, 2, num_problems=672) is None
    # k = 4 on 3 processes of 6: 18 completions do not hold whole groups; 4 / gcd(4, 3) = 4 per process does.
    config.per_device_eval_batch_size = 6
    assert benchmark_eval_error(script, config, 3).endswith("set per_device_eval_batch_size to a multiple of 4.")
    config.per_device_eval_batch_size, script.benchmark_eval_samples = 8, 3  # k = 3 does not divide 8 x 1
    divide = "benchmark_eval_samples=3 must divide the global eval batch (per_device_eval_batch_size 8 x 1 process(es)"
    assert divide + " = 8 completions" in benchmark_eval_error(script, config, 1)
    script.benchmark_eval_samples, config.num_generations_eval = 4, 8
    assert "benchmark_eval_samples=4 and num_generations_eval=8 disagree" in benchmark_eval_error(script, config, 1)
    config.num_generations_eval, config.eval_strategy, script.benchmark_eval_steps = None, "epoch", 2
    assert "eval_strategy is 'epoch': remove one of them" in benchmark_eval_error(script, config, 1)
