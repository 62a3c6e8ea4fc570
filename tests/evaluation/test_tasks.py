"""The benchmarks (layouts, instructions stripped, the registry, `shared/data/`'s copies), avg@k and pass@k."""

import itertools
import re

import pytest

from stapo_trl.data import INSTRUCTION
from stapo_trl.evaluation import tasks
from stapo_trl.grading import is_correct


LAYOUTS = {  # row -> (id, problem, gold)
    "verl": ({"prompt": [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "What is 1+1? "
              "Let's think step by step and output the final answer within \\boxed{}."}],
              "reward_model": {"ground_truth": "\\boxed{2}", "style": "rule"}, "extra_info": {"index": "X-0"}},
             ("X-0", "What is 1+1?", "2")),
    "gsm8k": ({"question": "How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 1,007", "idx": 5},
              ("5", "How many?", "1007")),
    "minerva": ({"problem": "Find s.", "solution": "Thus $s=\\boxed{1.6} \\mathrm{~cm}$", "idx": 0},
                ("0", "Find s.", "1.6")),
    "olympiad": ({"question": "Find all n.", "final_answer": ["$1,3$"], "id": 7}, ("7", "Find all n.", "$1,3$")),
    "amc": ({"problem": "How far?", "answer": 27.0, "id": 0}, ("0", "How far?", "27")),
    "dapo": ({"prompt": "Solve it.", "solution": "34", "reward_model": {"ground_truth": "34"},
              "source_prompt": [{"role": "user", "content": "Solve the following math problem step by step."}]},
             ("0", "Solve it.", "34")),
}  # fmt: skip


def test_layouts_refusals_files_pass_at_k_and_benchmark_metrics(tmp_path):
    for layout, (row, expected) in LAYOUTS.items():
        assert tuple(tasks.normalize_record(row))[:3] == expected, layout
    unknown = "Unknown benchmark 'aime23'. Valid benchmarks: " + ", ".join(tasks.BENCHMARKS)
    refused = [("normalize_record", {"problem": "x"}, "no gold"), ("normalize_record", {"answer": "1"}, "no problem")]
    for call, arg, match in [*refused, ("get_benchmark_spec", "aime23", unknown)]:
        with pytest.raises(ValueError, match=match):
            getattr(tasks, call)(arg)
    assert tasks.get_benchmark_spec("MATH-500").name == "math500"
    samples = {b: tasks.BENCHMARKS[b].default_samples for b in tasks.PAPER_BENCHMARKS}  # STAPO Sec. 4: avg@32, avg@4
    assert samples == {"aime24": 32, "aime25": 32, "amc23": 32, "math500": 4, "minerva": 4, "olympiadbench": 4}
    dapo = ("Solve the following math problem step by step. The last line of your response should be of the form "
            "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\nFind $x$.\n\n"
            'Remember to put your answer on its own line after "Answer:".')  # fmt: skip
    assert tasks.clean_problem_text(dapo) == "Find $x$." == tasks.clean_problem_text(f"Find $x$.\n{INSTRUCTION}")
    assert tasks.clean_problem_text("Please find $x$. What is $y$?") == "Please find $x$. What is $y$?"
    with pytest.raises(FileNotFoundError, match="No data file for benchmark 'aime24'; tried: "):
        tasks.load_benchmark("aime24", data_dir=tmp_path)
    problems = tasks.load_benchmark("tiny-math", limit=5)  # the built-in benchmark
    assert len(problems) == 5 and all(re.fullmatch(r"\d\d\+\d\d", p.problem) for p in problems)
    assert all(is_correct(rf"\boxed{{{eval(p.problem)}}}", p.gold) for p in problems)  # noqa: S307 - "a+b" only
    cases = [(n, c, k) for n in range(1, 9) for c in range(n + 1) for k in range(1, n + 1)]
    for n, c, k in cases:
        subsets = list(itertools.combinations([True] * c + [False] * (n - c), k))
        assert tasks.pass_at_k(n, c, k) == pytest.approx(sum(map(any, subsets)) / len(subsets), abs=1e-12)
    assert (tasks.pass_at_k(32, 0, 32), tasks.pass_at_k(32, 32, 1), tasks.pass_at_k(32, 8, 1)) == (0.0, 1.0, 0.25)
    for n, c, k in ((4, 1, 8), (4, 5, 1)):
        with pytest.raises(ValueError, match="1 <= k <= n and 0 <= c <= n"):
            tasks.pass_at_k(n, c, k)
    budgets = [list(tasks.benchmark_metrics([[True] * n], n)["pass@k"]) for n in (32, 4, 6, 1)]  # powers of two <= n
    assert budgets == [["1", "2", "4", "8", "16", "32"], ["1", "2", "4"], ["1", "2", "4"], ["1"]]
    # benchmark_metrics of 2/4, 0/4 and 4/4 correct: avg@4 = (0.5 + 0 + 1) / 3 = pass@1; pass@4 = (1 + 0 + 1) / 3.
    table = tasks.benchmark_metrics([[True, False, True, False], [False] * 4, [True] * 4], 4)
    assert table["avg@4"] == pytest.approx(0.5) and table["pass@k"]["1"] == pytest.approx(0.5)
    assert table["pass@k"]["4"] == pytest.approx(2 / 3) and (table["num_problems"], table["n_samples"]) == (3, 4)
    for correct, ids, problem in [([[True, False], []], ["p0", "p1"], "p1"), ([[], []], ["a", "b"], "a"),
                                  ([[True], [], [False]], None, "#1")]:  # fmt: skip
        with pytest.raises(ValueError, match=f"^benchmark aime24 problem {problem} has no graded sample"):
            tasks.benchmark_metrics(correct, 2, benchmark="aime24", problem_ids=ids)


REAL_FILES = [  # (relative path, rows) from shared/data/SOURCES.md
    ("aime24/test.parquet", 30), ("aime24/test.json", 30), ("aime24/test.jsonl", 30), ("aime25/test.parquet", 30),
    ("aime25/test.json", 30), ("amc23/test.parquet", 40), ("amc23/test.json", 40), ("amc23/test.jsonl", 40),
    ("math500/test.parquet", 500), ("math500/test.jsonl", 500), ("minerva/test.parquet", 272),
    ("minerva/test.jsonl", 272), ("olympiadbench/test.parquet", 674), ("olympiadbench/test.jsonl", 675),
    ("gsm8k/test.jsonl", 1319), ("mixed/math_benchmarks.jsonl", 560), ("dapo_math_17k/dapo_math_17k.head28.jsonl", 28),
]  # fmt: skip


@pytest.mark.parametrize("relpath, rows", REAL_FILES, ids=[p for p, _ in REAL_FILES])
def test_real_file_loads(shared_data_dir, relpath, rows):
    problems = tasks.normalize_records(tasks.read_rows(shared_data_dir / relpath))
    assert len(problems) == len({p.id for p in problems}) == rows  # ids are unique
    assert all(p.problem.strip() and p.gold not in ("", []) for p in problems)
    assert not any(re.search(r"\\boxed\{\}", p.problem) for p in problems)  # instructions stripped
    name = relpath.split("/")[0]  # the file load_benchmark reads from a data folder: the spec's count, its limit
    if name in tasks.BENCHMARKS and tasks.find_benchmark_file(name, shared_data_dir) == shared_data_dir / relpath:
        assert rows == tasks.BENCHMARKS[name].num_problems
        assert [p.benchmark for p in tasks.load_benchmark(name, data_dir=shared_data_dir, limit=3)] == [name] * 3
        assert len(tasks.load_benchmark(name, data_dir=shared_data_dir / relpath, limit=2)) == 2  # the file itself
