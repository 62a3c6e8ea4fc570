"""The grader as a package (`stapo_trl/grading/`): state lives in its defining module, and a torch-free worker.

The behaviour itself is tested in test_grading.py; these tests hold what the split from one file must keep: a limit
or a patched function in its defining module reaches the module that uses it, `configure_grader` moves the bound in
`bound`, and the worker processes load the package alone (no torch, no other `stapo_trl` module).
"""

import json
import subprocess
import sys

from stapo_trl import grading
from stapo_trl.grading import grade, workers


def test_configure_grader_sets_the_bound(monkeypatch):
    monkeypatch.setattr(grading.bound, "GRADE_TIMEOUT_S", grading.bound.GRADE_TIMEOUT_S)  # restored after the test
    grading.configure_grader(timeout_s=1.25)
    assert grading.bound.GRADE_TIMEOUT_S == 1.25
    assert grading.workers._POOL is None


def test_a_limit_in_verify_reaches_api(monkeypatch):
    # MAX_ANSWER_CHARS is defined in verify.py and read by api.py: "123456" (6 characters) is refused at 5.
    assert grade(r"\boxed{123456}", "123456").correct
    monkeypatch.setattr(grading.verify, "MAX_ANSWER_CHARS", 5)
    result = grade(r"\boxed{123456}", "123456")
    assert not result.correct
    assert result.error == "timeout: refused before evaluation: answer longer than 5 characters"


def test_patched_private_function_is_used_and_restored(monkeypatch):
    # `_verify` lives in verify.py; patched there, x+2 "equals" x+1; restored, it does not.
    with monkeypatch.context() as patch:
        patch.setattr(grading.verify, "_verify", lambda gold, pred: True)
        assert grade(r"\boxed{x+2}", "x+1").correct
    assert not grade(r"\boxed{x+2}", "x+1").correct


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
