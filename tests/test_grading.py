"""The grader: the last box, rules on top of math-verify, time bounds; against the one it replaced (`PREVIOUS`, git)
on every real benchmark gold (../shared/data): golds grade as before, other changes are rows of docs/evaluation.md."""

import importlib
import io
import re
import subprocess
import sys
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor

import math_verify.grader
import numpy as np
import pytest
from testing_utils import REPO

from stapo_trl import grading
from stapo_trl.evaluation.tasks import normalize_records, read_rows
from stapo_trl.grading import extract_boxed_answer, grade, is_correct


def test_the_last_complete_box_is_the_answer_verdicts_are_the_same_in_threads_and_unparseable_golds_never_pass():
    texts = [r"so \boxed{1} no, \boxed{\frac{1}{3}}.", r"\fbox{ 7 }", r"\boxed{\{1, 2\}}", r"\boxed{}", "no box: 42",
             None, r"\boxed{1} then \boxed{\frac{2}{3}"]  # fmt: skip
    assert list(map(extract_boxed_answer, texts)) == [r"\frac{1}{3}", "7", r"\{1, 2\}", None, None, None, None]
    cases = [(r"\boxed{\frac{1}{3}}", r"$\frac{2}{6}$"), (r"\boxed{\sqrt{2}/2}", r"\frac{\sqrt{2}}{2}"),
             (r"\boxed{3}", "4"), (r"\boxed{0.0000003}", "1e-8"), (r"\boxed{x^2+2x+1}", "(x+1)^2")]  # fmt: skip
    on_main = [grade(*c) for c in cases]
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda c: grade(*c), cases * 4)) == on_main * 4
    assert [r.correct for r in on_main] == [True, True, False, False, True]
    results = [grade(c, gold) for gold in [r"\frac{zz", "", None, [], r"E_{1},E_{2}"]  # an unparseable gold: no credit
               for c in (rf"\boxed{{{gold}}}", r"\boxed{1}", "no box")]  # fmt: skip
    assert all(not r.correct and r.error.startswith("gold unparseable") for r in results), results
    result = grade(rf"\boxed{{{'1' * 5000}}}", "1")  # int() refuses over 4300 digits: refused before
    assert not result.correct and result.error.startswith("timeout: refused")
    assert grade(rf"\boxed{{{'1' * 999}}}", "1" * 999).correct  # long integers do not raise


@pytest.mark.parametrize("answer, gold, expected", [  # fmt: skip
    # math-verify alone: the first three True, 3e-7 for 1e-8; here exact to 40 digits, decimals within 5e-6 relative.
    (r"\frac{1}{2006!}", r"\frac{1}{2004!}", False), (r"2^{-100}", r"2^{-101}", False),
    (r"\frac{\sqrt{2}}{10^{30}}", r"\frac{\sqrt{3}}{10^{30}}", False),
    (r"\frac{1}{2006 \cdot 2005 \cdot 2004!}", r"\frac{1}{2006!}", True),
    (r"\frac{1}{\sqrt{2}}", r"\frac{\sqrt{2}}{2}", True), ("0.0000003", "1e-8", False),
    ("0.000003", "2.7778e-6", False), ("870000000", "8.7e8", True), ("0.333333", r"\frac{1}{3}", True),
    ("0.3333", r"\frac{1}{3}", False), ("27.0", "27", True), (r"4.5 \times 10^{33}", "4.5e33", True),
    (r"4.6 \times 10^{33}", "4.5e33", False), (r"-\frac{1}{3}", "-1./3", True),
    (r"\arcsin\left(\frac{10}{13}\right)", "np.arcsin(10/13)", True),
    (r"\arccos\left(\frac{10}{13}\right)", "np.arcsin(10/13)", False),
    # \text{} decimals; commands as subscripts; a closing period; upright e, i and functions; letters in brackets.
    (r"\text{1.25}", "1.25", True), (r"m_{\max}=n^{2}-n-1", r"$m_{\max }=n^{2}-n-1$", True),
    (r"m_{\max}=n^{2}-n", r"$m_{\max }=n^{2}-n-1$", False), ("13.", "13", True),
    (r"1-\frac{1}{e}", r"1 - \frac{1}{\mathrm{e}}", True),
    (r"1+\frac{1}{\mathrm{e}}", r"1 - \frac{1}{\mathrm{e}}", False), (r"e^{-2}", r"{\rm e}^{-2}", True),
    (r"\frac{1}{2}", r"\operatorname{arcsin}\frac{1}{2}", False),
    (r"\frac{\pi}{6}", r"\operatorname{arcsin}\frac{1}{2}", True),
    (r"\mathrm{sin}\frac{\pi}{6}", r"\frac{1}{2}", True), (r"3-2\mathrm{i}", "3+2i", False),
    (r"3+2\mathrm{i}", "3+2i", True), ("025", "25", True), ("-3", "3", False),
    (r"\frac{2}{6}", r"$\frac{1}{3}$", True), (r"x > 3", r"(3, \infty)", True), (r"\text{(C)}", r"\text{(C)}", True),
    ("(C)", r"\text{(C)}", True), ("(B)", r"\text{(C)}", False),
    # An option letter with its value (AMC): letter against letter gold, value against value (math-verify: 6 False).
    (r"\textbf{(B)}\ 7", "B", True), (r"\textbf{(B)}\ 7", r"\text{(B)}", True), (r"\textbf{(B)}\ 7", "7", True),
    ("(C) 12", "12", True), (r"\text{(D) }5", "D", True), (r"(E)\ \text{ellipse}", r"\text{ellipse}", True),
    (r"\textbf{(B)}\ 7", "C", False), (r"\textbf{(B)}\ 7", "8", False),
    # Thin spaces in digit groups; the degree sign; AMC23's float golds, verl's boxed ones, OlympiadBench's lists.
    (r"10\,080", r"10,\!080", True), (r"11\,111\,111\,100", r"11,\! 111,\! 111,\! 100", True),
    (r"10\,081", r"10,\!080", False), (r"1\,2", "12", False), ("90°", r"90^\circ", True),
    ("45°", r"$45^{\circ}$", True), ("44°", r"$45^{\circ}$", False), ("27", 27.0, True),
    (r"\textbf{(C)}\ 27", 27.0, True), ("204", r"\boxed{204}", True), ("2, 1", ["$1$", "$2$"], True),
    ("1", ["$1$", "$2$"], False), ("1, 2, 3", ["$1$", "$2$"], False),
])  # fmt: skip
def test_kept_rules_give_hand_computed_verdicts(answer, gold, expected):
    result = grade(rf"The answer is $\boxed{{{answer}}}$.", gold)
    assert (result.correct, result.error, is_correct(rf"\boxed{{{answer}}}", gold)) == (expected, None, expected)


# Each would run for minutes if evaluated; each is refused before evaluation (the last: a pathological gold).
PATHOLOGICAL = [(r"\boxed{10^{10^{10}}}", "1"), (r"\boxed{2003^{2002^{2001}}}", "5"),
                (r"\boxed{(10^{7})!}", r"\frac{1}{2}"), (r"\boxed{\binom{10^{9}}{10^{5}}}", "3"),
                (r"\boxed{9^{9^{9^{9}}}}", "x+1"), (r"\boxed{e^{e^{e^{e^{e}}}}}", "1"),
                (r"\boxed{\Gamma(10^{8})}", "2"), (r"\boxed{(x+1)^{10^{5}}}", r"(x+2)^{100000}"),
                (r"\boxed{1}", r"10^{10^{10}}")]  # fmt: skip

SCRIPT = """import threading
from concurrent.futures import ThreadPoolExecutor
from stapo_trl.grading import grade
def verdicts(where, mapped=map):
    return [f"{where} {r.correct} {r.error.split(':')[0]} {'refused' in r.error}" for r in mapped(grade, *zip(*CASES))]
lines = verdicts("main")
(thread := threading.Thread(target=lambda: lines.extend(verdicts("thread")))).start()
thread.join()
with ThreadPoolExecutor(4) as pool:
    print("\\n".join(lines + verdicts("pool", pool.map)))
"""


@pytest.mark.slow  # a child process (a regression fails on its timeout instead of hanging the suite)
def test_pathological_answers_are_refused_on_the_main_thread_and_off_it():
    script = f"CASES = {PATHOLOGICAL!r}\n{SCRIPT}"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    lines = out.stdout.split("\n")[:-1]
    assert lines == [f"{where} False timeout True" for where in ("main", "thread", "pool") for _ in PATHOLOGICAL]


@pytest.mark.parametrize("on_main", [True, False], ids=["main-thread", "off-main-thread"])
def test_a_slow_comparison_is_stopped_on_the_main_thread_and_given_up_off_it(monkeypatch, on_main):
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def hang(*args, **kwargs):  # busy (an alarm can interrupt it) until released, or 120 s as a guard
        started.set()
        any(release.is_set() for _ in range(120_000_000))
        return finished.set() or True

    monkeypatch.setattr(math_verify.grader, "sympy_expr_eq", hang)
    monkeypatch.setattr(grading, "TIMEOUT_S", 1)
    out = []
    thread = threading.Thread(target=lambda: out.append(grade(r"\boxed{x+1}", "1+x")))
    thread.run() if on_main else (thread.start(), thread.join())
    assert started.is_set() and not finished.is_set()  # the call returned while the comparison still ran (off-main)
    release.set()
    assert on_main or finished.wait(120)  # on the main thread the alarm ended it: it never finishes
    error = "timeout: TimeoutException" if on_main else "timeout: TimeoutError: over 1 s, off the main thread"
    assert not out[0].correct and out[0].error.startswith(error), out


PREVIOUS = "ff523c7"  # the last commit with the previous grader, stapo_trl/grading/ (eight modules)


@pytest.fixture(scope="module")
def previous_grader(tmp_path_factory):
    archive = subprocess.run(["git", "-C", str(REPO), "archive", PREVIOUS, "stapo_trl/grading"], capture_output=True)
    if archive.returncode != 0:
        pytest.skip(f"the previous grader is not in this checkout's history ({PREVIOUS})")
    tarfile.open(fileobj=io.BytesIO(archive.stdout)).extractall(folder := tmp_path_factory.mktemp("previous"))
    (folder / "stapo_trl" / "grading").rename(folder / "_previous_grading")
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module("_previous_grading")
    finally:
        sys.path.remove(str(folder))


@pytest.fixture(scope="module")
def golds(shared_data_dir) -> dict[str, list]:
    golds: dict[str, dict] = {}
    for path in sorted(p for p in shared_data_dir.glob("*/*") if p.suffix in (".json", ".jsonl", ".parquet")):
        for problem in normalize_records(read_rows(path)):
            golds.setdefault(path.parent.name, {}).setdefault(repr(problem.gold), problem.gold)
    return {name: list(by_repr.values()) for name, by_repr in golds.items()}


_text = lambda gold: gold if isinstance(gold, str) else ", ".join(gold)  # noqa: E731
_NUMBER = re.compile(r"[+-]?\d+(\.\d+)?")
_DECIMAL = re.compile(r"[+-]?(\d*\.\d+|\d+)([eE][+-]?\d+)?")
_FRACTION = re.compile(r"\\d?frac\{(\d+)\}\{(\d+)\}|(\d+)/(\d+)")
_LETTER = re.compile(r"\\text\{\(([A-E])\)\}")


def answers(golds: list) -> list[tuple[object, str]]:
    out = []
    for i, gold in enumerate(golds):
        text, bare = _text(gold), _text(gold).strip("$")
        forms = [text, f"{text}."] + [f"${text}$"] * (not text.startswith("$"))  # itself; with a period; in $...$
        if _NUMBER.fullmatch(text):
            forms += [rf"\text{{{text}}}", str(int(text) + 1 if "." not in text else float(text) + 1)]  # wrong
        if (m := _FRACTION.fullmatch(bare)) is not None:
            num, den = (int(x) for x in m.groups() if x)
            forms.append(f"{num / den:.10g}")
        if _DECIMAL.fullmatch(bare) and ("." in text or "e" in text.lower()):  # written out; wrong by 10 %
            forms.append(np.format_float_positional(float(bare), trim="-"))
            forms.append(np.format_float_positional(float(bare) * 1.1, trim="-", precision=6, fractional=False))
        if isinstance(gold, list) and len(gold) > 1:
            forms.append(", ".join(reversed(gold)))
        if (m := _LETTER.fullmatch(text)) is not None:
            forms += [m[1], f"({m[1]})", rf"\textbf{{({m[1]})}}"]
        if _text(other := golds[(i + 7) % len(golds)]) != text:
            forms.append(_text(other))  # another problem's gold: wrong
        out += [(gold, form) for form in forms]
    return out


def verdicts(grader, golds: dict[str, list]) -> dict[tuple, bool]:
    return {(name, _text(gold), answer): grader.grade(rf"The answer is $\boxed{{{answer}}}$.", gold).correct
            for name, benchmark in golds.items() for gold, answer in answers(benchmark)}  # fmt: skip


def documented() -> set[tuple]:
    doc = (REPO / "docs" / "evaluation.md").read_text()
    table = [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in doc.splitlines()]
    return {(c[0], c[1].strip("`"), c[2].strip("`"), int(c[3]), int(c[4])) for c in table
            if len(c) == 6 and c[1].startswith("`") and c[3] in ("0", "1")}  # fmt: skip


@pytest.mark.slow  # grades 9,726 answers to ~1,850 golds with both graders
def test_every_gold_grades_as_before_and_every_other_disagreement_is_a_row_of_the_docs_table(golds, previous_grader):
    assert set(golds) == {"aime24", "aime25", "amc23", "dapo_math_17k", "gsm8k", "math500", "minerva", "mixed",
                          "olympiadbench"}  # fmt: skip
    now, before = verdicts(grading, golds), verdicts(previous_grader, golds)
    own = {key: correct for key, correct in now.items() if key[1] == key[2]}  # each gold as its own answer
    assert len(own) == sum(map(len, golds.values())) > 1800
    wrong = {key[:2] for key, correct in own.items() if not correct}
    assert wrong == {("minerva", "E_{1},E_{2}"), ("olympiadbench", "$t(0,4]$")}  # math-verify parses neither
    found = {(*key, int(before[key]), int(now[key])) for key in now if before[key] != now[key]}
    assert not {row for row in found if row[1] == row[2]}
    assert found == {row for row in documented() if row[0] != "hand"}


def test_the_hand_rows_of_the_docs_table_are_the_verdicts_of_both_graders(previous_grader):
    rows = [row for row in documented() if row[0] == "hand"]
    assert len(rows) >= 5
    for _, gold, answer, before, now in rows:
        completion = answer if "\\boxed" in answer else rf"\boxed{{{answer}}}"
        assert (previous_grader.grade(completion, gold).correct, grade(completion, gold).correct) == (before, now)
