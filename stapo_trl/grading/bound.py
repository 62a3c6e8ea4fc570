"""The in-process time bound of one grade call: the `GRADE_TIMEOUT_S` deadline, a `signal.setitimer` alarm on the
main thread, an abandoned daemon thread elsewhere; the two exceptions that mean "out of time" and the error text of
any failure. Standard library only. The worker processes (the third layer) are in `workers.py`.

Other modules read the bound as `bound.GRADE_TIMEOUT_S` (never a copy): `configure_grader` rebinds it.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any


# Wall-clock bound of one `grade` / `is_correct` call, on any thread (seconds); see "Time bound" in the package docs.
GRADE_TIMEOUT_S = 2.0


class _GraderTimeout(BaseException):
    """The grade call ran out of time. A BaseException, so that math-verify's `except Exception` cannot swallow it."""


class _Refused(Exception):
    """A pathological form refused before evaluation (counted as a timeout)."""


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise _GraderTimeout(f"timeout: over the {GRADE_TIMEOUT_S} s bound")
    return left


def _raise_timeout(signum, frame):  # SIGALRM handler on the main thread
    raise _GraderTimeout(f"timeout: over the {GRADE_TIMEOUT_S} s bound (main thread)")


def _run_bounded(fn, *args, deadline: float):
    """Run `fn(*args)` so that control comes back by `deadline` (a `time.monotonic()` value).

    Main thread (and no other interval timer armed): a `signal.setitimer` alarm interrupts `fn` between bytecodes.
    Other threads: `fn` runs in a daemon thread that is abandoned at the deadline. Neither can interrupt one long C
    call (a big-integer power holds the GIL): such forms are refused beforehand ([`_check_size`]), and the worker
    processes ([`configure_grader`]) bound everything.
    """
    left = _remaining(deadline)
    if _on_main_thread() and signal.getitimer(signal.ITIMER_REAL)[0] == 0:
        previous = signal.signal(signal.SIGALRM, _raise_timeout)
        try:
            signal.setitimer(signal.ITIMER_REAL, left)
            try:
                return fn(*args)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        finally:
            signal.signal(signal.SIGALRM, previous)
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread below
            box["error"] = e

    worker = threading.Thread(target=target, daemon=True, name="stapo-grader")
    worker.start()
    worker.join(left)
    if worker.is_alive():
        raise _GraderTimeout(f"timeout: over the {GRADE_TIMEOUT_S} s bound (off the main thread)")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _error_text(e: BaseException) -> str:
    if isinstance(e, _GraderTimeout):
        return str(e)
    if isinstance(e, _Refused):
        return f"timeout: refused before evaluation: {e}"
    kind = "timeout" if "timeout" in type(e).__name__.lower() or "timed out" in str(e).lower() else "error"
    return f"{kind}: {type(e).__name__}: {str(e)[:200]}"
