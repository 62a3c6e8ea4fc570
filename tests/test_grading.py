"""The one grader (`stapo_trl.grading`) and the benchmark normalisation layer (`stapo_trl.evaluation.tasks`).

The real-data tests read the benchmark copies in `shared/data/` (see its SOURCES.md for row counts and quirks):
every file loads with the expected number of rows, and each problem's own gold written as a boxed completion is
graded correct on >= 99 % of the problems of every file. The few exceptions are listed in `KNOWN_GOLD_EXCEPTIONS`
with the reason, so a new one fails loudly.
"""

import re
import threading

import pytest

from stapo_trl import grading
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
from stapo_trl.grading import GRADER_STATS, extract_boxed_answer, gold_parts, grade, is_correct


# ----------------------------------------------------------------------------------------------------------------
# Box extraction
# ----------------------------------------------------------------------------------------------------------------


class TestExtractBoxedAnswer:
    def test_nested_braces(self):
        assert extract_boxed_answer(r"so $\boxed{\frac{1}{3}}$.") == r"\frac{1}{3}"
        assert extract_boxed_answer(r"\boxed{\left\{1, 2\right\}}") == r"\left\{1, 2\right\}"

    def test_last_box_wins(self):
        assert extract_boxed_answer(r"first \boxed{12}, then \boxed{13}") == "13"

    def test_fbox_and_braceless(self):
        assert extract_boxed_answer(r"\fbox{7}") == "7"
        assert extract_boxed_answer(r"The answer is \boxed 5.") == "5."

    def test_no_box_or_empty(self):
        assert extract_boxed_answer("The answer is 5.") is None
        assert extract_boxed_answer("") is None
        assert extract_boxed_answer(None) is None
        assert extract_boxed_answer(r"\boxed{}") is None
        assert extract_boxed_answer(r"\boxedx{3}") is None  # another command, not a box

    def test_unterminated_last_box_is_no_answer(self):
        # A truncated generation: the earlier, abandoned box must not count.
        assert extract_boxed_answer(r"\boxed{12} no wait, \boxed{\frac{1}{") is None


# ----------------------------------------------------------------------------------------------------------------
# Known traps
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        (r"\boxed{\frac{1}{3}}", r"\frac{1}{3}", True),
        (r"\boxed{\dfrac{1}{3}}", "1/3", True),
        (r"\boxed{0.5}", r"\frac{1}{2}", True),
        (r"\boxed{3} ... so finally \boxed{4}", "4", True),
        (r"\boxed{4} ... so finally \boxed{3}", "4", False),
        ("The answer is 4", "4", False),  # no box
        (r"\boxed{\text{13}}", "13", True),
        (r"\boxed{13}", r"\text{13}", True),
        (r"\boxed{25}", "025", True),  # leading zeros (AIME json golds)
        (r"\boxed{025}", "25", True),
        (r"\boxed{27}", 27.0, True),  # float gold (AMC23 jsonl)
        (r"\boxed{27.0}", "27", True),
        (r"\boxed{28}", 27.0, False),
        (r"\boxed{204}", r"\boxed{204}", True),  # verl ground truth keeps the box
        (r"\boxed{\frac{1}{2}}", r"$\frac{1}{2}$", True),  # $-wrapped gold (OlympiadBench)
        (r"\boxed{1,000}", "1000", True),
        (r"\boxed{-3}", "3", False),
        (r"\boxed{x = 5}", "5", True),
        (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)", True),
        (r"\boxed{4.5 \times 10^{33}}", "4.5e33", True),  # Python-style Minerva gold
        (r"\boxed{\arcsin(10/13)}", "np.arcsin(10/13)", True),
        (r"\boxed{-\frac{1}{3}}", "-1./3", True),
        (r"\boxed{84, 69}", ["$69$", "$84$"], True),  # multi-answer: any order
        (r"\boxed{69}", ["$69$", "$84$"], False),  # multi-answer: all parts needed
        (r"\boxed{69} and \boxed{84}", "$69$,$84$", True),  # one box per part
        (r"\boxed{2,0,-2}", "$-2,0,2$", True),
        ("", "5", False),
        (None, "5", False),
    ],
)
def test_known_traps(completion, gold, expected):
    assert is_correct(completion, gold) is expected


def test_unparseable_gold_never_credits():
    GRADER_STATS.clear()
    for gold in [r"\frac{", "", None, [], r"\unknowncommand{{"]:
        for completion in [rf"\boxed{{{gold}}}", r"\boxed{1}", ""]:
            result = grade(completion, gold)
            assert not result.correct, (completion, gold)
    result = grade(r"\boxed{1}", r"\frac{")
    assert not result.correct and result.error and result.error.startswith("gold unparseable")
    assert GRADER_STATS["gold_unparseable"] >= 1


def test_grade_result_fields():
    result = grade(r"We get \boxed{\frac{2}{4}}.", "1/2")
    assert result.correct and result.extracted == r"\frac{2}{4}" and result.error is None
    result = grade("no box here", "1/2")
    assert not result.correct and result.extracted is None and result.error is None


def test_grader_exception_counts_as_wrong(monkeypatch):
    # A math-verify crash must never raise and never score 1; it is reported and counted.
    def boom(*args, **kwargs):
        raise RuntimeError("sympy exploded")

    monkeypatch.setattr(grading.verify, "_verify", boom)
    GRADER_STATS.clear()
    result = grade(r"\boxed{\frac{1}{2}}", "0.5")
    assert not result.correct
    assert "sympy exploded" in result.error
    assert GRADER_STATS["errors"] == 1


def test_timeout_counts_as_wrong(monkeypatch):
    from math_verify.errors import TimeoutException

    def slow(*args, **kwargs):
        raise TimeoutException("Operation timed out!")

    monkeypatch.setattr(grading.verify, "_verify", slow)
    GRADER_STATS.clear()
    result = grade(r"\boxed{x^2}", "x**2 + 0")
    assert not result.correct and result.error.startswith("timeout")
    assert GRADER_STATS["timeouts"] == 1


def test_off_main_thread_grading():
    # math-verify's signal.alarm timeouts raise off the main thread; the grader must switch them off there.
    results, errors = [], []

    def worker():
        try:
            results.append(grade(r"\boxed{\frac{1}{3}}", r"$\frac{2}{6}$"))
            results.append(grade(r"\boxed{\sqrt{2}/2}", r"\frac{\sqrt{2}}{2}"))
            results.append(grade(r"\boxed{3}", "4"))
        except BaseException as e:  # pragma: no cover - the assertion below reports it
            errors.append(e)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(60)
    assert not errors
    assert [r.correct for r in results] == [True, True, False]
    assert all(r.error is None for r in results), results


def test_off_main_thread_timeout_is_bounded(monkeypatch):
    # Off the main thread a hung comparison is abandoned after THREAD_TIMEOUT_S and counted as a timeout.
    import time

    def hang(*args, **kwargs):
        time.sleep(5)
        return True

    assert grade(r"\boxed{x+1}", "1+x").correct  # parses (and caches) the gold with the normal time bound
    monkeypatch.setattr(grading.verify, "_verify", hang)
    monkeypatch.setattr(grading.bound, "GRADE_TIMEOUT_S", 0.5)
    out = []
    thread = threading.Thread(target=lambda: out.append(grade(r"\boxed{x+1}", "1+x")))
    thread.start()
    thread.join(30)
    assert len(out) == 1 and not out[0].correct and out[0].error.startswith("timeout")


def test_gold_parts_layouts():
    assert gold_parts(27.0) == ["27"]
    assert gold_parts(2.5) == ["2.5"]
    assert gold_parts(r"\boxed{204}") == ["204"]
    assert gold_parts("$69$,$84$") == ["69", "84"]
    assert gold_parts(["$f(x)=x$"]) == ["f(x)=x"]
    assert gold_parts(None) == []


# ----------------------------------------------------------------------------------------------------------------
# Normalisation layer: synthetic layouts
# ----------------------------------------------------------------------------------------------------------------


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
    assert {b: BENCHMARKS[b].default_samples for b in PAPER_BENCHMARKS} == {
        "aime24": 32,
        "aime25": 32,
        "amc23": 32,
        "math500": 4,
        "minerva": 4,
        "olympiadbench": 4,
    }


# ----------------------------------------------------------------------------------------------------------------
# Real benchmark files (shared/data)
# ----------------------------------------------------------------------------------------------------------------

# (relative path, rows) from shared/data/SOURCES.md.
REAL_FILES = [
    ("aime24/test.parquet", 30),
    ("aime24/test.json", 30),
    ("aime24/test.jsonl", 30),
    ("aime25/test.parquet", 30),
    ("aime25/test.json", 30),
    ("amc23/test.parquet", 40),
    ("amc23/test.json", 40),
    ("amc23/test.jsonl", 40),
    ("math500/test.parquet", 500),
    ("math500/test.jsonl", 500),
    ("minerva/test.parquet", 272),
    ("minerva/test.jsonl", 272),
    ("olympiadbench/test.parquet", 674),
    ("olympiadbench/test.jsonl", 675),
    ("gsm8k/test.jsonl", 1319),
    ("mixed/math_benchmarks.jsonl", 560),
    ("dapo_math_17k/dapo_math_17k.head28.jsonl", 28),
]

# Golds that math-verify cannot turn into SymPy, so they never give credit (by design), with the reason.
KNOWN_GOLD_EXCEPTIONS = {
    "E_{1},E_{2}": "latex2sympy rejects the symbol E with a subscript (Minerva idx 269)",
    "$t(0,4]$": "malformed gold, the source means t in (0,4] (OlympiadBench id 2045)",
}


def _gold_as_completion(gold):
    text = gold if isinstance(gold, str) else ", ".join(gold)
    return f"Working... so the final answer is \\boxed{{{text}}}."


@pytest.mark.parametrize("relpath, rows", REAL_FILES, ids=[p for p, _ in REAL_FILES])
def test_real_file_loads(shared_data_dir, relpath, rows):
    problems = normalize_records(read_rows(shared_data_dir / relpath))
    assert len(problems) == rows
    assert len({p.id for p in problems}) == rows  # ids are unique
    assert all(p.problem.strip() and p.gold not in ("", []) for p in problems)
    assert not any(re.search(r"\\boxed\{\}", p.problem) for p in problems)  # instructions stripped


# Gold-as-answer on the file `load_benchmark` picks for each benchmark, plus the verl copies whose golds differ in
# form (boxed or numpy-style ground truths). The other copies hold the same golds (see test_cross_copies_agree).
GOLD_FILES = [
    "aime24/test.jsonl",
    "aime24/test.parquet",
    "aime25/test.parquet",
    "amc23/test.jsonl",
    "amc23/test.parquet",
    "math500/test.jsonl",
    "minerva/test.jsonl",
    "minerva/test.parquet",
    "olympiadbench/test.jsonl",
    "gsm8k/test.jsonl",
]


@pytest.mark.parametrize("relpath", GOLD_FILES)
def test_own_gold_scores(shared_data_dir, relpath):
    problems = normalize_records(read_rows(shared_data_dir / relpath))
    failures = []
    for p in problems:
        result = grade(_gold_as_completion(p.gold), p.gold)
        if not result.correct:
            failures.append((p.id, p.gold, result.error))
    accuracy = 1 - len(failures) / len(problems)
    print(f"{relpath}: gold-as-answer accuracy {accuracy:.4f}; exceptions: {failures}")
    assert accuracy >= 0.99, failures
    unexpected = [f for f in failures if f[1] not in KNOWN_GOLD_EXCEPTIONS]
    assert not unexpected, unexpected


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


def test_cross_copies_agree(shared_data_dir):
    # The same problem's gold from one copy, boxed, is correct against another copy's gold: "025" vs "25",
    # 27.0 vs "27", "\boxed{204}" vs "204" (SOURCES.md, "Known quirks").
    def by_text(relpath):
        return {re.sub(r"\W+", "", p.problem)[:80]: p for p in normalize_records(read_rows(shared_data_dir / relpath))}

    pairs = [
        ("aime24/test.json", "aime24/test.parquet"),
        ("aime25/test.json", "aime25/test.parquet"),
        ("amc23/test.jsonl", "amc23/test.parquet"),
        ("amc23/test.json", "amc23/test.jsonl"),
    ]
    for a, b in pairs:
        copy_a, copy_b = by_text(a), by_text(b)
        common = set(copy_a) & set(copy_b)
        assert len(common) >= 0.9 * min(len(copy_a), len(copy_b))
        bad = [
            (copy_a[k].gold, copy_b[k].gold)
            for k in common
            if not is_correct(_gold_as_completion(copy_a[k].gold), copy_b[k].gold)
            and copy_a[k].gold not in KNOWN_GOLD_EXCEPTIONS
        ]
        assert not bad, (a, b, bad)


def test_wrong_answers_rejected(shared_data_dir):
    # Another problem's gold must (almost) never be accepted: guards against a too-lenient grader.
    problems = load_benchmark("math500", data_dir=shared_data_dir, limit=120)
    false_positives = [
        (p.gold, q.gold)
        for p, q in zip(problems, problems[7:] + problems[:7])
        if str(p.gold) != str(q.gold) and is_correct(_gold_as_completion(q.gold), p.gold)
    ]
    assert not false_positives


def test_builtin_tiny_math_benchmark():
    problems = load_benchmark("tiny-math", limit=5)
    assert len(problems) == 5
    assert all(re.fullmatch(r"\d\d\+\d\d", p.problem) for p in problems)
    assert all(is_correct(rf"\boxed{{{eval(p.problem)}}}", p.gold) for p in problems)  # noqa: S307 - "a+b" only


@pytest.mark.parametrize("relpath", ["math500/test.jsonl", "olympiadbench/test.jsonl", "minerva/test.jsonl"])
def test_own_gold_scores_through_sympy(shared_data_dir, relpath, monkeypatch):
    # test_own_gold_scores mostly takes the string-equality fast path; this runs the same check through math-verify
    # (fast path disabled) on the first 120 problems, so the SymPy route is exercised on real golds too.
    counter = iter(range(10**9))
    monkeypatch.setattr(grading.api, "_squash", lambda s: f"{s}\x00{next(counter)}")
    problems = normalize_records(read_rows(shared_data_dir / relpath))[:120]
    failures = [
        (p.gold, r.error)
        for p in problems
        if not (r := grade(_gold_as_completion(p.gold), p.gold)).correct and p.gold not in KNOWN_GOLD_EXCEPTIONS
    ]
    assert not failures


# ----------------------------------------------------------------------------------------------------------------
# Issue 11: exact magnitudes, multiple choice, upright constants, bounded time
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        # Two different exact values, both tiny or both huge, are different (no absolute tolerance).
        (r"\boxed{\frac{1}{2006!}}", r"\frac{1}{2004!}", False),  # the example
        (r"\boxed{2^{-100}}", r"2^{-101}", False),
        (r"\boxed{10^{-20}}", r"2\cdot 10^{-20}", False),
        (r"\boxed{\frac{\sqrt{2}}{10^{30}}}", r"\frac{\sqrt{3}}{10^{30}}", False),  # radicals
        (r"\boxed{10^{-30}\pi}", r"\frac{\pi}{10^{29}}", False),  # pi
        (r"\boxed{2^{200}+1}", r"2^{200}", False),  # huge: relative difference 6e-61
        (r"\boxed{\frac{1}{2006 \cdot 2005 \cdot 2004!}}", r"\frac{1}{2006!}", True),  # equal exact values stay equal
        (r"\boxed{\frac{1}{\sqrt{2}}}", r"\frac{\sqrt{2}}{2}", True),
        (r"\boxed{2^{-100}}", r"\frac{1}{2^{100}}", True),
        # A decimal on either side: relative tolerance DECIMAL_REL_TOL (5e-6).
        (r"\boxed{0.3333}", r"\frac{1}{3}", False),
        (r"\boxed{0.333333}", r"\frac{1}{3}", True),
        (r"\boxed{27.0}", "27", True),
        (r"\boxed{3.14159}", r"\pi", True),
        (r"\boxed{3.14}", r"\pi", False),
        (r"\boxed{1.2 \times 10^{-8}}", r"1.5 \times 10^{-8}", False),  # tiny decimals: relative, not absolute
        (r"\boxed{0.0000001}", "0.0000004", False),
        (r"\boxed{1.5 \times 10^{-8}}", r"1.5 \times 10^{-8}", True),
        (r"\boxed{4.50 \times 10^{33}}", "4.5e33", True),
        (r"\boxed{I(0)}", "4.4e7", False),  # an unevaluated function of a number: no error, just wrong
    ],
)
def test_exact_and_decimal_magnitudes(completion, gold, expected):
    result = grade(completion, gold)
    assert result.correct is expected and result.error is None, result


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        (r"\boxed{\text{C: } 12}", "C", True),  # the examples
        (r"$\boxed{\textbf{(C)}\ 12}$", r"\text{(C)}", True),
        (r"\boxed{\mathrm{(D)}\ \frac{1}{2}}", "D", True),
        (r"\boxed{\textbf{(A) }5}", "(A)", True),
        (r"\boxed{E}", r"\textbf{(E)}", True),
        (r"\boxed{(b)}", "B", True),
        (r"\boxed{\text{(B) } 12}", "C", False),  # the letter decides, not the value
        (r"\boxed{12}", r"\text{(C)}", False),  # no letter against a letter gold
        (r"\boxed{\textbf{(C)}\ 12}", "12", True),  # a numeric gold keeps numeric grading
        (r"\boxed{\textbf{(C)}\ 12}", "13", False),
        (r"\boxed{\text{A: } \frac{1}{2}}", "0.5", True),
    ],
)
def test_multiple_choice(completion, gold, expected):
    assert is_correct(completion, gold) is expected


def test_option_letter():
    assert [grading.option_letter(g) for g in ["C", "(C)", r"\text{(C)}", r"\textbf{C}", r"\mathrm{(c)}"]] == ["C"] * 5
    assert [grading.option_letter(g) for g in ["e", "c", "F", "CD", "12", r"\pi"]] == [None] * 6


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        (r"\boxed{\mathrm{e}^{2}}", "e^2", True),  # the examples
        (r"\boxed{1-\frac{1}{e}}", r"1 - \frac{1}{\mathrm{e}}", True),
        (r"\boxed{1+\frac{1}{\mathrm{e}}}", r"1 - \frac{1}{\mathrm{e}}", False),  # no false positive back
        (r"\boxed{1 + \frac{1}{\mathrm{e}}}", r"1 - \frac{1}{e}", False),
        (r"\boxed{3+2\mathrm{i}}", "3+2i", True),
        (r"\boxed{3-2\mathrm{i}}", "3+2i", False),
        (r"\boxed{\operatorname{arcsin}\frac{1}{2}}", r"\frac{\pi}{6}", True),
        (r"\boxed{\mathrm{sin}\frac{\pi}{6}}", r"\frac{1}{2}", True),
        (r"\boxed{{\rm e}^{-1}}", r"\frac{1}{e}", True),
        (r"\boxed{\frac{\mathrm{d}y}{\mathrm{d}x}}", r"\frac{dy}{dx}", True),
        (r"\boxed{\ln \mathrm{e}^{3}}", "3", True),
    ],
)
def test_upright_constants_and_operators(completion, gold, expected):
    result = grade(completion, gold)
    assert result.correct is expected and result.error is None, result


def test_very_long_integer_answer_does_not_raise():
    # int() refuses strings over 4300 digits; the length guard must come before the integer fast path.
    result = grade(rf"\boxed{{{'1' * 5000}}}", "1")
    assert not result.correct and result.error.startswith("timeout")


PATHOLOGICAL = [
    (r"\boxed{10^{10^{10}}}", "1"),  # the examples
    (r"\boxed{2003^{2002^{2001}}}", "5"),
    (r"\boxed{(10^{7})!}", r"\frac{1}{2}"),
    (r"\boxed{\binom{10^{9}}{10^{5}}}", "3"),
    (r"\boxed{9^{9^{9^{9}}}}", "x+1"),
    (r"\boxed{1}", r"10^{10^{10}}"),  # a pathological gold
]


def _timed_grades(cases):
    import time

    out = []
    for completion, gold in cases:
        start = time.monotonic()
        result = grade(completion, gold)
        out.append((time.monotonic() - start, result))
    return out


def _assert_bounded_timeouts(timed):
    for elapsed, result in timed:
        assert not result.correct and result.error.startswith("timeout"), result
        assert elapsed < grading.bound.GRADE_TIMEOUT_S + 0.5, (elapsed, result)


@pytest.mark.parametrize("context", ["main", "thread", "pool8", "async"])
def test_pathological_answers_are_bounded_timeouts(context):
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    grade(r"\boxed{1/2}", "0.5")  # one-time import outside the timing
    GRADER_STATS.clear()
    if context == "main":
        timed = _timed_grades(PATHOLOGICAL)
    elif context == "thread":
        timed = []
        thread = threading.Thread(target=lambda: timed.extend(_timed_grades(PATHOLOGICAL)), daemon=True)
        thread.start()
        thread.join(60)
        assert not thread.is_alive()
    elif context == "pool8":
        with ThreadPoolExecutor(8) as pool:
            timed = [t for chunk in pool.map(lambda c: _timed_grades([c]), PATHOLOGICAL * 2) for t in chunk]
    else:

        async def reward():
            return _timed_grades(PATHOLOGICAL)

        timed = asyncio.run(reward())
    _assert_bounded_timeouts(timed)
    assert GRADER_STATS["timeouts"] == len(timed)


def test_main_thread_slow_comparison_is_interrupted(monkeypatch):
    # On the main thread a slow pure-Python comparison is interrupted at the bound (setitimer), not abandoned.
    import time

    def slow(*args, **kwargs):
        end = time.monotonic() + 30
        while time.monotonic() < end:
            pass
        return True

    grade(r"\boxed{x+1}", "1+x")  # parses and caches the gold
    monkeypatch.setattr(grading.verify, "_verify", slow)
    monkeypatch.setattr(grading.bound, "GRADE_TIMEOUT_S", 0.3)
    timed = _timed_grades([(r"\boxed{x+1}", "1+x")])
    assert timed[0][0] < 1.0 and timed[0][1].error.startswith("timeout"), timed


def test_worker_process_kills_an_overrun(monkeypatch):
    # With worker processes even a GIL-holding big-integer power is bounded: the worker is killed and replaced.
    # Raising the size limit (in the workers' environment) lets 10^{10^{10}} reach SymPy there.
    import time

    monkeypatch.setenv("STAPO_GRADER_MAX_RESULT_DIGITS", "1e30")
    grading.configure_grader(processes=1)
    try:
        pool = grading.workers._POOL
        deadline = time.monotonic() + 60
        while pool._idle.empty() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pool._idle.empty(), "the grader worker did not start"
        timed = _timed_grades([(r"\boxed{10^{10^{10}}}", "1")])
        assert timed[0][1].error.startswith("timeout") and "worker" in timed[0][1].error, timed
        assert timed[0][0] < grading.bound.GRADE_TIMEOUT_S + 0.5, timed
        while pool.killed < 1 or pool.started < 2 or pool._idle.empty():  # killed, then replaced in the background
            assert time.monotonic() < deadline + 60
            time.sleep(0.1)
        assert is_correct(r"\boxed{\frac{2}{4}}", "0.5") and not is_correct(
            r"\boxed{\frac{1}{2006!}}", r"\frac{1}{2004!}"
        )
    finally:
        grading.configure_grader(processes=0)


def test_configure_grader_validates():
    with pytest.raises(ValueError, match="processes"):
        grading.configure_grader(processes=-1)
    with pytest.raises(ValueError, match="timeout_s"):
        grading.configure_grader(timeout_s=0)


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        # Found by trying formats as a new user (the README's grader line): each was graded wrong before.
        (r"\boxed{12\,345}", "12345", True),  # thin space between digit groups
        (r"\boxed{1\,000\,000}", "1000000", True),
        (r"\boxed{12\,346}", "12345", False),
        (r"\boxed{x > 3}", r"(3,\infty)", True),  # an inequality against an interval gold
        (r"\boxed{x \le 2}", r"(-\infty, 2]", True),
        (r"\boxed{x < 2}", r"(-\infty, 2]", False),
        (r"\boxed{0.\overline{3}}", r"\frac{1}{3}", True),  # repeating decimals
        (r"\boxed{1.2\overline{45}}", r"\frac{137}{110}", True),  # 1.24545... = 137/110
        (r"\boxed{0.\overline{6}}", r"\frac{1}{3}", False),
        ("\\boxed{30°}", "30", True),  # Unicode symbols
        ("\\boxed{2π}", r"2\pi", True),
        ("\\boxed{3×10^{8}}", "300000000", True),
        ("\\boxed{45°}", "30", False),
    ],
)
def test_new_user_formats(completion, gold, expected):
    result = grade(completion, gold)
    assert result.correct is expected and result.error is None, result
