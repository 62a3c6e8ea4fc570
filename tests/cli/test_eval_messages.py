"""`stapo-eval`'s messages and tables, and where a rerun of `stapo-train` writes its evaluation:

- a cell that averages fewer problems than its benchmark has says how many (`(n/N)`), as `--limit` does below;
- a results file written with other settings is refused in one line listing only the real differences;
- a `--max-new-tokens` beyond the model's positions is refused from its `config.json`, before the model is loaded;
- a rerun with identical settings writes `eval-step{N}.json` beside `eval.json`, as the README must say.
"""

import json
from pathlib import Path

import pytest

import stapo_trl.cli.eval as stapo_eval
from stapo_trl.cli.eval import main
from stapo_trl.evaluation.results import check_resumable, format_comparison, format_results_table


REPO = Path(__file__).resolve().parents[2]


def _results(tables: dict, limit=None) -> dict:
    return {"model": {"name_or_path": "m", "source": "hub"}, "config": {"limit": limit},
            "results": {"t1.0-p1.0": tables}}  # fmt: skip


def _table(avg: float, n: int, loaded: int | None) -> dict:
    table = {"avg@2": avg, "n_samples": 2, "num_problems": n}
    return table if loaded is None else {**table, "num_problems_loaded": loaded}


# --- a cell that averages fewer problems than the benchmark has


def test_a_cell_with_dropped_problems_says_how_many_it_averages():
    # The reported case: AIME's avg@2 over 3 of its 8 problems read like the whole benchmark.
    table = format_results_table([_results({"aime24": _table(0.5, 3, 8), "amc23": _table(0.25, 40, 40)})])
    assert "| m/t1.0-p1.0 | 50.0 (3/8) | 25.0 | " in table, table
    assert "(n/N): the cell averages n of the benchmark's N problems" in table, table


def test_the_comparison_table_says_it_too():
    a = _results({"aime24": _table(0.5, 3, 8)})
    b = _results({"aime24": _table(0.25, 8, 8)})
    comparison = format_comparison(a, b)
    assert "| 50.0 (3/8) |" in comparison and "| 25.0 |" in comparison, comparison
    assert "(n/N): the cell averages" in comparison, comparison


def test_a_limit_is_stated_under_the_table():
    table = format_results_table([_results({"aime24": _table(0.5, 5, 5)}, limit=5)])
    assert "Only the first 5 problems of each benchmark (--limit)." in table, table
    assert "(5/5)" not in table and "(n/N)" not in table  # nothing dropped


def test_an_evaluation_that_drops_long_prompts_records_and_shows_it(tiny_random_model_path, tmp_path, capsys):
    # 5 of 8 AIME problems too long for the tiny model's 512 positions: dropped with a warning, and the table says so.
    data = tmp_path / "data" / "aime24"
    data.mkdir(parents=True)
    rows = [{"problem": "1+1" if i < 3 else "1+1 " * 400, "answer": "2"} for i in range(8)]
    (data / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    output = tmp_path / "r.json"
    argv = ["--model", tiny_random_model_path, "--benchmarks", "aime24", "--backend", "hf", "--decoding", "greedy",
            "--samples", "2", "--max-new-tokens", "8", "--data-dir", str(tmp_path / "data"), "--output", str(output)]  # fmt: skip
    assert main(argv) == 0
    table = json.loads(output.read_text())["results"]["greedy"]["aime24"]
    assert (table["num_problems"], table["num_problems_loaded"]) == (3, 8)
    assert "(3/8)" in capsys.readouterr().out


# --- a results file written with other settings


CONFIG = dict(model="m", revision=None, backend="hf", samples=2, max_new_tokens=48, limit=5, data_dir=None, seed=0,
              instruction="Solve.", chat_template=True, benchmarks=["aime24"])  # fmt: skip


def _refusal(old: dict, new: dict) -> str:
    with pytest.raises(ValueError) as excinfo:
        check_resumable({"config": old}, new, Path("r.json"))
    return str(excinfo.value)


def test_other_settings_are_one_line_without_none():
    # The reported case: five lines, with "now None" for the flags left unset.
    message = _refusal(CONFIG, {**CONFIG, "samples": None, "limit": None, "max_new_tokens": 64})
    assert "\n" not in message and "None" not in message, message
    assert message == (
        "r.json holds results of other settings, so it cannot be resumed: --samples 2 in the file, unset (each "
        "benchmark's default) now; --max-new-tokens 48 in the file, 64 now; --limit 5 in the file, unset (every "
        "problem) now. Rerun with --samples 2 --max-new-tokens 48 --limit 5 to add to it, or choose another --output."
    )


def test_a_setting_unset_in_the_file_is_named_as_such_and_as_a_flag_to_leave_out():
    message = _refusal({**CONFIG, "limit": None, "revision": None}, {**CONFIG, "limit": 3, "chat_template": False})
    assert "None" not in message and "\n" not in message, message
    assert "--limit unset (every problem) in the file, 3 now" in message, message
    assert "the chat template in the file, --no-chat-template now" in message, message
    assert message.endswith("Rerun without --limit, --no-chat-template to add to it, or choose another --output."), (
        message
    )


def test_what_is_not_a_real_difference_resumes():
    # A file of an older version without the chat_template key; --samples 32, AIME's default, against unset; the same
    # model folder with a trailing slash.
    old = {key: value for key, value in CONFIG.items() if key != "chat_template"} | {"samples": None, "model": "."}
    check_resumable({"config": old}, {**CONFIG, "samples": 32, "model": "./", "chat_template": False}, Path("r.json"))


# --- --max-new-tokens beyond the model's positions, before the model is loaded


@pytest.fixture
def nothing_loaded(monkeypatch):
    """Fail if a benchmark or the model is loaded."""
    monkeypatch.setattr(stapo_eval.tasks, "load_benchmark", lambda *a, **k: pytest.fail("a benchmark was loaded"))
    monkeypatch.setattr(stapo_eval, "_load_generator", lambda *a, **k: pytest.fail("the model was loaded"))


def _eval_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as excinfo:
        main(argv)
    assert excinfo.value.code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    return line


def test_a_generation_budget_beyond_a_local_models_positions_is_refused_before_loading(
    tiny_random_model_path, tmp_path, capsys, nothing_loaded
):
    line = _eval_error(capsys, ["--model", tiny_random_model_path, "--benchmarks", "tiny-math", "--backend", "hf",
                                "--max-new-tokens", "600", "--output", str(tmp_path / "r.json")])  # fmt: skip
    assert line.startswith("stapo-eval: error: --max-new-tokens 600: max_new_tokens=600 leaves no room for a prompt: ")
    assert "the model has 512 positions (prompt + completion)" in line and line.endswith("below 512."), line


def test_a_generation_budget_beyond_a_cached_hub_models_positions_is_refused_before_loading(
    tmp_path, capsys, monkeypatch, nothing_loaded
):
    from huggingface_hub import constants

    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"model_type": "qwen3", "max_position_embeddings": 256}')
    (tmp_path / "hub" / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--tiny" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    line = _eval_error(
        capsys,
        ["--model", "org/tiny", "--benchmarks", "tiny-math", "--backend", "hf", "--output", str(tmp_path / "r.json")],
    )  # fmt: skip  (the paper's 20,480 tokens)
    assert line.startswith("stapo-eval: error: --max-new-tokens 20480: max_new_tokens=20480 leaves no room"), line
    assert "the model has 256 positions" in line, line


def test_vllms_max_model_len_caps_the_positions_before_loading(
    tiny_random_model_path, tmp_path, capsys, nothing_loaded
):
    line = _eval_error(capsys, ["--model", tiny_random_model_path, "--benchmarks", "tiny-math", "--backend", "vllm",
                                "--max-model-len", "128", "--max-new-tokens", "200",
                                "--output", str(tmp_path / "r.json")])  # fmt: skip
    assert line.startswith("stapo-eval: error: --max-new-tokens 200: max_new_tokens=200 leaves no room"), line
    assert "the model has 128 positions" in line, line


# --- a rerun of stapo-train with identical settings: eval-step{N}.json, never over eval.json


def test_a_rerun_with_identical_settings_writes_eval_step_beside_eval_json(tmp_path):
    from stapo_trl.cli.outputs import write_eval_record

    record = {"metric": "avg@4", "accuracy_before": 0.4, "accuracy_after": 0.6}
    assert Path(write_eval_record(record, str(tmp_path), 500)).name == "eval.json"
    assert Path(write_eval_record(record, str(tmp_path), 500)).name == "eval-step500.json"  # identical rerun
    assert Path(write_eval_record(record, str(tmp_path), 500)).name == "eval-step500-2.json"
    assert json.loads((tmp_path / "eval.json").read_text()) == record  # never replaced


def test_the_docs_say_when_eval_step_files_are_written():
    # The README said a rerun writes eval-step{N}.json "with other settings" only; every rerun does.
    docs = {path: " ".join(path.read_text().split()) for path in [REPO / "README.md", *(REPO / "docs").glob("*.md")]}
    wrong = [path.name for path, text in docs.items() if "with other settings writes `eval-step{N}.json`" in text]
    assert not wrong, f"{wrong} say that only a rerun with other settings writes eval-step{{N}}.json"
    assert any("eval-step{N}.json" in text for text in docs.values())
