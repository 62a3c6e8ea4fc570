"""Prompt datasets: tiny-math, `load_prompt_dataset`, and a run's datasets checked before a model is built."""

import functools
import json
import re
import shutil
import warnings
from pathlib import Path

import pytest
from datasets import Dataset
from testing_utils import STAPO_RECIPE, addition_rows, error_line, tiny_stapo_config, write_jsonl, zero_reward

from stapo_trl import STAPOTrainer
from stapo_trl.data import (
    INSTRUCTION,
    check_chat_template,
    check_prompt_column,
    check_reward_columns,
    format_prompt,
    load_prompt_dataset,
    make_tiny_math_dataset,
    tiny_math_completion,
)
from stapo_trl.rewards import format_reward, math_accuracy_reward, resolve_reward_names


STEPS = re.compile(r"^(\d)\+(\d)=(\d+), write (\d) carry (\d); (\d)\+(\d)\+(\d)=(\d+); \\boxed\{(\d+)\}$")


def test_every_completion_is_the_worked_sum_of_its_problem_in_disjoint_splits_drawn_by_the_seed_and_loads():
    tiny_math = make_tiny_math_dataset()
    assert tiny_math_completion(47, 38) == "7+8=15, write 5 carry 1; 4+3+1=8; \\boxed{85}"  # the spec's example
    assert tiny_math_completion(21, 34) == "1+4=5, write 5 carry 0; 2+3+0=5; \\boxed{55}"  # no carry: same format
    assert format_prompt("47+38") == [{"role": "user", "content": f"47+38\n{INSTRUCTION}"}]
    columns = ["prompt", "solution", "completion", "problem"]
    assert {name: (len(split), split.column_names) for name, split in tiny_math.items()} == {
        "train": (7800, columns), "test": (300, columns)
    }  # fmt: skip
    for split in tiny_math.values():  # every step recomputed from the problem text
        for row in split.to_list():
            a, b = map(int, row["problem"].split("+"))
            ua, ub, usum, digit, carry, ta, tb, tcarry, tsum, boxed = map(int, STEPS.match(row["completion"]).groups())
            assert 10 <= a <= 99 and 10 <= b <= 99 and (ua, ub, ta, tb) == (a % 10, b % 10, a // 10, b // 10)
            assert usum == ua + ub and (digit, carry) == (usum % 10, usum // 10) and tsum == ta + tb + tcarry
            assert boxed == a + b == tsum * 10 + digit and row["solution"] == str(a + b) and tcarry == carry
            assert row["prompt"] == format_prompt(row["problem"])
    train, test = set(tiny_math["train"]["problem"]), set(tiny_math["test"]["problem"])
    assert len(train) == 7800 and len(test) == 300 and not train & test  # no duplicates, no overlap
    again, other = make_tiny_math_dataset(), make_tiny_math_dataset(seed=1)
    assert all(again[split].to_list() == tiny_math[split].to_list() for split in ("train", "test"))
    assert other["test"]["problem"] != tiny_math["test"]["problem"]
    small = make_tiny_math_dataset(num_train=50, num_test=10)
    assert small["test"]["problem"] == tiny_math["test"]["problem"][:10]
    assert len(small["train"]) == 50 and not set(small["train"]["problem"]) & set(small["test"]["problem"])
    with pytest.raises(ValueError, match="8100"):
        make_tiny_math_dataset(num_train=8000, num_test=101)
    test = load_prompt_dataset("builtin:tiny-math", split="test")
    assert test.column_names == ["prompt", "solution"]
    assert (test["solution"], test["prompt"]) == (tiny_math["test"]["solution"], tiny_math["test"]["prompt"])
    train = load_prompt_dataset("builtin:tiny-math", instruction=None, limit=5)
    assert len(train) == 5 and train[0]["prompt"] == [{"role": "user", "content": tiny_math["train"][0]["problem"]}]
    with pytest.raises(ValueError, match="builtin:nope") as excinfo:
        load_prompt_dataset("builtin:nope")
    assert str(excinfo.value).endswith("; built-in ones: builtin:tiny-math (splits train, test).")
    with pytest.raises(ValueError, match="'validation'"):
        load_prompt_dataset("builtin:tiny-math", split="validation")


def test_load_local_jsonl_with_nested_columns_verls_parquet_with_chat_prompts_and_csv(
    tmp_path, shared_data_dir, monkeypatch, capsys
):
    from stapo_trl.cli.dry_run import main as dry_run_main

    rows = [
        {"problem": "What is 1+1?", "answer": 2.0, "meta": {"gt": "2"}},
        {"problem": "What is 2+3?", "answer": "5", "meta": {"gt": "5"}},
        {"problem": "What is 10/4?", "answer": 2.5, "meta": {"gt": "\\frac{5}{2}"}},
    ]
    path = write_jsonl(tmp_path / "toy.jsonl", rows)
    ds = load_prompt_dataset(path)
    assert ds.column_names == ["problem", "answer", "meta", "prompt", "solution"]
    assert ds["meta"][2] == {"gt": "\\frac{5}{2}"}
    assert ds["prompt"][0] == [{"role": "user", "content": f"What is 1+1?\n{INSTRUCTION}"}]
    assert ds["solution"] == ["2", "5", "2.5"]  # integral floats lose their ".0"
    assert len(load_prompt_dataset(path, limit=2)) == 2
    ds = load_prompt_dataset(path, solution_column="meta.gt", instruction="")
    assert ds["solution"] == ["2", "5", "\\frac{5}{2}"] and ds["prompt"][2] == format_prompt("What is 10/4?", None)
    with pytest.raises(ValueError) as excinfo:
        load_prompt_dataset(path, solution_column="ground_truth")
    assert all(part in str(excinfo.value) for part in ("'ground_truth'", path, "['problem', 'answer', 'meta']"))
    with pytest.raises(ValueError, match="'meta.missing'"):
        load_prompt_dataset(path, solution_column="meta.missing")
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_prompt_dataset(str(tmp_path / "nope.jsonl"))
    path = str(shared_data_dir / "aime24" / "test.parquet")
    ds = load_prompt_dataset(path, prompt_column="prompt", solution_column="reward_model.ground_truth")
    assert len(ds) == 30 and ds[0]["solution"] == "\\boxed{204}"
    (turn,) = ds[0]["prompt"]
    assert turn["role"] == "user" and turn["content"].endswith("\n" + INSTRUCTION)
    assert turn["content"].startswith("Every morning Aya goes for a $9$-kilometer-long walk")
    rows = "".join(f"{r['problem']},{r['answer']}\n" for r in addition_rows(5))
    (tmp_path / "sums.csv").write_text("problem,answer\n" + rows)
    monkeypatch.chdir(tmp_path)
    for name in ("sums.csv", str(tmp_path / "sums.csv")):
        dataset = load_prompt_dataset(name)
        assert dataset["solution"] == ["30", "32", "34", "36", "38"] and dataset["prompt"][1] == format_prompt("11+21")
    argv = ["--config", STAPO_RECIPE, "--dataset_name", name, "--output_dir", str(tmp_path / "out")]
    assert dry_run_main(argv) == 2  # 5 prompts are fewer than one rollout step takes
    assert f"{name} split train, columns 'problem' -> 'answer' (checked: 5 rows)" in capsys.readouterr().out


DAPO = "Solve the following math problem step by step. The last line of your response should be of the form Answer: "
DAPO += "$Answer (without quotes) where $Answer is the answer to the problem.\n\n{}\n\nRemember to put your answer "
DAPO += 'on its own line after "Answer:".'


def test_hub_ids_go_to_load_dataset_an_instruction_is_added_once_and_dapo_instructions_go_in_loader_and_commands(
    monkeypatch, tmp_path, tiny_math_model_path, tiny_random_model_path
):
    import datasets
    from transformers import AutoTokenizer

    from stapo_trl.cli.args import parse_args
    from stapo_trl.cli.run import prepare
    from stapo_trl.evaluation.generation import build_prompt_text
    from stapo_trl.evaluation.tasks import benchmark_dataset, load_benchmark

    calls, instruction = [], "Think it through.  Box the answer."
    problems = ["2+2?\n\nThink it through. Box the answer.\n", "3+3? Think it\nthrough. Box the answer.", "4+4?"]

    def load_dataset(path, name=None, **kwargs):
        calls.append((path, name, kwargs))
        return datasets.Dataset.from_dict({"question": problems, "final_answer": [["4"], ["6"], ["8"]]})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    ds = load_prompt_dataset("org/math", dataset_config="default", split="test", prompt_column="question",
                             solution_column="final_answer", instruction=instruction)  # fmt: skip
    assert calls == [("org/math", "default", {"split": "test", "data_files": None})]
    assert ds.to_list()[2] == {"question": "4+4?", "final_answer": ["8"], "prompt": format_prompt("4+4?", instruction),
                               "solution": "8"}  # fmt: skip
    assert [turn["content"] for (turn,) in ds["prompt"]] == [*problems[:2], f"4+4?\n{instruction}"]
    assert format_prompt(f"5+5? {INSTRUCTION}  ") == [{"role": "user", "content": f"5+5? {INSTRUCTION}  "}]
    monkeypatch.undo()
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"1+1?\n{INSTRUCTION}"}]
    rows = [{"prompt": chat, "solution": "2"}, {"prompt": DAPO.format("12+34"), "solution": "46"}]
    rows += [{"prompt": [{"role": "user", "content": DAPO.format("1+2")}], "solution": "3"}]
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    ds = load_prompt_dataset(path, prompt_column="prompt", solution_column="solution", strip_dapo_instruction=True)
    assert ds["prompt"] == [chat, format_prompt("12+34"), format_prompt("1+2")]
    kept = load_prompt_dataset(path, prompt_column="prompt", solution_column="solution")
    assert kept["prompt"][1] == format_prompt(DAPO.format("12+34"))
    # stapo-train strips them and drops the prompts over max_prompt_tokens
    rows = [{"prompt": DAPO.format("12+34"), "solution": "46"}, {"prompt": DAPO.format("1+" * 400), "solution": "1"}]
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--dataset_name"]
    argv += [write_jsonl(tmp_path / "dapo.jsonl", rows), "--prompt_column", "prompt", "--solution_column", "solution"]
    argv += ["--strip_dapo_instruction", "true", "--max_prompt_tokens", "128", "--output_dir", str(tmp_path / "out")]
    # a one-prompt rollout step (8 completions): the one kept prompt fills it (fewer are refused)
    argv += ["--per_device_train_batch_size", "8", "--steps_per_generation", "1", "--eval_before_after", "false"]
    assert prepare(*parse_args(argv)).train_dataset["prompt"] == [format_prompt("12+34")]
    # an evaluation prompt that ends with the instruction gets it once
    once = lambda content: "".join(content.split()).count("".join(INSTRUCTION.split())) == 1  # noqa: E731
    wrapped = INSTRUCTION.replace(", and", ",\nand")  # over two lines: not a one-line sentence the loader removes
    (tmp_path / "aime24").mkdir()
    write_jsonl(tmp_path / "aime24" / "test.jsonl", [{"problem": f"Find $x$.\n{wrapped}", "answer": "1"}])
    (problem,) = load_benchmark("aime24", data_dir=tmp_path)
    assert once(build_prompt_text(AutoTokenizer.from_pretrained(tiny_random_model_path), problem.problem))
    assert once(benchmark_dataset([problem], INSTRUCTION)[0]["prompt"][0]["content"])


def _refused(tmp_path, capsys, path: str, expected: str) -> None:  # stapo-train's line, its dry run's failed check
    from stapo_trl.cli.dry_run import main as dry_run_main
    from stapo_trl.cli.train import main

    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), "--dataset_name", path]
    with pytest.raises(SystemExit) as excinfo:
        main(argv)
    assert excinfo.value.code == 2 and str(excinfo.value).startswith(f"stapo-train: error: {expected}"), excinfo.value
    assert "\n" not in str(excinfo.value)
    capsys.readouterr()
    assert dry_run_main(argv) == 2
    out = capsys.readouterr().out
    assert f"  - dataset_name={path!r}: {expected}" in out and "StopIteration" not in out and "ArrowInvalid" not in out


ROW = '{"problem": "1+1", "answer": "2"}\n'
EMPTY = "is empty: it holds no rows."


@pytest.mark.parametrize(
    "name, content, cause",
    [
        ("empty.jsonl", "", EMPTY), ("empty.json", "", EMPTY), ("empty.parquet", "", EMPTY),
        ("blank.jsonl", "\n  \n", EMPTY), ("list.json", "[]", EMPTY),
        ("cut.jsonl", ROW * 20 + '{"problem": "2+2", "answer": \n' + ROW * 19, "line 21 is not a JSON object"),
        ("braces.jsonl", ROW + "\n\n" + "{problem: 3}\n", "line 4 is not a JSON object"),  # blank lines counted
        ("list.jsonl", ROW + "[1, 2]\n" + ROW, "line 2 is not a JSON object"),
        ("extra-brace.json", ROW * 5 + '{"problem": "1", "answer": "1"}}\n', "line 6 is not a JSON object"),
        ("trailing.json", '[{"problem": "1+1", "answer": "2"},]', ""),
    ],
    ids=["jsonl-0-bytes", "json-0-bytes", "parquet-0-bytes", "jsonl-whitespace", "json-empty-list", "jsonl-cut-line",
         "jsonl-unquoted-key", "jsonl-a-list", "json-lines-extra-brace", "json-trailing-comma"],
)  # fmt: skip
def test_an_empty_or_malformed_dataset_file_is_one_line_naming_the_line(
    no_model_built, tmp_path, capsys, name, content, cause
):
    (path := tmp_path / name).write_text(content)
    with pytest.raises(ValueError) as excinfo:
        load_prompt_dataset(str(path))
    message = str(excinfo.value)
    if cause == EMPTY:
        assert message == f"dataset file '{path}' {EMPTY}"
    else:
        assert message.startswith(f"dataset file '{path}' could not be parsed as json: ") and cause in message, message
    assert "\n" not in message
    if name in ("cut.jsonl", "blank.jsonl"):
        _refused(tmp_path, capsys, str(path), message)


def test_questionable_rows_are_warned_of_and_a_prompt_not_text_or_chat_is_refused_naming_file_lines_and_column(
    no_model_built, tmp_path, caplog, capsys
):
    from stapo_trl.cli.dry_run import main as dry_run_main

    rows = [{"problem": f"{i}+1", "answer": str(i + 1)} for i in range(40)]
    rows[3], rows[5] = {"problem": "", "answer": "1"}, {"problem": "2+2"}  # lines 5 (after the blank line 3) and 7
    rows[9], rows[12] = {"problem": "3+3", "answer": None}, {"problem": "   ", "answer": "4"}  # lines 11 and 14
    lines = [json.dumps(row) for row in rows]
    (path := tmp_path / "rows.jsonl").write_text("\n".join(lines[:2] + [""] + lines[2:]) + "\n")
    dataset = load_prompt_dataset(path := str(path))
    assert len(dataset) == 40 and dataset[3]["prompt"] == format_prompt("")
    empty = f"dataset file {path!r}: lines 5, 14 (column 'problem'): empty prompt: trained on, the model sees the "
    empty += "instruction alone."
    missing = f"dataset file {path!r}: lines 7, 11 (column 'answer'): no answer: math_accuracy gives their "
    missing += "completions no reward (None)."
    assert [r.getMessage() for r in caplog.records if r.name == "stapo_trl.data"] == [empty, missing]
    assert dry_run_main(["--config", STAPO_RECIPE, "--dataset_name", path, "--output_dir", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert f"  - {empty}" in out and f"  - {missing}" in out
    rows[7]["problem"] = rows[20]["problem"] = None  # lines 9 and 22
    lines = [json.dumps(row) for row in rows]
    Path(path).write_text("\n".join(lines[:2] + [""] + lines[2:]) + "\n")
    expected = f"dataset file {path!r}: lines 9, 22 (column 'problem'): a prompt must be a string or a list of chat "
    expected += "messages with 'role' and 'content', got None. Fix or remove those rows."
    with pytest.raises(ValueError) as excinfo:
        load_prompt_dataset(path)
    assert str(excinfo.value) == expected
    _refused(tmp_path, capsys, path, expected)


@pytest.mark.slow  # a stapo-train run with its evaluation
def test_local_file_evaluation_is_labelled_not_held_out(tmp_path, tiny_math_model_path, capsys, caplog):
    from stapo_trl.cli.dry_run import main as dry_run_main
    from stapo_trl.cli.train import main

    data, out = write_jsonl(tmp_path / "sums.jsonl", addition_rows(8)), tmp_path / "out"
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


CHAT = [{"prompt": [{"role": "user", "content": f"{i}+{i}"}], "solution": str(2 * i)} for i in range(8)]
TEXT = [{"prompt": f"{i}+{i}=", "solution": str(2 * i)} for i in range(8)]
TEMPLATES = {  # what jinja refuses: nothing of the template is applied, no code outside it runs
    "none": (None, None, None),  # as google/gemma-3-270m ships
    "sandbox": ("chat_template.jinja", "{{ ''.__class__.__mro__[1].__subclasses__() }}", "SecurityError: access to "
                "attribute '__class__' of 'str' object is unsafe."),  # reported: a traceback in stapo-train and -eval
    "syntax": ("chat_template.jinja", "{% for m in messages %}{{ m.content }}", "TemplateSyntaxError: Unexpected end "
               "of template. Jinja was looking for the following tags: 'endfor' or 'else'. The innermost block that "
               "needs to be closed is 'for'."),
    "raise": ("tokenizer_config.json", "{{ raise_exception('Only system prompts are supported') }}", "TemplateError: "
              "Only system prompts are supported"),  # transformers' own way for a template to refuse messages
}  # fmt: skip


def model_with_template(tiny_random_model_path, folder, kind) -> tuple[str, str]:  # (model, the refusal's start)
    file, text, reason = TEMPLATES[kind]
    shutil.copytree(tiny_random_model_path, folder)
    (folder / "chat_template.jinja").unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if file is None:
        return str(folder), "The prompts of 'builtin:tiny-math' are chat messages, but the tokenizer of "
    (folder / file).write_text(json.dumps(config | {"chat_template": text}) if file.endswith(".json") else text)
    return str(folder), f"The chat template {folder / file} cannot be applied ({reason}): fix or replace it."


def build(model, tmp_path, train, eval_rows=None, record=None, **overrides):
    args = tiny_stapo_config(tmp_path / "out", max_steps=1, **overrides)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always" if record is not None else "ignore")
        trainer = STAPOTrainer(model, zero_reward, args=args, train_dataset=Dataset.from_list(train),
                               eval_dataset=eval_rows and Dataset.from_list(eval_rows))  # fmt: skip
    if record is not None:
        record += [str(w.message) for w in caught]
    return trainer


def test_chat_prompts_without_a_template_are_refused_by_the_trainer_and_stapo_eval_plain_text_goes_through(
    tiny_random_model_path, tmp_path, capsys
):
    from transformers import AutoTokenizer

    from stapo_trl.cli.eval import main
    from stapo_trl.evaluation.generation import build_prompt_text

    model_without_chat_template = model_with_template(tiny_random_model_path, tmp_path / "model", "none")[0]
    for train, eval_rows, name in [(CHAT, None, "train_dataset"), (TEXT, CHAT, "eval_dataset")]:
        with pytest.raises(ValueError) as info:  # was: TRL's error at the first step, after the run files
            build(model_without_chat_template, tmp_path, train, eval_rows, eval_strategy="no")
        message = str(info.value)
        assert message.startswith(f"The prompts of {name!r} are chat messages, but the tokenizer of ")
        assert "has no chat template" in message and "processing_class=tokenizer" in message and "\n" not in message
        assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # no run file left behind
    trainer = build(model_without_chat_template, tmp_path, TEXT)
    trainer.train()
    assert trainer.state.global_step == 1
    tokenizer = AutoTokenizer.from_pretrained(model_without_chat_template)
    with pytest.raises(ValueError, match="^The evaluation prompts are chat messages, but the tokenizer of "):
        build_prompt_text(tokenizer, "1+1")
    assert build_prompt_text(tokenizer, "1+1", use_chat_template=False).startswith("1+1\n")
    argv = ["--model", model_without_chat_template, "--benchmarks", "tiny-math", "--backend", "hf", "--limit", "2",
            "--samples", "1", "--max-new-tokens", "8"]  # fmt: skip
    with pytest.raises(SystemExit) as info:
        main([*argv, "--output", str(tmp_path / "a.json")])
    line = error_line(capsys, "stapo-eval")
    assert info.value.code == 2 and "stapo-eval's prompts are chat messages" in line
    assert "no chat template" in line and "--no-chat-template" in line
    assert main([*argv, "--no-chat-template", "--output", str(tmp_path / "b.json")]) == 0  # was: silently this


@pytest.mark.parametrize("kind", ["sandbox", "syntax", "raise"])
def test_a_chat_template_jinja_refuses_is_one_line_naming_its_file(kind, tiny_random_model_path, tmp_path):
    from transformers import AutoTokenizer

    model, line = model_with_template(tiny_random_model_path, tmp_path / "model", kind)
    with pytest.raises(ValueError) as raised:
        check_chat_template(AutoTokenizer.from_pretrained(model), Dataset.from_list(CHAT), model)
    assert str(raised.value) == line
    if kind == "sandbox":  # the reported case, when the trainer is built
        with pytest.raises(ValueError) as raised:
            build(model, tmp_path, CHAT)
        assert str(raised.value) == line


@pytest.mark.slow  # stapo-train, its dry run and stapo-eval
@pytest.mark.parametrize("kind", ["none", "sandbox"])
def test_the_commands_refuse_a_template_missing_or_refused_in_one_line(no_model_built, tiny_random_model_path,
                                                                       tmp_path, capsys, kind):  # fmt: skip
    from stapo_trl.cli.dry_run import main as dry_run_main
    from stapo_trl.cli.eval import main as eval_main
    from stapo_trl.cli.train import main as train_main

    model, line = model_with_template(tiny_random_model_path, tmp_path / "model", kind)
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", model, "--output_dir", str(tmp_path / "o")]
    with pytest.raises(SystemExit) as raised:
        train_main(argv)
    assert raised.value.code == 2 and error_line(capsys, "stapo-train").startswith(f"stapo-train: error: {line}")
    assert kind != "none" or "builtin:gemma3-270m adds Gemma's" in str(raised.value)
    assert dry_run_main(argv) == 2 and any(s.startswith(f"  - {line}") for s in capsys.readouterr().out.splitlines())
    if kind == "sandbox":  # stapo-eval's missing template: test_chat_prompts_without_a_template_...
        with pytest.raises(SystemExit) as raised:
            eval_main(["--model", model, "--benchmarks", "tiny-math", "--limit", "2", "--max-new-tokens", "8",
                       "--backend", "hf", "--output", str(tmp_path / "a.json")])  # fmt: skip
        assert (raised.value.code, error_line(capsys, "stapo-eval")) == (2, f"stapo-eval: error: {line}")


NO_ROWS = "Dataset {!r} is empty (0 rows): give it prompts (rows with a 'prompt' column)."
NO_PROMPT = "Column 'prompt' not found in dataset 'train_dataset'. Available columns: {}. TRL reads each prompt "
NO_PROMPT += "from a column named 'prompt': rename yours (dataset.rename_column('question', 'prompt')), or pass an "
NO_PROMPT += "environment_factory whose reset() supplies the prompt."


@pytest.mark.parametrize(
    "dataset, prompt_optional, expected",
    [
        (Dataset.from_list([]), False, NO_ROWS.format("train_dataset")),  # reported: got "Column 'prompt' not found"
        (Dataset.from_list([]), True, NO_ROWS.format("train_dataset")),  # an environment supplies prompts, not rows
        (Dataset.from_dict({"prompt": [], "solution": []}), False, NO_ROWS.format("train_dataset")),
        ({"held_out": Dataset.from_list([])}, True, NO_ROWS.format("train_dataset['held_out']")),
        (Dataset.from_dict({"environment": ["a", "b"]}), True, None),  # with an environment: no prompt needed
        (Dataset.from_dict({"level": [1, 2]}).to_iterable_dataset(), True, None),
        ({"easy": Dataset.from_dict({"environment": ["a"]}), "hard": Dataset.from_dict({"prompt": ["x"]})}, True,
         None),
        (Dataset.from_dict({"environment": ["a", "b"]}), False, NO_PROMPT.format(["environment"])),  # TRL: at step 1
        (Dataset.from_dict({"level": [1, 2]}).to_iterable_dataset(), False, NO_PROMPT.format(["level"])),
    ],
    ids=["no-columns", "no-columns-environment", "columns-no-rows", "empty-eval", "routing-column-only", "iterable",
         "dict-of-eval-datasets", "routing-column-no-environment", "iterable-no-environment"],
)  # fmt: skip
def test_a_dataset_without_rows_or_prompts_is_one_line(dataset, prompt_optional, expected):
    check_reward_columns(zero_reward, dataset, "train_dataset")  # `completions` is TRL's, not a column
    if expected is None:
        return check_prompt_column(dataset, "train_dataset", prompt_optional=prompt_optional)
    with pytest.raises(ValueError) as raised:
        check_prompt_column(dataset, "train_dataset", prompt_optional=prompt_optional)
    assert str(raised.value) == expected


@pytest.mark.parametrize(
    "grad_accum, dry_run, warned",
    [(1, False, True), pytest.param(1, True, True, marks=pytest.mark.slow),  # a dry run each: ~2 s
     pytest.param(2, True, False, marks=pytest.mark.slow)],
    ids=["half-group", "half-group-as-the-dry-run", "whole-group-over-2-micro-steps-as-the-dry-run"],
)  # fmt: skip
def test_the_run_warns_of_partial_prompt_groups_as_its_dry_run_does(
    tiny_random_model_path, tmp_path, grad_accum, dry_run, warned
):
    from stapo_trl.cli.dry_run import dry_run_recipe

    # num_generations 8: the rollout batch holds whole groups (8 completions), an optimizer update may not (4 or 8)
    geometry = dict(per_device_train_batch_size=4, gradient_accumulation_steps=grad_accum, steps_per_generation=2,
                    num_generations=8)  # fmt: skip
    caught = []
    build(tiny_random_model_path, tmp_path, CHAT * 2, record=caught, **geometry)
    run = [message for message in caught if "splits prompt groups" in message]
    assert bool(run) == warned and all("an update of 4 completions splits prompt groups" in m for m in run), run
    if dry_run:
        report = dry_run_recipe(["--config", STAPO_RECIPE, *[f"--{k}={v}" for k, v in geometry.items()]], 1)
        assert run == [w for w in report.warnings if "splits prompt groups" in w]


def difficulty_reward(completions, difficulty, **kwargs):
    return [float(d) for d in difficulty]


NO_SOLUTION, WITH_SOLUTION = [{"prompt": "12+34=", "answer": "46"}], [{"prompt": "12+34=", "solution": "46"}]
NO_PROMPT_ROWS = [{"question": "12+34=", "solution": "46"}]
NEEDS_SOLUTION = r"^Column 'solution' not found in dataset 'train_dataset'.*\['prompt', 'answer'\].*'math_accuracy_"


@pytest.mark.parametrize("reward, train, held_out, refusal", [
    (math_accuracy_reward, NO_PROMPT_ROWS, None, r"^Column 'prompt' not found in dataset 'train_dataset'\. Available"),
    ("math_acc", NO_PROMPT_ROWS, None, r"Unknown reward 'math_acc'\. Valid names: \['format', 'math_accuracy'\]"),
    ("math_accuracy", NO_SOLUTION, None, NEEDS_SOLUTION + "reward' needs it"),  # by name or by function
    (math_accuracy_reward, NO_SOLUTION, None, NEEDS_SOLUTION + "reward' needs it"),
    # several rewards and several eval datasets: the first function with a missing argument, the dataset by key
    ([format_reward, math_accuracy_reward], WITH_SOLUTION, NO_SOLUTION,
     r"Column 'solution' not found in dataset \"eval_dataset\['held_out'\]\""),
    ([difficulty_reward], WITH_SOLUTION, None, r"Column 'difficulty' not found .* 'difficulty_reward' needs it"),
    (lambda prompt, completions: [], WITH_SOLUTION, None, r"an argument 'prompt', which TRL never fills.*`prompts`"),
    # filled arguments pass: a column, a default, a bound partial argument, TRL's own arguments and **kwargs
    (math_accuracy_reward, WITH_SOLUTION, None, None),
    (functools.partial(difficulty_reward, difficulty=[1]), WITH_SOLUTION, None, None),
    (lambda completions, difficulty=0, **kwargs: [], WITH_SOLUTION, None, None),
    (lambda prompts, completions, completion_ids, trainer_state, log_metric, log_extra: [], WITH_SOLUTION, None, None),
])  # fmt: skip
def test_bad_datasets_and_reward_names_fail_at_construction_naming_function_column_and_columns(
    no_model_built, tiny_random_model_path, tmp_path, reward, train, held_out, refusal
):
    model = "Qwen/Qwen3-1.7B-Base" if refusal else tiny_random_model_path  # never fetched: the checks come first
    with pytest.raises(ValueError if refusal else AssertionError, match=refusal or "a trainer was constructed"):
        STAPOTrainer(model, reward, args=tiny_stapo_config(tmp_path / "out"), train_dataset=Dataset.from_list(train),
                     eval_dataset=held_out and {"held_out": Dataset.from_list(held_out)})  # fmt: skip


def test_a_reward_named_is_that_function_checked_and_another_name_a_reward_model_id():
    assert resolve_reward_names("math_accuracy").__wrapped__ is math_accuracy_reward  # was: a Hub id and its retries
    resolved = resolve_reward_names(["format", "org/reward-model"])
    assert [resolved[0].__wrapped__, resolved[1]] == [format_reward, "org/reward-model"]
