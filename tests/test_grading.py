"""The grader: the last box, the rules on top of math-verify (hand-computed verdicts), never raising, time bounds."""

import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from stapo_trl import grading
from stapo_trl.grading import extract_boxed_answer, grade, is_correct


def test_the_last_complete_box_is_the_answer_and_verdicts_are_the_same_in_a_thread_pool():
    # the last box of the last text never closes (truncated): no answer
    texts = [r"so \boxed{1} no, \boxed{\frac{1}{3}}.", r"\fbox{ 7 }", r"\boxed{\{1, 2\}}", r"\boxed{}", "no box: 42",
             None, r"\boxed{1} then \boxed{\frac{2}{3}"]  # fmt: skip
    assert list(map(extract_boxed_answer, texts)) == [r"\frac{1}{3}", "7", r"\{1, 2\}", None, None, None, None]
    cases = [(r"\boxed{\frac{1}{3}}", r"$\frac{2}{6}$"), (r"\boxed{\sqrt{2}/2}", r"\frac{\sqrt{2}}{2}"),
             (r"\boxed{3}", "4"), (r"\boxed{0.0000003}", "1e-8"), (r"\boxed{x^2+2x+1}", "(x+1)^2")]  # fmt: skip
    on_main = [grade(*c) for c in cases]
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda c: grade(*c), cases * 4)) == on_main * 4
    assert [r.correct for r in on_main] == [True, True, False, False, True]


@pytest.mark.parametrize("answer, gold, expected", [  # fmt: skip
    # Exact numbers to 40 digits: math-verify alone grades each of the first three True (6 decimal places).
    (r"\frac{1}{2006!}", r"\frac{1}{2004!}", False), (r"2^{-100}", r"2^{-101}", False),
    (r"\frac{\sqrt{2}}{10^{30}}", r"\frac{\sqrt{3}}{10^{30}}", False),
    (r"\frac{1}{2006 \cdot 2005 \cdot 2004!}", r"\frac{1}{2006!}", True),
    (r"\frac{1}{\sqrt{2}}", r"\frac{\sqrt{2}}{2}", True),
    # A decimal within 5e-6 relative: math-verify alone takes 3e-7 for 1e-8 and 0.000003 for 2.7778e-6 (Minerva).
    ("0.0000003", "1e-8", False), ("0.000003", "2.7778e-6", False), ("870000000", "8.7e8", True),
    ("0.333333", r"\frac{1}{3}", True), ("0.3333", r"\frac{1}{3}", False), ("27.0", "27", True),
    # Python notation in Minerva golds, read as LaTeX on both sides.
    (r"4.5 \times 10^{33}", "4.5e33", True), (r"4.6 \times 10^{33}", "4.5e33", False),
    (r"-\frac{1}{3}", "-1./3", True), (r"\arcsin\left(\frac{10}{13}\right)", "np.arcsin(10/13)", True),
    (r"\arccos\left(\frac{10}{13}\right)", "np.arcsin(10/13)", False),
    # \text{} around a decimal; a command as a subscript; a period ending the box.
    (r"\text{1.25}", "1.25", True), (r"m_{\max}=n^{2}-n-1", r"$m_{\max }=n^{2}-n-1$", True),
    (r"m_{\max}=n^{2}-n", r"$m_{\max }=n^{2}-n-1$", False), ("13.", "13", True),
    # Upright e, i and function names (reported golds: math-verify reads the first as nothing, the fourth as 1/2).
    (r"1-\frac{1}{e}", r"1 - \frac{1}{\mathrm{e}}", True),
    (r"1+\frac{1}{\mathrm{e}}", r"1 - \frac{1}{\mathrm{e}}", False), (r"e^{-2}", r"{\rm e}^{-2}", True),
    (r"\frac{1}{2}", r"\operatorname{arcsin}\frac{1}{2}", False),
    (r"\frac{\pi}{6}", r"\operatorname{arcsin}\frac{1}{2}", True),
    (r"\mathrm{sin}\frac{\pi}{6}", r"\frac{1}{2}", True), (r"3-2\mathrm{i}", "3+2i", False),
    (r"3+2\mathrm{i}", "3+2i", True),
    # Plain integers compare as ints; everything else is math-verify's.
    ("025", "25", True), ("-3", "3", False), (r"\frac{2}{6}", r"$\frac{1}{3}$", True),
    (r"x > 3", r"(3, \infty)", True),  # allow_set_relation_comp
    (r"\text{(C)}", r"\text{(C)}", True), ("(C)", r"\text{(C)}", True), ("(B)", r"\text{(C)}", False),
    # An option letter with its value, as AMC solutions end: the letter against a letter gold (MATH-500's
    # `\text{(B)}`), the value against a value gold. math-verify alone grades each of the first six False.
    (r"\textbf{(B)}\ 7", "B", True), (r"\textbf{(B)}\ 7", r"\text{(B)}", True), (r"\textbf{(B)}\ 7", "7", True),
    ("(C) 12", "12", True), (r"\text{(D) }5", "D", True), (r"(E)\ \text{ellipse}", r"\text{ellipse}", True),
    (r"\textbf{(B)}\ 7", "C", False), (r"\textbf{(B)}\ 7", "8", False),
    # A thin space between digit groups (12 + 345 for math-verify) against MATH-500's `10,\!080`-style golds.
    (r"10\,080", r"10,\!080", True), (r"11\,111\,111\,100", r"11,\! 111,\! 111,\! 100", True),
    (r"10\,081", r"10,\!080", False), (r"1\,2", "12", False),
    # The degree sign (nothing for math-verify) against MATH-500's `90^\circ` and OlympiadBench's `$45^{\circ}$`.
    ("90°", r"90^\circ", True), ("45°", r"$45^{\circ}$", True), ("44°", r"$45^{\circ}$", False),
    # Gold layouts: AMC23's floats, verl's boxed ground truths, OlympiadBench's lists (a set, any order).
    ("27", 27.0, True), (r"\textbf{(C)}\ 27", 27.0, True), ("204", r"\boxed{204}", True),
    ("2, 1", ["$1$", "$2$"], True), ("1", ["$1$", "$2$"], False), ("1, 2, 3", ["$1$", "$2$"], False),
])  # fmt: skip
def test_kept_rules_give_hand_computed_verdicts(answer, gold, expected):
    result = grade(rf"The answer is $\boxed{{{answer}}}$.", gold)
    assert (result.correct, result.error, is_correct(rf"\boxed{{{answer}}}", gold)) == (expected, None, expected)


def test_an_unparseable_gold_never_gives_credit_a_long_answer_is_refused_and_long_integers_do_not_raise():
    for gold in [r"\frac{zz", "", None, [], r"E_{1},E_{2}"]:
        for completion in (rf"\boxed{{{gold}}}", r"\boxed{1}", "no box"):
            result = grade(completion, gold)
            assert not result.correct and result.error.startswith("gold unparseable"), result
    result = grade(rf"\boxed{{{'1' * 5000}}}", "1")  # int() refuses over 4300 digits: refused before
    assert not result.correct and result.error.startswith("timeout: refused")
    assert grade(rf"\boxed{{{'1' * 999}}}", "1" * 999).correct


# Each would run for minutes if evaluated; each is refused before evaluation (the last: a pathological gold).
PATHOLOGICAL = [(r"\boxed{10^{10^{10}}}", "1"), (r"\boxed{2003^{2002^{2001}}}", "5"),
                (r"\boxed{(10^{7})!}", r"\frac{1}{2}"), (r"\boxed{\binom{10^{9}}{10^{5}}}", "3"),
                (r"\boxed{9^{9^{9^{9}}}}", "x+1"), (r"\boxed{e^{e^{e^{e^{e}}}}}", "1"),
                (r"\boxed{\Gamma(10^{8})}", "2"), (r"\boxed{(x+1)^{10^{5}}}", r"(x+2)^{100000}"),
                (r"\boxed{1}", r"10^{10^{10}}")]  # fmt: skip


@pytest.mark.slow  # a child process (a regression fails on its timeout instead of hanging the suite)
def test_pathological_answers_are_refused_on_the_main_thread_and_off_it():
    script = textwrap.dedent(
        f"""
        import threading
        from concurrent.futures import ThreadPoolExecutor
        from stapo_trl.grading import grade

        cases = {PATHOLOGICAL!r}
        def verdicts(where, mapped=map):
            results = mapped(lambda c: grade(*c), cases)
            return [f"{{where}} {{r.correct}} {{r.error.split(':')[0]}} {{'refused' in r.error}}" for r in results]
        lines = verdicts("main")
        thread = threading.Thread(target=lambda: lines.extend(verdicts("thread")))
        thread.start()
        thread.join()
        with ThreadPoolExecutor(4) as pool:
            lines += verdicts("pool", pool.map)
        print("\\n".join(lines))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    lines = out.stdout.split("\n")[:-1]
    assert lines == [f"{where} False timeout True" for where in ("main", "thread", "pool") for _ in PATHOLOGICAL]


@pytest.mark.parametrize("on_main", [True, False], ids=["main-thread", "off-main-thread"])
def test_a_slow_comparison_is_stopped_on_the_main_thread_and_given_up_off_it(monkeypatch, on_main):
    import math_verify.grader

    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def hang(*args, **kwargs):  # busy (an alarm can interrupt it) until released, or 120 s as a guard
        started.set()
        for _ in range(120_000_000):
            if release.is_set():
                break
        finished.set()
        return True

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
