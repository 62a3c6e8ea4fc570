"""Results tables (`stapo_trl.evaluation.results`): the paper's benchmark columns, the relative gain of two files,
an average over the benchmarks both have, marked when incomplete, and the settings that differ."""

from testing_utils import fake_eval_results

from stapo_trl.evaluation.results import format_comparison, format_results_table


def test_tables_and_relative_gain():
    six = ["aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench"]
    a = fake_eval_results("grpo", dict(zip(six, [0.1, 0.1, 0.4, 0.6, 0.2, 0.4])))  # Avg 0.30
    b = fake_eval_results("stapo", dict(zip(six, [0.2, 0.1, 0.5, 0.6, 0.2, 0.5])))  # Avg 0.35
    table = format_results_table([a, b])
    assert table.splitlines()[0] == "| Model | AIME24 | AIME25 | AMC23 | MATH-500 | Minerva | OlympiadBench | Avg |"
    assert "| grpo/t1.0-p1.0 | 10.0 | 10.0 | 40.0 | 60.0 | 20.0 | 40.0 | 30.0 |" in table
    comparison = format_comparison(a, b)
    # (b - a) / a: AIME24 (0.2 - 0.1) / 0.1 = +100 %, Avg (0.35 - 0.30) / 0.30 = +16.7 %.
    assert "| rel. gain (b-a)/a | +100.0% | +0.0% | +25.0% | +0.0% | +0.0% | +25.0% | +16.7% |" in comparison


def test_incomplete_average_is_marked():
    table = format_results_table([fake_eval_results("m", {"aime24": 0.5})])
    assert "| m/t1.0-p1.0 | 50.0 | 50.0* |" in table


def test_comparison_averages_the_shared_benchmarks_and_lists_what_differs():
    a = fake_eval_results("grpo", {"aime24": 0.1, "amc23": 0.4, "math500": 0.6})
    b = fake_eval_results("stapo", {"aime24": 0.2, "amc23": 0.5})  # no MATH-500
    a["config"], b["config"] = {"max_new_tokens": 32, "limit": 3}, {"max_new_tokens": 16, "limit": 3}
    b["results"]["t1.0-p1.0"]["aime24"] = {"avg@2": 0.2, "n_samples": 2, "pass@k": {}}
    comparison = format_comparison(a, b)
    # Avg over AIME24 and AMC23 only, for both rows: a 0.25, b 0.35 -> +40 %; MATH-500 has no gain.
    assert "| grpo/t1.0-p1.0 | 10.0 | 40.0 | 60.0 | 25.0* |" in comparison
    assert "| stapo/t1.0-p1.0 | 20.0 | 50.0 | - | 35.0* |" in comparison
    assert "| rel. gain (b-a)/a | +100.0% | +25.0% | n/a | +40.0% |" in comparison
    assert "Avg over the 2 paper benchmark(s) both files have: aime24, amc23." in comparison
    assert "max_new_tokens: 32 vs 16" in comparison and "aime24 / t1.0-p1.0: 4 vs 2 samples" in comparison
    assert "limit" not in comparison.split("Not like for like")[1]  # equal settings are not listed
