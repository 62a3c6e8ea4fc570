"""The benchmark normalisation layer (`stapo_trl.evaluation.tasks`): record layouts of the benchmark files, the
instructions stripped from problems, the benchmark registry and the paper's sample counts, and the real benchmark
copies in `shared/data/` (see its SOURCES.md), which load with the expected number of rows."""

import re

import pytest

from stapo_trl.evaluation.tasks import (
    BENCHMARKS,
    PAPER_BENCHMARKS,
    clean_problem_text,
    find_benchmark_file,
    get_benchmark_spec,
    load_benchmark,
    normalize_record,
    normalize_records,
    read_rows,
)
from stapo_trl.grading import is_correct


def test_normalize_record_layouts():
    verl = {
        "prompt": [
            {"role": "system", "content": "You are helpful."},
            {
                "role": "user",
                "content": "What is 1+1? Let's think step by step and output the final answer within \\boxed{}.",
            },
        ],
        "reward_model": {"ground_truth": "\\boxed{2}", "style": "rule"},
        "extra_info": {"index": "X-0"},
    }
    p = normalize_record(verl)
    assert (p.id, p.problem, p.gold) == ("X-0", "What is 1+1?", "2")

    gsm8k = {"question": "How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 1,007", "idx": 5}
    assert normalize_record(gsm8k).gold == "1007"

    minerva = {"problem": "Find s.", "solution": "Thus $s=\\boxed{1.6} \\mathrm{~cm}$", "idx": 0}
    assert normalize_record(minerva).gold == "1.6"

    olympiad = {"question": "Find all n.", "final_answer": ["$1,3$"], "id": 7}
    assert normalize_record(olympiad).gold == "$1,3$"

    amc = {"problem": "How far?", "answer": 27.0, "id": 0}
    assert normalize_record(amc).gold == "27"

    dapo = {
        "prompt": "Solve it.",
        "solution": "34",
        "source_prompt": [{"role": "user", "content": "Solve the following math problem step by step."}],
        "reward_model": {"ground_truth": "34"},
    }
    assert normalize_record(dapo).gold == "34"

    with pytest.raises(ValueError, match="no gold"):
        normalize_record({"problem": "x"})
    with pytest.raises(ValueError, match="no problem"):
        normalize_record({"answer": "1"})


def test_clean_problem_text_strips_known_instructions():
    dapo = (
        "Solve the following math problem step by step. The last line of your response should be of the form "
        "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\nFind $x$.\n\n"
        'Remember to put your answer on its own line after "Answer:".'
    )
    assert clean_problem_text(dapo) == "Find $x$."
    ours = "Find $x$.\nPlease reason step by step, and put your final answer within \\boxed{}."
    assert clean_problem_text(ours) == "Find $x$."
    # A problem that merely starts with "Please" keeps its text.
    assert clean_problem_text("Please find $x$. What is $y$?") == "Please find $x$. What is $y$?"


def test_unknown_benchmark_lists_valid_names():
    with pytest.raises(ValueError) as info:
        get_benchmark_spec("aime23")
    for name in BENCHMARKS:
        assert name in str(info.value)
    assert get_benchmark_spec("MATH-500").name == "math500"


def test_paper_defaults():
    # STAPO Sec. 4: avg@32 on AIME24/AIME25/AMC23, avg@4 on MATH-500/Minerva/OlympiadBench.
    assert PAPER_BENCHMARKS == ("aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench")
    samples = {b: BENCHMARKS[b].default_samples for b in PAPER_BENCHMARKS}
    assert samples == {"aime24": 32, "aime25": 32, "amc23": 32, "math500": 4, "minerva": 4, "olympiadbench": 4}


# (relative path, rows) from shared/data/SOURCES.md.
REAL_FILES = [
    ("aime24/test.parquet", 30), ("aime24/test.json", 30), ("aime24/test.jsonl", 30), ("aime25/test.parquet", 30),
    ("aime25/test.json", 30), ("amc23/test.parquet", 40), ("amc23/test.json", 40), ("amc23/test.jsonl", 40),
    ("math500/test.parquet", 500), ("math500/test.jsonl", 500), ("minerva/test.parquet", 272),
    ("minerva/test.jsonl", 272), ("olympiadbench/test.parquet", 674), ("olympiadbench/test.jsonl", 675),
    ("gsm8k/test.jsonl", 1319), ("mixed/math_benchmarks.jsonl", 560), ("dapo_math_17k/dapo_math_17k.head28.jsonl", 28),
]  # fmt: skip


@pytest.mark.parametrize("relpath, rows", REAL_FILES, ids=[p for p, _ in REAL_FILES])
def test_real_file_loads(shared_data_dir, relpath, rows):
    problems = normalize_records(read_rows(shared_data_dir / relpath))
    assert len(problems) == rows
    assert len({p.id for p in problems}) == rows  # ids are unique
    assert all(p.problem.strip() and p.gold not in ("", []) for p in problems)
    assert not any(re.search(r"\\boxed\{\}", p.problem) for p in problems)  # instructions stripped


@pytest.mark.parametrize("name", PAPER_BENCHMARKS + ("gsm8k",))
def test_load_benchmark_from_data_dir(shared_data_dir, name):
    problems = load_benchmark(name, data_dir=shared_data_dir)
    expected = {"olympiadbench": 675}.get(name, BENCHMARKS[name].num_problems)
    assert len(problems) == expected
    assert all(p.benchmark == name for p in problems)
    assert len(load_benchmark(name, data_dir=shared_data_dir, limit=3)) == 3
    # The data file itself is accepted as data_dir too.
    assert len(load_benchmark(name, data_dir=find_benchmark_file(name, shared_data_dir), limit=2)) == 2


def test_missing_benchmark_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="aime24"):
        load_benchmark("aime24", data_dir=tmp_path)


def test_builtin_tiny_math_benchmark():
    problems = load_benchmark("tiny-math", limit=5)
    assert len(problems) == 5
    assert all(re.fullmatch(r"\d\d\+\d\d", p.problem) for p in problems)
    assert all(is_correct(rf"\boxed{{{eval(p.problem)}}}", p.gold) for p in problems)  # noqa: S307 - "a+b" only
