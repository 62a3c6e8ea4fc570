"""The built-in tiny-math task and `load_prompt_dataset` (`stapo_trl.data`): local files, nested columns, Hub ids, the
DAPO instruction stripped, and empty, malformed or single-split files each met with one line (in `stapo-train` and its
dry run) or a label saying the evaluation is not held out."""

import json
import re

import pytest
from testing_utils import STAPO_RECIPE, addition_rows, write_jsonl

from stapo_trl.data import (
    BUILTIN_DATASETS,
    INSTRUCTION,
    format_prompt,
    load_prompt_dataset,
    make_tiny_math_dataset,
    tiny_math_completion,
)


@pytest.fixture(scope="module")
def tiny_math():
    return make_tiny_math_dataset()


# `7+8=15, write 5 carry 1; 4+3+1=8; \boxed{85}`
STEPS = re.compile(r"^(\d)\+(\d)=(\d+), write (\d) carry (\d); (\d)\+(\d)\+(\d)=(\d+); \\boxed\{(\d+)\}$")


def test_example_from_the_spec():
    assert tiny_math_completion(47, 38) == "7+8=15, write 5 carry 1; 4+3+1=8; \\boxed{85}"
    # No carry: the format stays the same (carry 0), and a three-digit sum.
    assert tiny_math_completion(21, 34) == "1+4=5, write 5 carry 0; 2+3+0=5; \\boxed{55}"
    assert tiny_math_completion(99, 99) == "9+9=18, write 8 carry 1; 9+9+1=19; \\boxed{198}"


def test_sizes_and_columns(tiny_math):
    assert set(tiny_math) == {"train", "test"}
    assert len(tiny_math["train"]) == 7800
    assert len(tiny_math["test"]) == 300
    for split in tiny_math.values():
        assert split.column_names == ["prompt", "solution", "completion", "problem"]


def test_every_completion_is_arithmetically_correct(tiny_math):
    # Recompute every step from the problem text instead of trusting the generator.
    for split in tiny_math.values():
        for row in split:
            a, b = map(int, row["problem"].split("+"))
            assert 10 <= a <= 99 and 10 <= b <= 99
            m = STEPS.match(row["completion"])
            assert m is not None, row["completion"]
            ua, ub, usum, digit, carry, ta, tb, tcarry, tsum, boxed = map(int, m.groups())
            assert (ua, ub) == (a % 10, b % 10)
            assert usum == ua + ub
            assert digit == usum % 10 and carry == usum // 10
            assert (ta, tb, tcarry) == (a // 10, b // 10, carry)
            assert tsum == ta + tb + tcarry
            assert boxed == a + b == tsum * 10 + digit
            assert row["solution"] == str(a + b)
            assert row["prompt"] == format_prompt(row["problem"])
            assert row["prompt"][0]["content"] == f"{a}+{b}\n{INSTRUCTION}"


def test_train_and_test_are_disjoint(tiny_math):
    train = set(tiny_math["train"]["problem"])
    test = set(tiny_math["test"]["problem"])
    assert len(train) == 7800 and len(test) == 300  # no duplicates inside a split either
    assert not train & test


def test_same_seed_same_data_other_seed_other_data(tiny_math):
    again = make_tiny_math_dataset()
    for split in ("train", "test"):
        assert again[split].to_list() == tiny_math[split].to_list()
    other = make_tiny_math_dataset(seed=1)
    assert other["test"]["problem"] != tiny_math["test"]["problem"]
    # Smaller draws cut the same shuffle (test first): the first held-out problems stay the same.
    small = make_tiny_math_dataset(num_train=50, num_test=10)
    assert small["test"]["problem"] == tiny_math["test"]["problem"][:10]
    assert len(small["train"]) == 50 and not set(small["train"]["problem"]) & set(small["test"]["problem"])


def test_too_many_problems_is_an_error():
    with pytest.raises(ValueError, match="8100"):
        make_tiny_math_dataset(num_train=8000, num_test=101)


def test_load_builtin(tiny_math):
    test = load_prompt_dataset("builtin:tiny-math", split="test")
    assert test.column_names == ["prompt", "solution"]
    assert test["solution"] == tiny_math["test"]["solution"]
    assert test["prompt"] == tiny_math["test"]["prompt"]

    train = load_prompt_dataset("builtin:tiny-math", instruction=None, limit=5)
    assert len(train) == 5
    assert train[0]["prompt"] == [{"role": "user", "content": tiny_math["train"][0]["problem"]}]


def test_unknown_builtin_lists_the_known_names():
    with pytest.raises(ValueError, match="builtin:nope") as excinfo:
        load_prompt_dataset("builtin:nope")
    for name in BUILTIN_DATASETS:
        assert f"builtin:{name}" in str(excinfo.value)
    with pytest.raises(ValueError, match="'validation'"):
        load_prompt_dataset("builtin:tiny-math", split="validation")


@pytest.fixture
def jsonl_file(tmp_path):
    rows = [
        {"problem": "What is 1+1?", "answer": 2.0, "meta": {"gt": "2"}},
        {"problem": "What is 2+3?", "answer": "5", "meta": {"gt": "5"}},
        {"problem": "What is 10/4?", "answer": 2.5, "meta": {"gt": "\\frac{5}{2}"}},
    ]
    path = tmp_path / "toy.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_load_local_jsonl(jsonl_file):
    ds = load_prompt_dataset(str(jsonl_file))
    # The file's own columns stay (TRL passes each to the reward functions by name).
    assert ds.column_names == ["problem", "answer", "meta", "prompt", "solution"]
    assert ds["meta"][2] == {"gt": "\\frac{5}{2}"}
    assert ds["prompt"][0] == [{"role": "user", "content": f"What is 1+1?\n{INSTRUCTION}"}]
    # Integral floats lose their ".0"; other values are stringified.
    assert ds["solution"] == ["2", "5", "2.5"]
    assert len(load_prompt_dataset(str(jsonl_file), limit=2)) == 2


def test_load_nested_column(jsonl_file):
    ds = load_prompt_dataset(str(jsonl_file), solution_column="meta.gt", instruction="")
    assert ds["solution"] == ["2", "5", "\\frac{5}{2}"]
    assert ds["prompt"][2] == [{"role": "user", "content": "What is 10/4?"}]


def test_missing_column_names_column_dataset_and_available_columns(jsonl_file):
    with pytest.raises(ValueError) as excinfo:
        load_prompt_dataset(str(jsonl_file), solution_column="ground_truth")
    message = str(excinfo.value)
    assert "'ground_truth'" in message
    assert str(jsonl_file) in message
    assert "['problem', 'answer', 'meta']" in message
    with pytest.raises(ValueError, match="'meta.missing'"):
        load_prompt_dataset(str(jsonl_file), solution_column="meta.missing")


def test_missing_local_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_prompt_dataset(str(tmp_path / "nope.jsonl"))


def test_verl_parquet_with_chat_prompts(shared_data_dir):
    # verl layout: the prompt is already a chat, the answer sits in `reward_model.ground_truth`.
    ds = load_prompt_dataset(
        str(shared_data_dir / "aime24" / "test.parquet"),
        prompt_column="prompt",
        solution_column="reward_model.ground_truth",
    )
    assert len(ds) == 30
    assert ds[0]["solution"] == "\\boxed{204}"
    (turn,) = ds[0]["prompt"]
    assert turn["role"] == "user"
    assert turn["content"].startswith("Every morning Aya goes for a $9$-kilometer-long walk")
    assert turn["content"].endswith("\n" + INSTRUCTION)


def test_hub_ids_go_to_load_dataset(monkeypatch):
    # No network here: check what a Hub id is forwarded as, with a stand-in for `datasets.load_dataset`.
    import datasets

    calls = []

    def fake_load_dataset(path, name=None, **kwargs):
        calls.append((path, name, kwargs))
        return datasets.Dataset.from_dict({"question": ["1+1?"], "final_answer": [["2"]]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    ds = load_prompt_dataset(
        "org/math", dataset_config="default", split="test", prompt_column="question", solution_column="final_answer"
    )
    assert calls == [("org/math", "default", {"split": "test", "data_files": None})]
    assert ds.to_list() == [
        {"question": "1+1?", "final_answer": ["2"], "prompt": format_prompt("1+1?"), "solution": "2"}
    ]


@pytest.mark.parametrize(
    "name, content",
    [("empty.jsonl", ""), ("empty.json", ""), ("empty.parquet", ""), ("blank.jsonl", "\n  \n"), ("list.json", "[]")],
    ids=["jsonl-0-bytes", "json-0-bytes", "parquet-0-bytes", "jsonl-whitespace", "json-empty-list"],
)
def test_empty_dataset_file_gets_one_line(no_model_built, tmp_path, capsys, name, content):
    from stapo_trl.cli.dry_run import main as dry_run_main
    from stapo_trl.cli.train import main
    from stapo_trl.data import load_prompt_dataset

    path = tmp_path / name
    path.write_text(content)
    expected = f"dataset file '{path}' is empty"
    with pytest.raises(ValueError, match=f"^{expected}"):
        load_prompt_dataset(str(path))
    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), "--dataset_name", str(path)]
    with pytest.raises(SystemExit) as excinfo:
        main(argv)
    message = str(excinfo.value)
    assert message.startswith(f"stapo-train: error: {expected}") and "\n" not in message, message
    capsys.readouterr()
    assert dry_run_main(argv) == 2  # a failed check is an input error: status 2
    out = capsys.readouterr().out
    assert "StopIteration" not in out and "ArrowInvalid" not in out
    (line,) = [line for line in out.splitlines() if "is empty" in line]
    assert line.startswith(f"  - dataset_name={str(path)!r}: {expected}"), line


ROW = '{"problem": "1+1", "answer": "2"}\n'


@pytest.mark.parametrize(
    "name, content, cause",
    [
        ("cut.jsonl", ROW * 20 + '{"problem": "2+2", "answer": \n' + ROW * 19, "line 21 is not a JSON object"),
        ("braces.jsonl", ROW + "\n\n" + "{problem: 3}\n", "line 4 is not a JSON object"),  # blank lines counted
        ("list.jsonl", ROW + "[1, 2]\n" + ROW, "line 2 is not a JSON object"),
        ("extra-brace.json", ROW * 5 + '{"problem": "1", "answer": "1"}}\n', "line 6 is not a JSON object"),
        ("trailing.json", '[{"problem": "1+1", "answer": "2"},]', ""),
    ],
    ids=["jsonl-cut-line", "jsonl-unquoted-key", "jsonl-a-list", "json-lines-extra-brace", "json-trailing-comma"],
)
def test_malformed_dataset_file_gets_one_line(no_model_built, tmp_path, name, content, cause):
    """A line that does not parse: one line naming the file and the line as an editor counts it, not datasets' 70-line
    trace. Reported: a cut line 21 was "row 20" (pyarrow counts rows from 0), or no row at all (an extra brace)."""
    from stapo_trl.cli.train import main

    path = tmp_path / name
    path.write_text(content)
    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), "--dataset_name", str(path)]
    with pytest.raises(SystemExit) as excinfo:
        main(argv)
    message = str(excinfo.value)
    assert message.startswith(f"stapo-train: error: dataset file '{path}' could not be parsed as json: "), message
    assert cause in message and "\n" not in message, message


def test_local_file_evaluation_is_labelled_not_held_out(tmp_path, tiny_math_model_path, capsys, caplog):
    """A local file has one split: the before/after evaluation reads training prompts. The run and its dry run warn,
    and eval.json and the card say "training file (not held out)" instead of "test"."""
    from stapo_trl.cli.dry_run import main as dry_run_main
    from stapo_trl.cli.train import main

    data = write_jsonl(tmp_path / "sums.jsonl", addition_rows(8))
    out = tmp_path / "out"
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--dataset_name", data]
    argv += ["--output_dir", str(out), "--max_steps", "1", "--eval_num_problems", "4", "--eval_num_samples", "1"]
    argv += ["--disable_tqdm", "true", "--save_strategy", "no"]
    assert dry_run_main(argv) == 0
    assert f"dataset_name={data!r} is one local file, so the before/after evaluation reads" in capsys.readouterr().out
    main(argv)
    assert "the accuracy is not held out" in caplog.text
    listed = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("eval.json")]
    assert listed == [["eval.json", "accuracy", "before", "and", "after", "training"]]  # it said "held-out accuracy"
    record = json.loads((out / "eval.json").read_text())
    assert record["split"] == "training file (not held out)" and record["num_problems"] == 4
    assert "problems of the `training file (not held out)` split" in (out / "README.md").read_text()


def test_dapo_prompts_are_stripped_and_long_prompts_dropped(tmp_path, tiny_math_model_path):
    from stapo_trl.cli.args import parse_args
    from stapo_trl.cli.run import prepare

    # A DAPO-style file: the problem wrapped in its own "Answer:" instruction; one prompt far over the budget.
    dapo = "Solve the following math problem step by step. The last line of your response should be of the form "
    dapo += "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{}\n\n"
    dapo += 'Remember to put your answer on its own line after "Answer:".'
    rows = [
        {"prompt": dapo.format("12+34"), "solution": "46"},
        {"prompt": dapo.format("1+" * 400 + "1"), "solution": "401"},
    ]
    data = tmp_path / "dapo.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--dataset_name", str(data)]
    argv += ["--prompt_column", "prompt", "--solution_column", "solution", "--eval_before_after", "false"]
    argv += ["--strip_dapo_instruction", "true", "--max_prompt_tokens", "128", "--output_dir", str(tmp_path / "out")]
    # why: a one-prompt rollout step (8 completions), so that the one kept prompt fills it (fewer are refused)
    argv += ["--per_device_train_batch_size", "8", "--steps_per_generation", "1"]
    run = prepare(*parse_args(argv))
    assert run.train_dataset["prompt"] == [[{"role": "user", "content": "12+34\n" + INSTRUCTION}]]


QUESTIONABLE_ROWS = [{"problem": f"{i}+1", "answer": str(i + 1)} for i in range(40)]
QUESTIONABLE_ROWS[3] = {"problem": "", "answer": "1"}  # line 5 (after the blank line 3)
QUESTIONABLE_ROWS[5] = {"problem": "2+2"}  # no answer: line 7
QUESTIONABLE_ROWS[9] = {"problem": "3+3", "answer": None}  # line 11
QUESTIONABLE_ROWS[12] = {"problem": "   ", "answer": "4"}  # line 14


def _questionable_file(tmp_path, null_prompt: bool = False):
    rows = [dict(row) for row in QUESTIONABLE_ROWS]
    if null_prompt:
        rows[7]["problem"] = None  # line 9
        rows[20]["problem"] = None  # line 22
    lines = [json.dumps(row) for row in rows]
    lines.insert(2, "")
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_questionable_rows_are_named_by_file_line_and_column_at_load_time(tmp_path, caplog, capsys):
    # Reported: an empty prompt was trained on silently, a missing answer surfaced as a warning at the step it was
    # sampled, and the dry run reported "checked: 40 rows" and flagged none of it. GRPOTrainer trains on both, so
    # they are warnings, never refusals.
    from stapo_trl.cli.dry_run import main as dry_run_main

    path = _questionable_file(tmp_path)
    dataset = load_prompt_dataset(path)
    assert len(dataset) == 40 and dataset[3]["prompt"] == format_prompt("")
    empty = f"dataset file {path!r}: lines 5, 14 (column 'problem'): empty prompt: trained on, the model sees the "
    empty += "instruction alone."
    missing = f"dataset file {path!r}: lines 7, 11 (column 'answer'): no answer: math_accuracy gives their "
    missing += "completions no reward (None)."
    assert [r.getMessage() for r in caplog.records if r.name == "stapo_trl.data"] == [empty, missing]
    argv = ["--config", STAPO_RECIPE, "--dataset_name", path, "--output_dir", str(tmp_path / "out")]
    assert dry_run_main(argv) == 0
    out = capsys.readouterr().out
    assert f"  - {empty}" in out and f"  - {missing}" in out


def test_a_prompt_that_is_not_text_or_chat_is_one_line_naming_file_lines_and_column(no_model_built, tmp_path, capsys):
    # Reported: a null prompt's error named no file, row or column.
    from stapo_trl.cli.dry_run import main as dry_run_main
    from stapo_trl.cli.train import main

    path = _questionable_file(tmp_path, null_prompt=True)
    expected = f"dataset file {path!r}: lines 9, 22 (column 'problem'): a prompt must be a string or a list of chat "
    expected += "messages with 'role' and 'content', got None. Fix or remove those rows."
    with pytest.raises(ValueError) as excinfo:
        load_prompt_dataset(path)
    assert str(excinfo.value) == expected
    argv = ["--config", STAPO_RECIPE, "--dataset_name", path, "--output_dir", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as excinfo:
        main(argv)
    assert excinfo.value.code == 2 and str(excinfo.value) == f"stapo-train: error: {expected}"
    capsys.readouterr()
    assert dry_run_main(argv) == 2
    assert f"  - dataset_name={path!r}: {expected}" in capsys.readouterr().out


@pytest.mark.parametrize("where", ["relative", "absolute", "dry-run"])
def test_a_local_csv_file_is_read_as_json_and_parquet_files_are(tmp_path, monkeypatch, capsys, where):
    # Reported: "Couldn't reach 'x.csv' on the Hub" (relative path), "Couldn't find any data file at /abs/x.csv".
    from stapo_trl.cli.dry_run import main as dry_run_main

    (tmp_path / "sums.csv").write_text(
        "problem,answer\n" + "".join(f"{r['problem']},{r['answer']}\n" for r in addition_rows(5))
    )
    monkeypatch.chdir(tmp_path)
    name = "sums.csv" if where == "relative" else str(tmp_path / "sums.csv")
    if where == "dry-run":
        argv = ["--config", STAPO_RECIPE, "--dataset_name", name, "--output_dir", str(tmp_path / "out")]
        assert dry_run_main(argv) == 2  # 5 prompts are fewer than one rollout step takes
        assert f"{name} split train, columns 'problem' -> 'answer' (checked: 5 rows)" in capsys.readouterr().out
        return
    dataset = load_prompt_dataset(name)
    assert dataset["solution"] == ["30", "32", "34", "36", "38"]
    assert dataset["prompt"][1] == format_prompt("11+21")


# A prompt that already ends with the instruction (whitespace aside) does not get it a second time: twice, the model
# answers a prompt unlike training's, and a tiny model's reward is 0 for the whole run.
def _once(content: str, instruction: str = INSTRUCTION) -> bool:
    return "".join(content.split()).count("".join(instruction.split())) == 1


def test_a_chat_prompt_that_ends_with_the_instruction_gets_it_once(tmp_path):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"1+1?\n{INSTRUCTION}"}]
    path = write_jsonl(tmp_path / "chat.jsonl", [{"prompt": chat, "solution": "2"}])
    ds = load_prompt_dataset(path, prompt_column="prompt", solution_column="solution")
    assert ds[0]["prompt"] == chat


def test_a_problem_that_ends_with_the_instruction_in_other_whitespace_gets_it_once(monkeypatch):
    import datasets

    instruction = "Think it through.  Box the answer."
    problems = ["2+2?\n\nThink it through. Box the answer.\n", "3+3? Think it\nthrough. Box the answer.", "4+4?"]
    hub = datasets.Dataset.from_dict({"problem": problems, "answer": ["4", "6", "8"]})
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: hub)
    ds = load_prompt_dataset("org/math", instruction=instruction)
    assert [turn["content"] for (turn,) in ds["prompt"]] == [*problems[:2], f"4+4?\n{instruction}"]
    assert format_prompt(f"5+5? {INSTRUCTION}  ") == [{"role": "user", "content": f"5+5? {INSTRUCTION}  "}]


def test_an_evaluation_prompt_that_ends_with_the_instruction_gets_it_once(tmp_path, tiny_random_model_path):
    from transformers import AutoTokenizer

    from stapo_trl.evaluation.generation import build_prompt_text
    from stapo_trl.evaluation.tasks import benchmark_dataset, load_benchmark

    wrapped = INSTRUCTION.replace(", and", ",\nand")  # over two lines: not a one-line sentence the loader removes
    (tmp_path / "aime24").mkdir()
    write_jsonl(tmp_path / "aime24" / "test.jsonl", [{"problem": f"Find $x$.\n{wrapped}", "answer": "1"}])
    (problem,) = load_benchmark("aime24", data_dir=tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_random_model_path)
    assert _once(build_prompt_text(tokenizer, problem.problem))
    assert _once(benchmark_dataset([problem], INSTRUCTION)[0]["prompt"][0]["content"])
