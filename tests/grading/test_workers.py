"""The grader's worker processes (`stapo_trl.grading.workers`): `configure_grader` validates its arguments and moves
the bound; an overrunning worker is killed and replaced; a worker loads the grading package alone (no torch, no other
`stapo_trl` module)."""

import json
import subprocess
import sys

import pytest
from testing_utils import timed_grades

from stapo_trl import grading
from stapo_trl.grading import is_correct, workers


def test_configure_grader_sets_the_bound(monkeypatch):
    monkeypatch.setattr(grading.bound, "GRADE_TIMEOUT_S", grading.bound.GRADE_TIMEOUT_S)  # restored after the test
    grading.configure_grader(timeout_s=1.25)
    assert grading.bound.GRADE_TIMEOUT_S == 1.25
    assert grading.workers._POOL is None


def test_worker_process_imports_no_torch_and_no_other_stapo_module():
    # The worker's own boot line, with `-X importtime` listing every module it imports on stderr.
    request = json.dumps([7, r"\frac{2}{4}", "0.5"]) + "\n" + json.dumps([8, "3", "4"]) + "\n"
    argv = [sys.executable, "-X", "importtime", "-c", workers._WORKER_BOOT, workers._PACKAGE_INIT]
    proc = subprocess.run(
        [*argv, workers._WORKER_PACKAGE], input=request, capture_output=True, text=True, timeout=120, check=True
    )
    assert proc.stdout.splitlines() == ["ready", "[7, true, null]", "[8, false, null]"]
    imported = [
        line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")
    ]
    assert "_stapo_grading_worker.verify" in imported and "sympy" in imported
    assert not [m for m in imported if m.split(".")[0] in ("torch", "stapo_trl", "transformers", "trl")]


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
        timed = timed_grades([(r"\boxed{10^{10^{10}}}", "1")])
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
