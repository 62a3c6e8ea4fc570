"""The time bound of one grading (`stapo_trl.grading.bound`): on the main thread a slow comparison is interrupted,
off it (threads, pools, asyncio) a hung one is abandoned; pathological answers are timeouts within the bound."""

import threading

import pytest
from testing_utils import timed_grades

from stapo_trl import grading
from stapo_trl.grading import GRADER_STATS, grade


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


class Hang:
    """A comparison that runs until released (busy, so a main-thread alarm can interrupt it), recording whether it
    started and whether it ever finished; released by the test, or after 60 s as a guard against a hung test."""

    def __init__(self):
        self.started, self.release, self.finished = threading.Event(), threading.Event(), threading.Event()

    def __call__(self, *args, **kwargs):
        import time

        self.started.set()
        guard = time.monotonic() + 60
        while not self.release.is_set() and time.monotonic() < guard:
            pass
        self.finished.set()
        return True


def test_off_main_thread_a_hung_comparison_is_abandoned(monkeypatch):
    # Off the main thread a hung comparison is abandoned at the bound and counted as a timeout: the grade returns while
    # the comparison is still running (it is released only afterwards).
    assert grade(r"\boxed{x+1}", "1+x").correct  # parses (and caches) the gold with the normal time bound
    hang = Hang()
    monkeypatch.setattr(grading.verify, "_verify", hang)
    monkeypatch.setattr(grading.bound, "GRADE_TIMEOUT_S", 0.5)
    out = []
    thread = threading.Thread(target=lambda: out.append(grade(r"\boxed{x+1}", "1+x")))
    thread.start()
    thread.join(120)
    assert hang.started.is_set() and not hang.finished.is_set()
    hang.release.set()
    assert len(out) == 1 and not out[0].correct and out[0].error.startswith("timeout: over the 0.5 s bound")


PATHOLOGICAL = [
    (r"\boxed{10^{10^{10}}}", "1"),  # the reported cases: huge powers, factorials and binomials
    (r"\boxed{2003^{2002^{2001}}}", "5"),
    (r"\boxed{(10^{7})!}", r"\frac{1}{2}"),
    (r"\boxed{\binom{10^{9}}{10^{5}}}", "3"),
    (r"\boxed{9^{9^{9^{9}}}}", "x+1"),
    (r"\boxed{1}", r"10^{10^{10}}"),  # a pathological gold
]


def _assert_timeouts(timed):
    # Each is refused before evaluation (a size check, before any long C call that no alarm can interrupt) or stopped
    # by the bound; either way a timeout, never a grade.
    for _, result in timed:
        assert not result.correct, result
        assert result.error.startswith(("timeout: refused before evaluation", "timeout: over the")), result


@pytest.mark.parametrize("context", ["main", "thread", "pool8", "async"])
def test_pathological_answers_are_bounded_timeouts(context):
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    grade(r"\boxed{1/2}", "0.5")  # one-time import outside the timing
    GRADER_STATS.clear()
    if context == "main":
        timed = timed_grades(PATHOLOGICAL)
    elif context == "thread":
        timed = []
        thread = threading.Thread(target=lambda: timed.extend(timed_grades(PATHOLOGICAL)), daemon=True)
        thread.start()
        thread.join(60)
        assert not thread.is_alive()
    elif context == "pool8":
        with ThreadPoolExecutor(8) as pool:
            timed = [t for chunk in pool.map(lambda c: timed_grades([c]), PATHOLOGICAL * 2) for t in chunk]
    else:

        async def reward():
            return timed_grades(PATHOLOGICAL)

        timed = asyncio.run(reward())
    _assert_timeouts(timed)
    assert GRADER_STATS["timeouts"] == len(timed)


def test_main_thread_slow_comparison_is_interrupted(monkeypatch):
    # On the main thread a slow pure-Python comparison is interrupted at the bound (setitimer), not abandoned: the grade
    # returns with the comparison started and never finished, though nothing released it.
    grade(r"\boxed{x+1}", "1+x")  # parses and caches the gold
    hang = Hang()
    monkeypatch.setattr(grading.verify, "_verify", hang)
    monkeypatch.setattr(grading.bound, "GRADE_TIMEOUT_S", 0.3)
    result = grade(r"\boxed{x+1}", "1+x")
    assert hang.started.is_set() and not hang.finished.is_set() and not hang.release.is_set()
    assert result.error.startswith("timeout: over the 0.3 s bound (main thread)"), result
