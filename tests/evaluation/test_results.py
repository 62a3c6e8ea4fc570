"""The results tables (paper's columns, relative gains, partial cells, `--limit`) and the one-line resume refusal."""

import os
from pathlib import Path

import pytest
from testing_utils import fake_eval_results

from stapo_trl.evaluation.results import check_resumable, describe_model, format_comparison, format_results_table


SIX = ["aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench"]


def _results(tables: dict, limit=None) -> dict:
    return {"model": {"name_or_path": "m", "source": "hub"}, "config": {"limit": limit}, "results": {"t1.0-p1.0": {
        name: {"avg@2": avg, "n_samples": 2, "num_problems": n, "num_problems_loaded": loaded}
        for name, (avg, n, loaded) in tables.items()}}}  # fmt: skip


CONFIG = dict(model="m", revision=None, backend="hf", samples=2, max_new_tokens=48, limit=5, data_dir=None, seed=0,
              instruction="Solve.", chat_template=True, benchmarks=["aime24"])  # fmt: skip


def _refusal(old: dict, new: dict) -> str:
    with pytest.raises(ValueError) as excinfo:
        check_resumable({"config": old}, new, Path("r.json"), {})
    assert "\n" not in str(excinfo.value) and "None" not in str(excinfo.value)
    return str(excinfo.value)


def test_the_resume_refusals_are_one_line_and_the_tables_hold_the_hand_computed_values(tmp_path):
    assert _refusal(CONFIG, {**CONFIG, "samples": None, "limit": None, "max_new_tokens": 64}) == (
        "r.json holds results of other settings, so it cannot be resumed: --samples 2 in the file, unset (each "
        "benchmark's default) now; --max-new-tokens 48 in the file, 64 now; --limit 5 in the file, unset (every "
        "problem) now. Rerun with --samples 2 --max-new-tokens 48 --limit 5 to add to it, or choose another --output."
    )
    message = _refusal({**CONFIG, "limit": None, "revision": None}, {**CONFIG, "limit": 3, "chat_template": False})
    assert "--limit unset (every problem) in the file, 3 now" in message
    assert "the chat template in the file, --no-chat-template now" in message
    assert message.endswith("Rerun without --limit, --no-chat-template to add to it, or choose another --output.")
    # no difference: a key the file lacks, --samples 32 (AIME's default) against unset, a trailing slash
    old = {key: value for key, value in CONFIG.items() if key != "chat_template"} | {"samples": None, "model": "."}
    new = {**CONFIG, "samples": 32, "model": "./", "chat_template": False}
    check_resumable({"config": old, "model": {"weights": {}}}, new, Path("r.json"), {})
    (tmp_path / "adapter_config.json").write_text("{}")  # unrecorded weights: tests/cli/test_eval.py
    (adapter := tmp_path / "adapter_model.safetensors").write_bytes(b"a" * 8)
    os.utime(adapter, ns=(10**18, 10**18))
    existing = {"config": CONFIG, "model": describe_model(str(tmp_path))}
    assert existing["model"]["weights"] == {"adapter_model.safetensors": [8, 10**18]}
    check_resumable(existing, CONFIG, Path("r.json"), existing["model"]["weights"])  # resumed
    adapter.write_bytes(b"b" * 8)  # the adapter trained on: same size, another time
    delete = "so it cannot be resumed: choose another --output, or delete it to rerun."
    with pytest.raises(ValueError, match=f"^r.json holds results of other weights \\(adapter_model.safetensors "
                       f"changed since\\), {delete}$"):  # fmt: skip
        check_resumable(existing, CONFIG, Path("r.json"), describe_model(str(tmp_path))["weights"])
    with pytest.raises(ValueError, match="other weights \\(Hub commit abc in the file, def now\\), so it cannot"):
        check_resumable({"config": CONFIG, "model": {"weights": "abc"}}, CONFIG, Path("r.json"), "def")
    a = fake_eval_results("grpo", dict(zip(SIX, [0.1, 0.1, 0.4, 0.6, 0.2, 0.4])))  # Avg 0.30
    b = fake_eval_results("stapo", dict(zip(SIX, [0.2, 0.1, 0.5, 0.6, 0.2, 0.5])))  # Avg 0.35
    table = format_results_table([a, b])
    assert table.splitlines()[0] == "| Model | AIME24 | AIME25 | AMC23 | MATH-500 | Minerva | OlympiadBench | Avg |"
    assert "| grpo/t1.0-p1.0 | 10.0 | 10.0 | 40.0 | 60.0 | 20.0 | 40.0 | 30.0 |" in table
    # (b - a) / a: AIME24 (0.2 - 0.1) / 0.1 = +100 %, Avg (0.35 - 0.30) / 0.30 = +16.7 %.
    gains = "| rel. gain (b-a)/a | +100.0% | +0.0% | +25.0% | +0.0% | +0.0% | +25.0% | +16.7% |"
    assert gains in format_comparison(a, b)
    assert "| m/t1.0-p1.0 | 50.0 | 50.0* |" in format_results_table([fake_eval_results("m", {"aime24": 0.5})])
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
    table = format_results_table([_results({"aime24": (0.5, 3, 8), "amc23": (0.25, 40, 40)})])
    assert "| m/t1.0-p1.0 | 50.0 (3/8) | 25.0 | " in table, table
    comparison = format_comparison(_results({"aime24": (0.5, 3, 8)}), _results({"aime24": (0.25, 8, 8)}))
    for text in (table, comparison):
        assert "(n/N): the cell averages n of the benchmark's N problems" in text
    assert "| 50.0 (3/8) |" in comparison and "| 25.0 |" in comparison, comparison
    table = format_results_table([_results({"aime24": (0.5, 5, 5)}, limit=5)])
    assert "Only the first 5 problems of each benchmark (--limit)." in table
    assert "(5/5)" not in table and "(n/N)" not in table  # nothing dropped
