"""torch's CPU thread count for a run: the caller's when they chose one, else the measured best for the built-in tiny
models (1 thread), restored when the run ends.

torch starts one intra-op thread per available core. The built-in tiny models (`builtin:tiny-math`, `tiny-random`,
`tiny-math-h64`: 144k parameters) gain nothing from a second thread, and on shared cores two threads thrash: the
`examples/python_api.py` run took 96 s of training at torch's default on 2 loaded cores and 3.1 s with one thread
(`benchmarks/results/2026-12-02-threads.md`). The product trainers' `train()`
therefore runs such a model, and one trained from it (a run's folder, a checkpoint: the same 0.58 MB of weights), on
[`TINY_MODEL_THREADS`] threads unless the caller chose a count ([`threads_set_by_user`]); every larger model keeps
torch's default.
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterator

import torch


# The fastest count for the built-in tiny models, on 1 and 2 cores, idle and loaded (benchmarks/results/2026-12-02-threads.md).
TINY_MODEL_THREADS = 1
TINY_MODEL_MAX_BYTES = 4 * 2**20  # weights up to 1M float32 parameters; the built-in tiny models' are 0.58 MB
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _threads_per_core() -> int:
    """Hardware threads per physical core (2 with hyper-threading), from sysfs; 1 when it cannot be read."""
    try:
        with open("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list") as f:
            ranges = [part.partition("-") for part in f.read().strip().split(",")]  # "0-1" or "0,16"
    except OSError:
        return 1
    return max(sum(int(high) - int(low) + 1 if high else 1 for low, _, high in ranges), 1)


def torch_default_threads() -> set[int]:
    """The counts torch starts with when nobody sets one: one per available core, logical or physical (torch picks the
    physical count where hyper-threading doubles them)."""
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    counts = {available, os.cpu_count() or available}
    return counts | {max(n // _threads_per_core(), 1) for n in counts}


def threads_set_by_user() -> bool:
    """Whether the caller chose the thread count: `OMP_NUM_THREADS` or `MKL_NUM_THREADS` in the environment, or a
    `torch.set_num_threads` to a count that is not torch's default. (A count set to exactly the default cannot be told
    apart from it, and counts as not set.)"""
    return (
        any(os.environ.get(name) for name in THREAD_ENV_VARS) or torch.get_num_threads() not in torch_default_threads()
    )


def is_tiny_model(model) -> bool:
    """Whether `model` (a model, or its folder) comes from a folder whose `model*.safetensors` take at most
    [`TINY_MODEL_MAX_BYTES`]: a built-in tiny model, or one trained from it (a Hub id, no folder: `False`)."""
    config = getattr(model, "config", None)
    path = model if isinstance(model, (str, os.PathLike)) else getattr(config, "_name_or_path", None)
    weights = glob.glob(os.path.join(glob.escape(str(path)), "model*.safetensors")) if path else []
    return bool(weights) and sum(os.path.getsize(file) for file in weights) <= TINY_MODEL_MAX_BYTES


def default_num_threads(model) -> int | None:
    """The thread count a run of `model` uses when the caller set none: [`TINY_MODEL_THREADS`] for a tiny model
    ([`is_tiny_model`]), else `None` (torch's default). `None` too when the caller set one ([`threads_set_by_user`])."""
    if threads_set_by_user() or not is_tiny_model(model):
        return None
    return TINY_MODEL_THREADS


@contextlib.contextmanager
def torch_threads(num_threads: int | None) -> Iterator[None]:
    """Run the block with `torch.set_num_threads(num_threads)` and `OMP_NUM_THREADS` set (a `builtin:` model is
    built in a child process), restoring both after, for in-process callers; `None` changes nothing."""
    if num_threads is None:
        yield
        return
    previous = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(num_threads)
    os.environ["OMP_NUM_THREADS"] = str(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous[0])
        if previous[1] is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = previous[1]
