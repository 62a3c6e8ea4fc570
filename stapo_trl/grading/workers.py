"""Optional worker processes: parsing and verification in child interpreters that can be killed at the bound.

[`configure_grader`] sets the bound and the number of workers (`STAPO_GRADER_PROCESSES` at import).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import select
import subprocess
import sys
import threading
import time

from . import bound
from .bound import _error_text, _GraderTimeout, _remaining
from .verify import _sympy_compare


# The worker loads this package (`stapo_trl/grading/`) alone, under the top-level name `_stapo_grading_worker`: its
# modules import only the standard library and math-verify, and no `stapo_trl.` module, so the worker never imports
# torch through `stapo_trl/__init__`. A fresh interpreter (subprocess, not fork): safe next to torch's threads and
# CUDA.
_WORKER_PACKAGE = "_stapo_grading_worker"
_PACKAGE_INIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__init__.py")
_WORKER_BOOT = (
    "import importlib, importlib.util, sys; "
    "spec = importlib.util.spec_from_file_location(sys.argv[2], sys.argv[1]); "
    "m = importlib.util.module_from_spec(spec); sys.modules[spec.name] = m; spec.loader.exec_module(m); "
    "importlib.import_module(spec.name + '.workers')._worker_main()"
)


def _worker_main() -> None:  # pragma: no cover - runs in the worker process
    # Answers go to a private copy of the pipe; fd 1 itself is pointed at stderr (devnull), so that a stray print
    # in SymPy or latex2sympy cannot corrupt the protocol.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    logging.disable(logging.WARNING)
    _sympy_compare("1/2", "0.5")  # import and warm up SymPy, latex2sympy and math-verify before "ready"
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        request_id, pred, gold = json.loads(line)
        try:
            answer = [request_id, bool(_sympy_compare(pred, gold)), None]
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            answer = [request_id, False, _error_text(e)]
        out.write(json.dumps(answer) + "\n")
        out.flush()


class _WorkerPool:
    """`size` persistent grader processes; one that overruns the deadline is killed and replaced in the background."""

    def __init__(self, size: int):
        self.size = size
        self._idle: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._procs: set = set()
        self._closed = False
        self.started = 0  # worker processes started so far (replacements included)
        self.killed = 0  # workers killed for overrunning the bound
        self._next_id = 0
        for _ in range(size):
            self._spawn_async()

    def _spawn_async(self) -> None:
        threading.Thread(target=self._spawn, daemon=True, name="stapo-grader-spawn").start()

    def _spawn(self) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_BOOT, _PACKAGE_INIT, _WORKER_PACKAGE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        with self._lock:
            self.started += 1
            if self._closed:
                proc.kill()
                return
            self._procs.add(proc)
        if proc.stdout.readline().strip() == "ready":
            self._idle.put(proc)
        else:
            self._discard(proc)

    def _discard(self, proc) -> None:
        with self._lock:
            self._procs.discard(proc)
            closed = self._closed
        proc.kill()
        threading.Thread(target=proc.wait, daemon=True).start()
        if not closed:
            self._spawn_async()

    def ready(self) -> bool:
        """Whether at least one worker has started (before that, grading runs in-process)."""
        return not self._idle.empty() or any(p.poll() is None for p in list(self._procs))

    def compare(self, pred: str, gold: str, deadline: float) -> bool:
        try:
            proc = self._idle.get(timeout=_remaining(deadline))
        except queue.Empty:
            raise _GraderTimeout(
                f"timeout: no grader worker free within the {bound.GRADE_TIMEOUT_S} s bound"
            ) from None
        with self._lock:
            self._next_id += 1
            request_id = self._next_id
        sent = time.monotonic()
        try:
            proc.stdin.write(json.dumps([request_id, pred, gold]) + "\n")
            proc.stdin.flush()
        except (OSError, ValueError):
            self._discard(proc)
            raise _GraderTimeout("timeout: the grader worker died") from None
        answer = self._read_answer(proc, request_id, deadline)
        if answer is None:
            # The caller's bound is over (it may have waited for a free worker). The worker itself gets its full
            # GRADE_TIMEOUT_S for this comparison: it is killed only if it overruns that, else it rejoins the pool.
            threading.Thread(
                target=self._reap, args=(proc, request_id, sent + bound.GRADE_TIMEOUT_S), daemon=True
            ).start()
            raise _GraderTimeout(f"timeout: over the {bound.GRADE_TIMEOUT_S} s bound (worker process)")
        self._idle.put(proc)
        _, correct, error = answer
        if error:
            raise (_GraderTimeout(error) if error.startswith("timeout") else RuntimeError(error))
        return correct

    @staticmethod
    def _read_answer(proc, request_id: int, deadline: float) -> list | None:
        """The worker's answer to `request_id`, or None when none came by `deadline` (or the worker died)."""
        while True:
            try:
                readable, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
                line = proc.stdout.readline() if readable else ""
                answer = json.loads(line) if line else None
            except (OSError, ValueError):
                return None
            if answer is None or (isinstance(answer, list) and answer and answer[0] == request_id):
                return answer

    def _reap(self, proc, request_id: int, hard_deadline: float) -> None:
        if self._read_answer(proc, request_id, hard_deadline) is None:
            with self._lock:
                self.killed += 1
            self._discard(proc)
        else:
            self._idle.put(proc)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            procs = list(self._procs)
            self._procs.clear()
        for proc in procs:
            proc.kill()
            proc.wait()


_POOL: _WorkerPool | None = None
_POOL_LOCK = threading.Lock()


def configure_grader(processes: int | None = None, timeout_s: float | None = None) -> None:
    """Set the grader's time bound and its worker processes.

    Args:
        processes (`int`, *optional*): number of persistent worker processes that run parsing and verification
            (0 = in-process, the default; also read from the `STAPO_GRADER_PROCESSES` environment variable at
            import). With workers, a comparison that overruns the bound is killed with its process, whatever it is
            doing; in-process, forms that would hold the GIL are refused beforehand and the rest is interrupted
            (main thread) or abandoned (other threads). Each worker costs one Python start-up (~1-2 s, in the
            background; calls made before the first worker is ready run in-process) and ~100 MB of memory.
        timeout_s (`float`, *optional*): the wall-clock bound of one `grade` call, in seconds (default 2.0).

    Raises:
        ValueError: `processes` < 0 or `timeout_s` <= 0.
    """
    global _POOL
    if timeout_s is not None:
        if not timeout_s > 0:
            raise ValueError(f"configure_grader: timeout_s must be > 0 seconds, got {timeout_s!r}")
        bound.GRADE_TIMEOUT_S = float(timeout_s)
    if processes is None:
        return
    if processes < 0:
        raise ValueError(f"configure_grader: processes must be >= 0 (0 = in-process), got {processes!r}")
    with _POOL_LOCK:
        if _POOL is not None:
            _POOL.close()
            _POOL = None
        if processes:
            _POOL = _WorkerPool(processes)


@atexit.register
def _close_pool() -> None:
    if _POOL is not None:
        _POOL.close()


if os.environ.get("STAPO_GRADER_PROCESSES", "").strip() not in ("", "0") and __package__ != _WORKER_PACKAGE:
    configure_grader(processes=int(os.environ["STAPO_GRADER_PROCESSES"]))
