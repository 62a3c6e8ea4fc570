#!/usr/bin/env python
"""Wall time of the run as users start it: `stapo-train` on the demo recipe against its `s2t_mode: off` twin.

    .venv/bin/python benchmarks/demo_wall.py                  # 16 interleaved pairs of 120 steps, ~10 min idle
    .venv/bin/python benchmarks/demo_wall.py --pairs 8 --steps 60

Each run is `stapo-train --config recipes/demo/stapo.yaml` with its defaults (diagnostics, `metrics.jsonl` and the
spurious-token records on), shortened to `--steps` optimizer updates and without the before/after evaluation; the
twin adds `--s2t_mode off` (the like-for-like baseline: same trainer, normaliser, logging; nothing silenced). Both run
in this process through the same `train()` that `stapo-train` calls, each with a fresh trainer and output folder,
alternating which arm goes first. The measure is the wall time of `trainer.train()` (what `train()` reports as
`seconds.train`); the ratio of each pair is STAPO / off, and the table gives the median ratio with a distribution-free
95 % confidence interval (order statistics of the binomial(n, 1/2)). Writes `benchmarks/results/<date>-demo-wall.md`.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import tempfile
from pathlib import Path


os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
DEMO_RECIPE = str(REPO / "recipes" / "demo" / "stapo.yaml")
TARGET = 1.03


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """The median of `values` and a distribution-free confidence interval for it.

    The interval is [x_(k), x_(n+1-k)] of the sorted values, with the largest k such that
    P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2 (the sign-test interval; no normality assumed).

    Returns:
        `tuple[float, float, float]`: (median, low, high); low/high are the extremes when n is too small.
    """
    xs = sorted(values)
    n = len(xs)
    alpha = (1 - confidence) / 2
    k, cdf = 0, 0.0
    while k < n:
        p = math.comb(n, k) / 2**n
        if cdf + p > alpha:
            break
        cdf += p
        k += 1
    low, high = (xs[k - 1], xs[n - k]) if k >= 1 else (xs[0], xs[-1])
    return statistics.median(xs), low, high


def run_once(steps: int, seed: int, off: bool, workdir: str) -> float:
    """One `stapo-train` run of the demo recipe; returns the wall seconds of `trainer.train()`."""
    from stapo_trl.cli.args import parse_args
    from stapo_trl.cli.run import train

    argv = ["--config", DEMO_RECIPE, "--max_steps", str(steps), "--seed", str(seed), "--eval_before_after", "false"]
    argv += ["--output_dir", tempfile.mkdtemp(dir=workdir), "--save_strategy", "no", "--disable_tqdm", "true"]
    if off:
        argv += ["--s2t_mode", "off"]
    result = train(*parse_args(argv), end_training=False)
    return result["seconds"]["train"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="demo-wall-")
    run_once(8, 0, False, workdir)  # warm-up: lazy imports, the model cache, first kernels
    pairs = []
    for i in range(args.pairs):
        order = (False, True) if i % 2 == 0 else (True, False)
        times = {off: run_once(args.steps, i, off, workdir) for off in order}
        pairs.append((times[False], times[True]))
        print(f"pair {i}: stapo {times[False]:.1f} s, off {times[True]:.1f} s, ratio {times[False] / times[True]:.3f}")
    ratios = [stapo / off for stapo, off in pairs]
    median, low, high = median_interval(ratios)
    text = (
        f"# `stapo-train` demo wall time, STAPO vs its `s2t_mode: off` twin ({datetime.date.today()})\n\n"
        f"`benchmarks/demo_wall.py --pairs {args.pairs} --steps {args.steps}`: `recipes/demo/stapo.yaml` with its "
        f"defaults (diagnostics and spurious-token records on), {args.steps} optimizer updates, no before/after "
        "evaluation, wall time of `trainer.train()`; pairs interleaved, alternating order, seed = pair index.\n\n"
        "| pairs | STAPO median (s) | off median (s) | ratio median | 95 % CI of the median ratio | range | target |\n"
        "|---|---|---|---|---|---|---|\n"
        f"| {len(pairs)} | {statistics.median(p[0] for p in pairs):.1f} | {statistics.median(p[1] for p in pairs):.1f} "
        f"| {median:.3f} | {low:.3f}-{high:.3f} | {min(ratios):.3f}-{max(ratios):.3f} | <= {TARGET} |\n"
    )
    from harness import write_result  # torch: after the environment variables above

    write_result(text, "demo-wall", args.out)


if __name__ == "__main__":
    main()
