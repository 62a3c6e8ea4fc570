"""`benchmark_eval`: what TRL's evaluation cannot honour exactly is one line before a model is built (the run itself:
tests/cli/test_train.py)."""

from types import SimpleNamespace

import pytest
from testing_utils import STAPO_RECIPE


def test_what_trls_evaluation_cannot_honour_is_one_line_before_a_model(no_model_built, tmp_path):
    from stapo_trl.cli.train import main

    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), "--benchmark_eval", "tiny-math"]
    for overrides, message in [
        (["--benchmark_eval_limit", "31"], "31 problems x 4 samples do not fill whole eval batches of 8 completions"),
        (["--benchmark_eval_samples", "0"], "benchmark_eval_samples=0 must be >= 1"),
    ]:  # fmt: skip
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
