"""`benchmark_eval`: what TRL's evaluation cannot honour exactly is one line before a model is built."""

from types import SimpleNamespace

import pytest
from testing_utils import STAPO_RECIPE

from stapo_trl.cli.dry_run import benchmark_eval_error
from stapo_trl.cli.train import main


def test_what_trls_evaluation_cannot_honour_is_one_line_naming_the_setting(no_model_built, tmp_path):
    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), "--benchmark_eval", "tiny-math"]
    for overrides, message in [
        (["--benchmark_eval_limit", "31"], "31 problems x 4 samples do not fill whole eval batches of 8 completions"),
        (["--benchmark_eval_samples", "0"], "benchmark_eval_samples=0 must be >= 1"),
    ]:  # fmt: skip
        with pytest.raises(SystemExit) as excinfo:
            main([*argv, *overrides])
        assert str(excinfo.value).startswith("stapo-train: error: ") and message in str(excinfo.value), excinfo.value
        assert "\n" not in str(excinfo.value)
    for script, config, processes, problems, expected in [
        # 675 x 4 = 2,700 completions in batches of 8 x 2 processes = 16: 675 problems need a multiple of 4 -> 672.
        ({}, {}, 2, 675, "set benchmark_eval_limit to a multiple of 4 (e.g. 672)."), ({}, {}, 2, 672, None),
        # k = 4 on 3 processes of 6: 18 completions do not hold whole groups; 4 / gcd(4, 3) = 4 per process does.
        ({}, {"per_device_eval_batch_size": 6}, 3, None, "set per_device_eval_batch_size to a multiple of 4."),
        ({"benchmark_eval_samples": 3}, {}, 1, None, "benchmark_eval_samples=3 must divide the global eval batch "
         "(per_device_eval_batch_size 8 x 1 process(es) = 8 completions"),
        ({}, {"num_generations_eval": 8}, 1, None, "benchmark_eval_samples=4 and num_generations_eval=8 disagree"),
        ({"benchmark_eval_steps": 2}, {"eval_strategy": "epoch"}, 1, None,
         "eval_strategy is 'epoch': remove one of them"),
    ]:  # fmt: skip
        s = dict(benchmark_eval="olympiadbench", benchmark_eval_samples=4, benchmark_eval_steps=None) | script
        a = dict(num_generations_eval=None, eval_strategy="no", per_device_eval_batch_size=8) | config
        error = benchmark_eval_error(SimpleNamespace(**s), SimpleNamespace(**a), processes, num_problems=problems)
        assert error is None if expected is None else expected in error, error
