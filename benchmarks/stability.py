#!/usr/bin/env python
r"""Does the paper's late-training instability show at laptop scale? A bounded, resumable search (arXiv:2602.15620).

    python benchmarks/stability.py --pilot      # 5 arms x lr 1e-4, 3e-4, 6e-4 x 4 seeds x 2000 updates, in 2 tiers
    python benchmarks/stability.py --confirm    # JustRL vs STAPO, 16 fresh seeds, at the lr the pilot's criteria chose
    python benchmarks/stability.py --report     # only rewrite the report from the finished runs
    python benchmarks/stability.py --pilot --seeds 0 --lrs 1e-4 --updates 8 --eval-every 4 --out outputs/stab-smoke

The paper's title claim: without the S2T mask, clip-higher GRPO (JustRL) drifts into entropy explosion late in
training, plain GRPO into entropy collapse, and silencing every low-probability token (JustRL-FullMask) into collapse;
STAPO keeps entropy level and accuracy from decaying. This script looks for that regime on the CPU demo model.

Model, task and geometry: `builtin:tiny-math` (a 144k-parameter Qwen3 SFT-warmed on two-digit addition) on the
built-in `builtin:tiny-math` dataset, with every trainer setting of `recipes/demo/stapo.yaml` (16 completions per
update, num_generations 8, steps_per_generation 4, max_completion_length 48, T 1.0, dapo, clip 0.2 / 0.28, beta 0,
constant lr, weight decay 0.1, grad clip 1.0), changed only by the arm, the learning rate, the seed and the horizon.
Built with the public API: `STAPOConfig`, `STAPOTrainer`, `stapo_trl.data.load_prompt_dataset`,
`stapo_trl.evaluation.generation.evaluate_avg_at_k`; the run's `metrics.jsonl` is read as plain JSON lines.

Arms (all on `STAPOTrainer`, so they share one trainer and one per-update normaliser):
- `grpo`: `s2t_mode` off, `loss_type` grpo, symmetric clip 0.2 / 0.2 (the paper's GRPO, recipes/Qwen3-1.7B/grpo.yaml);
- `justrl`: `s2t_mode` off (the STAPO objective without the mask);
- `stapo`: `s2t_mode` low_entropy, tau_p 0.002, q 0.75 (the paper's defaults);
- `fullmask`: `s2t_mode` all_low_prob (every low-probability positive-advantage token silenced);
- `entropy20`: `s2t_mode` off, `top_entropy_quantile` 0.2 (recipes/Qwen3-1.7B/entropy20.yaml).

Each run writes `<out>/<phase>/lr<lr>/<arm>/seed<seed>/`: the trainer's `metrics.jsonl` (entropy, reward, `s2t/*`
every 4 updates), `heldout.jsonl` (held-out avg@k every `--eval-every` updates), a checkpoint every `--save-every`
updates while it runs (an interrupted run resumes from it), and at the end `run.json` (curves, summary, timing) and
the done-marker `DONE`. A rerun skips every run with a `DONE`; no run starts once the phase's finished runs used its
CPU budget (`--budget-hours`). The report (`benchmarks/results/<name>.md`, `.json` and PNG figures) is rewritten
after every finished run.

While stapo_trl is being edited in the checkout, run a clean snapshot of a commit (the report names it):

    mkdir -p outputs/stability-src && git archive HEAD | tar -x -C outputs/stability-src
    git rev-parse HEAD > outputs/stability-src/.snapshot-commit
    cp benchmarks/stability.py outputs/stability-src/benchmarks/
    OMP_NUM_THREADS=1 nohup .venv/bin/python outputs/stability-src/benchmarks/stability.py --pilot \
        --out outputs/stability --results-dir benchmarks/results >> outputs/stability/pilot.log 2>&1 &

The criteria are fixed in this file (`CRITERIA`, [`classify_run`], [`select_regime`]) and were fixed before any pilot
run was looked at; the report spells them out.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import script_env  # noqa: I001 (first: the environment and sys.path, also when a test loads this file by path)
from stress_stats import paired_permutation_test, sign_test  # noqa: E402


REPO = script_env.REPO
RESULTS_DIR = REPO / "benchmarks" / "results"
RECIPE = REPO / "recipes" / "demo" / "stapo.yaml"
MODEL = "builtin:tiny-math"
DATASET = "builtin:tiny-math"

ARMS: dict[str, dict[str, Any]] = {
    "grpo": {"s2t_mode": "off", "loss_type": "grpo", "epsilon": 0.2, "epsilon_high": 0.2},
    "justrl": {"s2t_mode": "off"},
    "stapo": {"s2t_mode": "low_entropy", "s2t_prob_threshold": 0.002, "s2t_entropy_quantile": 0.75},
    "fullmask": {"s2t_mode": "all_low_prob"},
    "entropy20": {"s2t_mode": "off", "top_entropy_quantile": 0.2},
}
UNMASKED_ARMS = ("grpo", "justrl", "entropy20")  # no S2T mask: the arms the paper says drift

# Defaults of the two phases, sized from the measured cost (one torch thread, 2 shared cores): a 2000-update run with 9
# held-out evaluations takes ~265 s of CPU (~0.13 s per update, ~3 s per evaluation; ~360 s of wall time when the
# other core is busy), so the 36 runs of tier 1 take ~2.7 of the pilot's ~3 CPU-hours and the 32 runs (16 seeds) of
# the confirm phase ~2.4 of its ~4.
# The pilot runs in priority tiers, seed-major inside a tier (every cell gets seed 0 before any gets seed 1): tier 1
# is the claim's central contrast and GRPO (JustRL, STAPO, GRPO), tier 2 the ablations (FullMask, 20-Entropy); a run
# starts only while the CPU time of the phase's finished runs is under its budget.
PILOT = {
    "seeds": [0, 1, 2, 3],
    "lrs": [1e-4, 3e-4, 6e-4],
    "updates": 2000,
    "tiers": [["justrl", "stapo", "grpo"], ["fullmask", "entropy20"]],
    "budget_hours": 3.0,
}
CONFIRM = {"seeds": list(range(100, 116)), "updates": 2000, "tiers": [["justrl", "stapo"]], "budget_hours": 4.0}
EVAL = {"every": 250, "k": 4, "problems": 300, "max_new_tokens": 48, "seed": 10_000}

# ---------------------------------------------------------------------------------------------------------------
# Criteria, fixed before any pilot run was looked at. Units: entropy in nats (the trainer's mean token entropy of the
# sampled completions, logged every 4 updates); reward and accuracy as fractions in [0, 1]; times in optimizer updates.
# ---------------------------------------------------------------------------------------------------------------
CRITERIA = {
    # The entropy and reward curves are smoothed with a trailing mean over this many updates (25 logged rows).
    "smooth_updates": 100,
    # E0, the start level: the mean logged entropy over the first this many updates (the start policy, before RL
    # has moved it: at lr 1e-4 the entropy halves within 200 updates).
    "baseline_updates": 20,
    # Explosion: the smoothed entropy reaches explosion_factor x E0 after the early window.
    "explosion_factor": 2.0,
    # Rebound (the late upward drift): the smoothed entropy reaches rebound_factor x its own minimum so far, both
    # after the early window.
    "rebound_factor": 2.0,
    # Collapse: the mean entropy over the late window is at most collapse_factor x E0 ...
    "collapse_factor": 0.25,
    # ... and it counts as an instability only when the held-out accuracy did not gain: final - start < min_gain.
    "collapse_min_gain": 0.05,
    # Late window: the last late_fraction of the horizon (entropy level at the end).
    "late_fraction": 0.10,
    # Early window: the first early_fraction of the horizon. A smoothed reward at or below blowup_reward, or an
    # explosion, inside it is an early blow-up (the optimizer instability of a too-large lr on a tiny model), not the
    # slow late drift the paper describes.
    "early_fraction": 0.10,
    "blowup_reward": 0.05,
    # Accuracy drop: the held-out peak (after update 0, reached before peak_before x horizon) minus the final accuracy
    # (mean of the last final_evals evaluations) is at least drop_threshold.
    "drop_threshold": 0.10,
    "final_evals": 2,
    "peak_before": 0.75,
    # A dead run (every logged reward exactly 0 for dead_updates updates: zero advantages, so no policy gradient
    # is left and only weight decay and Adam's decaying momentum move it) is stopped; its late window is then its last
    # smooth_updates updates, its final accuracy an evaluation at the stop.
    "dead_updates": 100,
    # A regime: a learning rate at which at least min_seeds of the pilot's seeds of one unmasked arm are late-unstable
    # (late explosion or rebound, accuracy drop, or collapse without gain) and fewer than min_seeds early blow-ups.
    "min_seeds": 2,
}


# ---------------------------------------------------------------------------------------------------------------
# Criteria and statistics (pure functions: tested in tests/benchmarks/test_stability.py)
# ---------------------------------------------------------------------------------------------------------------


def trailing_mean(steps: list[int], values: list[float], window: int) -> list[float]:
    """The trailing mean of `values` over the rows whose step lies in `(step - window, step]` (`window` in updates);
    `None` and non-finite values are left out of the means (a row with no finite value in its window gives NaN)."""
    out = []
    for i, s in enumerate(steps):
        inside = [v for st, v in zip(steps[: i + 1], values[: i + 1]) if st > s - window and _finite(v)]
        out.append(sum(inside) / len(inside) if inside else math.nan)
    return out


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def classify_run(
    entropy: list[tuple[int, float]],
    accuracy: list[tuple[int, float]],
    horizon: int,
    reward: list[tuple[int, float]] | None = None,
    stopped_at: int | None = None,
    criteria: dict[str, Any] = CRITERIA,
) -> dict[str, Any]:
    """The pre-declared criteria ([`CRITERIA`]) applied to one run's curves.

    Args:
        entropy (`list[tuple[int, float]]`): (update, mean token entropy in nats) as logged, in update order.
        accuracy (`list[tuple[int, float]]`): (update, held-out avg@k in [0, 1]) in update order, the start model at 0.
        horizon (`int`): the run's planned number of optimizer updates.
        reward (`list[tuple[int, float]]`, *optional*): (update, mean reward in [0, 1]) as logged.
        stopped_at (`int`, *optional*): the update at which a dead run was stopped (`None`: it ran to `horizon`).
        criteria (`dict`): [`CRITERIA`].

    Returns:
        `dict`: `e0`, `e_late` (nats), `e_late_ratio` (E_late / E0), `e_max_ratio` / `e_min_ratio` (extremes of the
        smoothed entropy over E0 after the early window), `rebound_ratio` (largest smoothed entropy over its running
        minimum, after the early window), onsets (first update of each crossing, or `None`), flags `explosion`,
        `rebound`, `collapse`, `collapse_no_gain`, `early_blowup`, `accuracy_drop`, `late_unstable`; accuracies
        `acc_start`, `acc_peak`, `acc_peak_step`, `acc_final`, `drop` (peak - final) and `gain` (final - start).
    """
    c = criteria
    steps = [s for s, _ in entropy]
    smooth = trailing_mean(steps, [v for _, v in entropy], c["smooth_updates"])
    early_end = c["early_fraction"] * horizon
    end = horizon if stopped_at is None else stopped_at
    late_start = end - (c["late_fraction"] * horizon if stopped_at is None else c["smooth_updates"])
    base = [v for s, v in entropy if s <= c["baseline_updates"] and _finite(v)]
    e0 = sum(base) / len(base) if base else math.nan
    ok = _finite(e0) and e0 > 0
    late = [v for s, v in entropy if s > late_start and _finite(v)]
    e_late = sum(late) / len(late) if late else math.nan
    after_early = [(s, v) for s, v in zip(steps, smooth) if s > early_end and _finite(v)]
    explosion_onset = next(
        (s for s, v in zip(steps, smooth) if ok and _finite(v) and v >= c["explosion_factor"] * e0), None
    )
    collapse_onset = next(
        (s for s, v in zip(steps, smooth) if ok and _finite(v) and v <= c["collapse_factor"] * e0), None
    )
    rebound_ratio, rebound_onset, running_min = math.nan, None, math.inf
    for s, v in after_early:
        running_min = min(running_min, v)
        if running_min > 0:
            ratio = v / running_min
            rebound_ratio = ratio if not _finite(rebound_ratio) else max(rebound_ratio, ratio)
            if rebound_onset is None and ratio >= c["rebound_factor"]:
                rebound_onset = s
    out: dict[str, Any] = {
        "e0": e0,
        "e_late": e_late,
        "e_late_ratio": e_late / e0 if ok and _finite(e_late) else math.nan,
        "e_max_ratio": max(v for _, v in after_early) / e0 if ok and after_early else math.nan,
        "e_min_ratio": min(v for _, v in after_early) / e0 if ok and after_early else math.nan,
        "rebound_ratio": rebound_ratio,
        "explosion_onset": explosion_onset,
        "collapse_onset": collapse_onset,
        "rebound_onset": rebound_onset,
        "stopped_at": stopped_at,
    }
    out["explosion"] = explosion_onset is not None and explosion_onset > early_end
    out["rebound"] = rebound_onset is not None
    out["collapse"] = ok and _finite(e_late) and e_late <= c["collapse_factor"] * e0
    reward = reward or []
    smooth_reward = trailing_mean([s for s, _ in reward], [r for _, r in reward], c["smooth_updates"])
    blowup_onset = next(
        (s for (s, _), r in zip(reward, smooth_reward) if _finite(r) and r <= c["blowup_reward"]), None
    )
    out["blowup_onset"] = blowup_onset
    out["early_blowup"] = (blowup_onset is not None and blowup_onset <= early_end) or (
        explosion_onset is not None and explosion_onset <= early_end
    )

    acc = [(s, a) for s, a in accuracy if _finite(a)]
    start = [a for s, a in acc if s == 0]
    later = [(s, a) for s, a in acc if s > 0]
    out["acc_start"] = start[0] if start else math.nan
    if later:
        peak_step, peak = max(later, key=lambda sa: (sa[1], -sa[0]))  # the earliest of equal peaks
        final = [a for _, a in later[-c["final_evals"] :]]
        out["acc_peak"], out["acc_peak_step"] = peak, peak_step
        out["acc_final"] = sum(final) / len(final)
    else:
        out["acc_peak"], out["acc_peak_step"], out["acc_final"] = math.nan, None, math.nan
    out["drop"] = out["acc_peak"] - out["acc_final"]
    out["gain"] = out["acc_final"] - out["acc_start"]
    out["accuracy_drop"] = bool(
        _finite(out["drop"])
        and out["drop"] >= c["drop_threshold"] - 1e-12
        and out["acc_peak_step"] < c["peak_before"] * horizon
    )
    out["collapse_no_gain"] = out["collapse"] and not (_finite(out["gain"]) and out["gain"] >= c["collapse_min_gain"])
    out["late_unstable"] = out["explosion"] or out["rebound"] or out["accuracy_drop"] or out["collapse_no_gain"]
    return out


def select_regime(
    summaries: list[dict[str, Any]], criteria: dict[str, Any] = CRITERIA, arms: tuple[str, ...] = UNMASKED_ARMS
) -> dict[str, Any] | None:
    """The regime [`CRITERIA`] asks for, from the pilot's finished runs: the lowest learning rate at which an
    unmasked arm (JustRL first, then GRPO, then 20-Entropy) has at least `min_seeds` late-unstable seeds and fewer
    than `min_seeds` early blow-ups; `None` when no cell qualifies.

    Args:
        summaries (`list[dict]`): one per run, with `lr`, `arm` and the [`classify_run`] flags.

    Returns:
        `dict` or `None`: `lr`, `arm`, `late_unstable` and `early_blowup` (seed counts), `seeds` (runs in the cell).
    """
    order = ["justrl"] + [a for a in arms if a != "justrl"]
    for lr in sorted({s["lr"] for s in summaries}):
        for arm in order:
            cell = [s for s in summaries if s["lr"] == lr and s["arm"] == arm]
            unstable = sum(bool(s["late_unstable"]) for s in cell)
            early = sum(bool(s["early_blowup"]) for s in cell)
            if unstable >= criteria["min_seeds"] and early < criteria["min_seeds"]:
                return {"lr": lr, "arm": arm, "late_unstable": unstable, "early_blowup": early, "seeds": len(cell)}
    return None


def wilcoxon_signed_rank(differences: list[float]) -> tuple[float, float]:
    """Exact two-sided Wilcoxon signed-rank test of paired differences (zeros dropped, tied magnitudes mid-ranked).

    The null distribution of W+ (the sum of the ranks of the positive differences) is enumerated exactly by dynamic
    programming over the (doubled, so integer) ranks; the p-value is twice the smaller tail, capped at 1.

    Returns:
        `tuple[float, float]`: (W+, p); (0.0, 1.0) when every difference is zero.
    """
    nonzero = [d for d in differences if d != 0]
    n = len(nonzero)
    if n == 0:
        return 0.0, 1.0
    order = sorted(range(n), key=lambda i: abs(nonzero[i]))
    ranks2 = [0] * n  # twice the mid-rank: an integer
    i = 0
    while i < n:
        j = i
        while j + 1 < n and abs(nonzero[order[j + 1]]) == abs(nonzero[order[i]]):
            j += 1
        for t in range(i, j + 1):
            ranks2[order[t]] = i + j + 2  # (i + 1 + j + 1) = 2 x mid-rank
        i = j + 1
    w2 = sum(r for r, d in zip(ranks2, nonzero) if d > 0)
    total = sum(ranks2)
    counts = [0] * (total + 1)
    counts[0] = 1
    for r in ranks2:
        for s in range(total, r - 1, -1):
            counts[s] += counts[s - r]
    lower = sum(counts[: w2 + 1]) / 2**n
    upper = sum(counts[w2:]) / 2**n
    return w2 / 2, min(1.0, 2 * min(lower, upper))


def paired_comparison(a: dict[int, float], b: dict[int, float]) -> dict[str, Any]:
    """Paired by seed: differences `a[seed] - b[seed]` over the seeds both have (finite values only), their mean,
    median, counts of positive and negative, and the exact sign, Wilcoxon signed-rank and sign-flip permutation
    p-values (two-sided)."""
    seeds = sorted(s for s in a if s in b and _finite(a[s]) and _finite(b[s]))
    diffs = [a[s] - b[s] for s in seeds]
    if not diffs:
        return {"n": 0}
    w, p_w = wilcoxon_signed_rank(diffs)
    return {
        "n": len(diffs),
        "seeds": seeds,
        "differences": diffs,
        "mean": statistics.fmean(diffs),
        "median": statistics.median(diffs),
        "positive": sum(d > 0 for d in diffs),
        "negative": sum(d < 0 for d in diffs),
        "p_sign": sign_test(diffs),
        "wilcoxon_w_plus": w,
        "p_wilcoxon": p_w,
        "p_permutation": paired_permutation_test(diffs),
    }


# ---------------------------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One training run: `phase` (pilot or confirm), `arm` (a key of [`ARMS`]), learning rate `lr`, `seed`, `updates`
    (optimizer updates), held-out evaluation every `eval_every` updates on the first `eval_problems` test problems
    with `eval_k` samples each, a checkpoint every `save_every` updates."""

    phase: str
    arm: str
    lr: float
    seed: int
    updates: int
    eval_every: int
    eval_problems: int
    eval_k: int
    save_every: int

    def folder(self, out: Path) -> Path:
        return out / self.phase / f"lr{self.lr:g}" / self.arm / f"seed{self.seed}"


DONE = "DONE"
HELDOUT = "heldout.jsonl"
RUN_FILE = "run.json"


def is_done(folder: Path) -> bool:
    """Whether the run in `folder` finished (its done-marker and its `run.json` exist)."""
    return (folder / DONE).is_file() and (folder / RUN_FILE).is_file()


def recipe_settings() -> dict[str, Any]:
    """The trainer settings of `recipes/demo/stapo.yaml` (the keys that are `STAPOConfig` fields) and its dtype."""
    import yaml

    from stapo_trl import STAPOConfig

    recipe = yaml.safe_load(RECIPE.read_text())
    fields = {f.name for f in dataclasses.fields(STAPOConfig)}
    settings = {k: v for k, v in recipe.items() if k in fields}
    settings["model_init_kwargs"] = {"dtype": recipe.get("dtype", "float32")}
    return settings


def build_config(spec: RunSpec, folder: Path):
    """The `STAPOConfig` of a run: the demo recipe's trainer settings, then the arm's, then the run's own."""
    from stapo_trl import STAPOConfig

    settings = recipe_settings()
    settings.update(ARMS[spec.arm])
    settings.update(
        output_dir=str(folder),
        seed=spec.seed,
        learning_rate=spec.lr,
        max_steps=spec.updates,
        save_strategy="steps",
        save_steps=spec.save_every,
        save_total_limit=1,
        save_only_model=False,
        report_to="none",
        disable_tqdm=True,
        logging_steps=4,
        run_name=f"{spec.phase}-{spec.arm}-lr{spec.lr:g}-seed{spec.seed}",
    )
    return STAPOConfig(**settings)


_CACHE: dict[str, Any] = {}


def heldout_split(num_problems: int):
    """The first `num_problems` problems of the built-in test split (never seen in SFT or RL): (prompts, solutions)."""
    from stapo_trl.data import load_prompt_dataset

    if "test" not in _CACHE:
        _CACHE["test"] = load_prompt_dataset(DATASET, split="test")
    test = _CACHE["test"]
    rows = test.select(range(min(num_problems, len(test))))
    return list(rows["prompt"]), list(rows["solution"])


def train_split():
    from stapo_trl.data import load_prompt_dataset

    if "train" not in _CACHE:
        _CACHE["train"] = load_prompt_dataset(DATASET, split="train")
    return _CACHE["train"]


def evaluate(model, tokenizer, spec: RunSpec, step: int) -> dict[str, Any]:
    """Held-out avg@k and pass@k of `model` at `step`, sampled at T 1.0 / top-p 1.0, 48 new tokens, with the seed
    `EVAL["seed"] + step` (the same sampling stream for every run at a given step)."""
    from stapo_trl.evaluation.generation import evaluate_avg_at_k

    prompts, solutions = heldout_split(spec.eval_problems)
    t0 = time.perf_counter()
    result = evaluate_avg_at_k(
        model,
        tokenizer,
        prompts,
        solutions,
        k=spec.eval_k,
        temperature=1.0,
        top_p=1.0,
        max_new_tokens=EVAL["max_new_tokens"],
        seed=EVAL["seed"] + step,
    )
    return {
        "step": step,
        "accuracy": result[f"avg@{spec.eval_k}"],
        "pass": result[f"pass@{spec.eval_k}"],
        "seconds": round(time.perf_counter() - t0, 3),
    }


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file; a line cut short by a killed run is skipped."""
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def dead_since(rewards: list[tuple[int, float]], step: int, window: int) -> bool:
    """Whether every logged reward of the updates `(step - window, step]` is exactly 0 and they cover the window
    (a row every 4 updates), i.e. the run has had no policy gradient for `window` updates ([`CRITERIA`] dead run)."""
    inside = [r for s, r in rewards if step - window < s <= step]
    return step >= window and len(inside) >= window // 4 and all(r == 0 for r in inside)


def make_heldout_callback(spec: RunSpec, path: Path, start_cache: Path, history: list[tuple[int, float]]):
    """A `TrainerCallback` that appends a held-out evaluation to `path` every `spec.eval_every` updates and at the
    last one, and stops a dead run ([`dead_since`]; its `stopped_at` attribute is then the update) after one more
    evaluation. When training (re)starts it keeps the rows up to the current step (a resumed run redoes the rest);
    the row of update 0 is the start model's evaluation, the same for every run: made once, from the trainer's model
    before its first update, and cached in `start_cache`. `history`: the (update, reward) rows logged before a
    resume."""
    from transformers import TrainerCallback

    class HeldOutEval(TrainerCallback):
        stopped_at: int | None = None

        def __init__(self):
            self.rewards = list(history)

        def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
            rows = [r for r in read_jsonl(path) if r.get("step", math.inf) <= state.global_step]
            if not any(r.get("step") == 0 for r in rows):
                if not start_cache.is_file():
                    if state.global_step != 0:
                        raise RuntimeError(f"{start_cache} is missing and the run resumes at {state.global_step}")
                    start_cache.write_text(json.dumps(evaluate(model, processing_class, spec, 0)))
                rows.insert(0, json.loads(start_cache.read_text()))
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            self.rewards = [(s, r) for s, r in self.rewards if s <= state.global_step]

        def _evaluate(self, model, tokenizer, step: int) -> None:
            row = evaluate(model, tokenizer, spec, step)
            with open(path, "a") as f:
                f.write(json.dumps(row) + "\n")

        def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
            step = state.global_step
            if step % spec.eval_every == 0 or step == state.max_steps:
                self._evaluate(model, processing_class, step)

        def on_log(self, args, state, control, logs=None, model=None, processing_class=None, **kwargs):
            step = state.global_step
            if logs and _finite(logs.get("reward")):
                self.rewards.append((step, logs["reward"]))
            if step < state.max_steps and dead_since(self.rewards, step, CRITERIA["dead_updates"]):
                if step % spec.eval_every:  # the evaluation at the stop (unless on_step_end just made it)
                    self._evaluate(model, processing_class, step)
                self.stopped_at = step
                control.should_training_stop = True

    return HeldOutEval()


def read_metrics_rows(folder: Path) -> list[dict[str, Any]]:
    """The rows of the trainer's `<folder>/metrics.jsonl` (one JSON object per logging step, with `step`; `null`
    for a value that was not finite), in file order; lines without an integer `step` are skipped."""
    return [r for r in read_jsonl(folder / "metrics.jsonl") if isinstance(r.get("step"), int)]


CURVE_KEYS = ("entropy", "reward", "s2t/silenced_ratio", "s2t/candidate_ratio", "completions/mean_length")


def run_one(spec: RunSpec, out: Path) -> dict[str, Any]:
    """Train one run (resuming from its last checkpoint if it was interrupted) and write its `run.json` and `DONE`;
    a finished run is only read back. Returns its record ([`load_run`])."""
    folder = spec.folder(out)
    if is_done(folder):
        return load_run(folder)
    import torch
    from transformers.trainer_utils import get_last_checkpoint

    from stapo_trl import STAPOTrainer

    torch.set_num_threads(1)
    folder.mkdir(parents=True, exist_ok=True)
    checkpoint = get_last_checkpoint(str(folder))
    args = build_config(spec, folder)
    trainer = STAPOTrainer(model=MODEL, reward_funcs="math_accuracy", args=args, train_dataset=train_split())
    history = [(r["step"], r.get("reward")) for r in read_metrics_rows(folder)] if checkpoint else []
    start_cache = out / f"start-eval-p{spec.eval_problems}-k{spec.eval_k}.json"
    history = [(step, r) for step, r in history if _finite(r)]
    callback = make_heldout_callback(spec, folder / HELDOUT, start_cache, history)
    trainer.add_callback(callback)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    trainer.train(resume_from_checkpoint=checkpoint)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    trainer.end()

    rows = read_metrics_rows(folder)
    heldout = [r for r in read_jsonl(folder / HELDOUT)]
    eval_seconds = sum(
        r.get("seconds", 0.0) for r in heldout if r["step"] > (int(checkpoint.rsplit("-", 1)[1]) if checkpoint else 0)
    )
    curves = {"step": [r["step"] for r in rows if "entropy" in r]}
    for key in CURVE_KEYS:
        curves[key] = [r.get(key) for r in rows if "entropy" in r]
    record = {
        "spec": dataclasses.asdict(spec),
        "resumed_from": checkpoint,
        "stopped_at": callback.stopped_at,
        "curves": curves,
        "heldout": heldout,
        "timing": {
            "wall_s": round(wall, 1),
            "cpu_s": round(cpu, 1),
            "eval_s": round(eval_seconds, 1),
            "updates_timed": (callback.stopped_at or spec.updates)
            - (int(checkpoint.rsplit("-", 1)[1]) if checkpoint else 0),
        },
        "silenced_tokens": _silenced_count(rows),
    }
    (folder / RUN_FILE).write_text(json.dumps(record, allow_nan=True))
    for stale in folder.glob("checkpoint-*"):  # the curves are in run.json; the optimizer state is not needed
        shutil.rmtree(stale, ignore_errors=True)
    (folder / DONE).write_text(datetime.datetime.now().isoformat(timespec="seconds") + "\n")
    return load_run(folder)


def _silenced_count(rows: list[dict[str, Any]]) -> float | None:
    """Silenced tokens over the run, from the logged per-row counts when the trainer logs them."""
    values = [r["s2t/num_silenced"] for r in rows if _finite(r.get("s2t/num_silenced"))]
    return float(sum(values)) if values else None


def load_run(folder: Path) -> dict[str, Any]:
    """A finished run's `run.json` with its [`classify_run`] summary added (`summary`, plus `arm`, `lr`, `seed`)."""
    record = json.loads((folder / RUN_FILE).read_text())
    spec = record["spec"]
    curves = record["curves"]
    entropy = [(s, e) for s, e in zip(curves["step"], curves["entropy"])]
    accuracy = [(r["step"], r["accuracy"]) for r in record["heldout"]]
    rewards = [(s, r) for s, r in zip(curves["step"], curves["reward"]) if _finite(r)]
    stopped = record.get("stopped_at")
    summary = classify_run(entropy, accuracy, spec["updates"], reward=rewards, stopped_at=stopped)
    late_start = stopped - CRITERIA["smooth_updates"] if stopped else (1 - CRITERIA["late_fraction"]) * spec["updates"]
    late = [r for s, r in rewards if s > late_start]
    early = [r for s, r in rewards if s <= CRITERIA["baseline_updates"]]
    summary["reward_early"] = statistics.fmean(early) if early else math.nan
    summary["reward_late"] = statistics.fmean(late) if late else math.nan
    silenced = [x for x in curves["s2t/silenced_ratio"] if _finite(x)]
    candidates = [x for x in curves["s2t/candidate_ratio"] if _finite(x)]
    summary["silenced_ratio_mean"] = statistics.fmean(silenced) if silenced else math.nan
    summary["candidate_ratio_mean"] = statistics.fmean(candidates) if candidates else math.nan
    summary.update(arm=spec["arm"], lr=spec["lr"], seed=spec["seed"], phase=spec["phase"])
    record["summary"] = summary
    return record


def finished_runs(out: Path, phase: str) -> list[dict[str, Any]]:
    """Every finished run of `phase` under `out`, sorted by (lr, arm, seed)."""
    runs = [load_run(p.parent) for p in sorted((out / phase).glob(f"lr*/*/seed*/{DONE}")) if is_done(p.parent)]
    return sorted(runs, key=lambda r: (r["spec"]["lr"], r["spec"]["arm"], r["spec"]["seed"]))


def phase_specs(args) -> list[RunSpec]:
    """The runs of a phase in the order they run: tier by tier, seed-major inside a tier (every cell of the tier gets
    its first seed before any gets its second), then learning rate, then arm."""
    phase = "confirm" if args.confirm else "pilot"
    return [
        RunSpec(phase, arm, lr, seed, args.updates, args.eval_every, args.eval_problems, args.eval_k, args.save_every)
        for tier in args.tiers
        for seed in args.seeds
        for lr in args.lrs
        for arm in tier
    ]


def spent_hours(out: Path, phase: str) -> float:
    """CPU time of the finished runs of `phase` under `out` (training and evaluation, as `time.process_time` counted
    it in the process that finished each run), in hours: the budget's measure. On shared cores the wall time is
    longer (the report gives both)."""
    total = 0.0
    for done in (out / phase).glob(f"lr*/*/seed*/{DONE}"):
        try:
            total += json.loads((done.parent / RUN_FILE).read_text())["timing"]["cpu_s"]
        except (OSError, ValueError, KeyError):
            continue
    return total / 3600


# ---------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------


def _fmt(x: Any, digits: int = 3) -> str:
    return "-" if not _finite(x) else f"{x:.{digits}f}"


def _pct(x: Any) -> str:
    return "-" if not _finite(x) else f"{100 * x:.1f}"


def _med_range(values: list[float], fmt=_fmt) -> str:
    values = [v for v in values if _finite(v)]
    if not values:
        return "-"
    return f"{fmt(statistics.median(values))} [{fmt(min(values))}, {fmt(max(values))}]"


def cell_table(runs: list[dict[str, Any]]) -> list[str]:
    """One Markdown row per (lr, arm): counts of the flags over seeds, and median [min, max] of the numbers."""
    lines = [
        "| lr | arm | seeds | late-unstable | explosion | rebound | collapse (no gain) | acc. drop >= 10 pp | "
        "early blow-up | "
        "E_late / E0 | held-out start -> peak -> final (%) | drop (pp) | reward early -> late | silenced ratio | "
        "candidate ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    cells: dict[tuple, list] = {}
    for r in runs:
        cells.setdefault((r["spec"]["lr"], r["spec"]["arm"]), []).append(r["summary"])
    arm_order = list(ARMS)
    for lr, arm in sorted(cells, key=lambda k: (k[0], arm_order.index(k[1]))):
        s = cells[(lr, arm)]
        n = len(s)

        def count(key, s=s, n=n):
            return f"{sum(bool(x[key]) for x in s)}/{n}"

        acc = (
            f"{_med_range([x['acc_start'] for x in s], _pct)} -> {_med_range([x['acc_peak'] for x in s], _pct)} -> "
            f"{_med_range([x['acc_final'] for x in s], _pct)}"
        )
        lines.append(
            f"| {lr:g} | {arm} | {n} | {count('late_unstable')} | {count('explosion')} | {count('rebound')} | "
            f"{sum(bool(x['collapse']) for x in s)}/{n} ({count('collapse_no_gain')}) | {count('accuracy_drop')} | "
            f"{count('early_blowup')} | {_med_range([x['e_late_ratio'] for x in s], lambda v: f'{v:.2f}')} | {acc} | "
            f"{_med_range([x['drop'] for x in s], lambda v: f'{100 * v:.1f}')} | "
            f"{_med_range([x['reward_early'] for x in s], lambda v: f'{v:.2f}')} -> "
            f"{_med_range([x['reward_late'] for x in s], lambda v: f'{v:.2f}')} | "
            f"{_med_range([x['silenced_ratio_mean'] for x in s], lambda v: f'{v:.1e}')} | "
            f"{_med_range([x['candidate_ratio_mean'] for x in s], lambda v: f'{v:.1e}')} |"
        )
    return lines


def per_run_table(runs: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| lr | arm | seed | E0 (nats) | E_late / E0 | max / min smoothed E / E0 | rebound | held-out start / peak "
        "(update) / final (%) | silenced tokens | flags | wall (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        s = r["summary"]
        flags = [
            k
            for k in ("explosion", "rebound", "collapse", "collapse_no_gain", "accuracy_drop", "early_blowup")
            if s[k]
        ]
        if s.get("stopped_at"):
            flags.append(f"dead, stopped at {s['stopped_at']}")
        lines.append(
            f"| {s['lr']:g} | {s['arm']} | {s['seed']} | {_fmt(s['e0'])} | {_fmt(s['e_late_ratio'], 2)} | "
            f"{_fmt(s['e_max_ratio'], 2)} / {_fmt(s['e_min_ratio'], 2)} | {_fmt(s['rebound_ratio'], 2)} | "
            f"{_pct(s['acc_start'])} / "
            f"{_pct(s['acc_peak'])} ({s['acc_peak_step']}) / {_pct(s['acc_final'])} | "
            f"{'-' if r['silenced_tokens'] is None else int(r['silenced_tokens'])} | {', '.join(flags) or '-'} | "
            f"{r['timing']['wall_s']:.0f} |"
        )
    return lines


ARM_COLORS = {
    "grpo": "tab:gray",
    "justrl": "tab:red",
    "stapo": "tab:blue",
    "fullmask": "tab:purple",
    "entropy20": "tab:green",
}


def median_curve(series: list[dict[int, float]]) -> tuple[list[int], list[float]]:
    """The median over runs at every update that at least half of them logged (a stopped run drops out)."""
    steps = sorted({s for one in series for s in one})
    out = []
    for s in steps:
        values = [one[s] for one in series if s in one and _finite(one[s])]
        if len(values) * 2 >= len(series):
            out.append((s, statistics.median(values)))
    return [s for s, _ in out], [v for _, v in out]


def plot_phase(runs: list[dict[str, Any]], path: Path, title: str) -> Path | None:
    """Per learning rate (rows): smoothed entropy, smoothed reward and held-out accuracy (columns), a thin line per
    run and a thick median per arm. Returns the PNG path, or `None` without runs."""
    if not runs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    window = CRITERIA["smooth_updates"]
    lrs = sorted({r["spec"]["lr"] for r in runs})
    fig, axes = plt.subplots(len(lrs), 3, figsize=(16, 3.6 * len(lrs)), squeeze=False)
    for row, lr in enumerate(lrs):
        for arm in ARMS:
            cell = [r for r in runs if r["spec"]["lr"] == lr and r["spec"]["arm"] == arm]
            if not cell:
                continue
            color = ARM_COLORS.get(arm, "black")
            per_column: list[list[dict[int, float]]] = [[], [], []]
            for r in cell:
                c = r["curves"]
                steps = c["step"]
                per_column[0].append(dict(zip(steps, trailing_mean(steps, c["entropy"], window))))
                per_column[1].append(dict(zip(steps, trailing_mean(steps, c["reward"], window))))
                per_column[2].append({x["step"]: 100 * x["accuracy"] for x in r["heldout"]})
            for col, series in enumerate(per_column):
                for one in series:
                    axes[row][col].plot(list(one), list(one.values()), color=color, lw=0.6, alpha=0.35)
                xs, ys = median_curve(series)
                label = f"{arm} (median of {len(cell)})" if col == 0 else None
                axes[row][col].plot(xs, ys, color=color, lw=2.0, label=label, marker="." if col == 2 else None)
        axes[row][0].set_ylabel(f"lr {lr:g}\nentropy (nats, {window}-update mean)")
        axes[row][0].set_yscale("log")
        axes[row][1].set_ylabel(f"reward ({window}-update mean)")
        axes[row][2].set_ylabel("held-out avg@4 (%)")
        axes[row][0].legend(fontsize=8)
        for ax in axes[row]:
            ax.set_xlabel("optimizer update")
            ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def machine_line() -> str:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    python = platform.python_version()
    return f"{platform.node()}, {os.cpu_count()} CPU cores ({cpu}), Python {python}, load average at report {load}"


SNAPSHOT_FILE = ".snapshot-commit"


def versions_line() -> str:
    """Library versions and the stapo_trl source: the git commit of this checkout (with a note when it has
    uncommitted changes), or, for a snapshot made with `git archive` (see the module docstring), the commit written
    into its `.snapshot-commit`."""
    from importlib.metadata import version

    import stapo_trl

    names = ("torch", "transformers", "trl", "accelerate", "datasets")
    parts = [f"{n} {version(n)}" for n in names]
    source = Path(stapo_trl.__file__).resolve().parent.parent
    if (source / SNAPSHOT_FILE).is_file():
        commit = (source / SNAPSHOT_FILE).read_text().strip()[:7]
        parts.append(f"stapo_trl from a clean snapshot of commit {commit} (`git archive`, in {source.name}/)")
        return ", ".join(parts)
    try:
        commit = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(source), "status", "--porcelain", "stapo_trl"], capture_output=True, text=True
        ).stdout.strip()
        parts.append(f"stapo_trl at {commit}{' with uncommitted changes to stapo_trl/' if dirty else ''}")
    except OSError:
        pass
    return ", ".join(parts)


DESIGN_TEXT = """\
- Learning rates 1e-4, 3e-4, 6e-4: 1e-4 is the demo's (it learns: held-out ~42 % -> ~70 % in 500 updates), 3e-4 the
  first look's (both arms stalled at reward 0.4-0.5 within 500 updates), 6e-4 past it (on an earlier build of the
  demo model, 6e-4 blew every run up within 10-30 updates; a dead run is stopped early, so such a cell costs little).
- Horizon 2000 updates (4x the demo's 500; 500 rollout batches; 4,000 prompts x 8 samples, about half an epoch of the
  7,800 training prompts): the paper's drift is a late-training effect.
- Budget: the pilot's ~3 CPU-hours hold ~36 such runs (~265 CPU-s each), not 5 arms x 3 lrs x 4 seeds (60). Tier 1
  (JustRL, STAPO, GRPO: the central contrast and the collapse claim) runs first on every lr and seed; tier 2
  (FullMask, 20-Entropy) takes what is left. Seed-major order inside a tier, so a cut budget leaves whole seeds.
- Held-out accuracy on all 300 test problems (avg@4, ~3 s per evaluation), every 250 updates.
- Before the pilot, a 200-update timing run (JustRL, lr 1e-4) showed the entropy halving within 200 updates, so E0
  was moved from the first 100 to the first 20 updates, and the rebound flag, the reward-based early blow-up and the
  dead-run stop were added; no criterion was changed after any pilot run had been looked at. The budget counts CPU
  time. The pilot's process was restarted twice, keeping every finished run: after its 1st run (budget from wall to
  CPU time) and after its 18th (report-only changes: figure medians, strict JSON); the run in progress restarted.
- The pilot stopped at 30 runs, 1.8 of its 3 CPU-hours, when a machine restart ended its process, before seed 3 at
  3e-4 and 6e-4 and before tier 2 (FullMask, 20-Entropy). No later run could move the regime (lr 1e-4 had all 4
  seeds of every tier-1 arm stable; JustRL at 3e-4 had 3 of 3 late-unstable), so the confirm phase ran next: two
  processes, one per core, on disjoint seeds (100-107 and 108-115, each in seed order). Tier 1's seed 3 ran after it
  (`--arms justrl stapo grpo --seeds 3`, one process per lr; the run that was under way resumed from its
  checkpoint). Tier 2 ran last, in the one cell where it could inform (lr 3e-4, seeds 0-3: at 1e-4 every tier-1 run
  was stable and at 6e-4 every one blew up early), two processes on seeds 0-1 and 2-3 (`--arms fullmask entropy20
  --lrs 3e-4`; their `--budget-hours 4.5` never bound): the pilot then stood at 44 runs and 2.6 of its 3 CPU-hours.
  Tier 2 at 1e-4 and 6e-4 was not run.
- stapo_trl was being rewritten in the checkout during the runs (behaviour-preserving), so every run uses a clean
  snapshot of one commit (`git archive`, see the commands and the versions line).
"""


CRITERIA_TEXT = """\
Fixed in `benchmarks/stability.py` (`CRITERIA`, `classify_run`, `select_regime`) before any pilot run was looked at.
Entropy is the trainer's mean token entropy of the sampled completions (nats, logged every 4 updates); reward the
mean training reward; accuracy held-out avg@4 (fraction of correct samples, T 1.0). Per run, horizon N updates:
- E0 = mean entropy over updates <= 20 (the start policy); smoothed = trailing mean over 100 updates; E_late = mean
  entropy over the last 10 % of the updates.
- **explosion**: the smoothed entropy reaches 2 x E0 after the first 10 % of the horizon.
- **rebound** (late upward drift): after the first 10 %, the smoothed entropy reaches 2 x its own minimum so far.
- **collapse**: E_late <= 0.25 x E0. It counts as an instability (**collapse, no gain**) only when the held-out
  accuracy did not gain 5 pp (final - start < 0.05): a sharper policy that learned the task is not a collapse.
- **accuracy drop**: held-out peak (best evaluation after update 0, reached before 75 % of the horizon) minus the
  final accuracy (mean of the last 2 evaluations) >= 10 pp. (One evaluation of 300 problems x 4 samples has a
  standard error of ~1.5-2 pp; the max over 8 evaluations is biased up by ~3 pp, hence 10 pp.)
- **early blow-up**: within the first 10 % of the horizon the smoothed reward falls to <= 0.05, or the entropy
  explodes (the optimizer instability of a too-large lr on a tiny model, not the paper's slow drift).
- **dead run**: every logged reward exactly 0 for 100 updates (no policy gradient left): stopped after one more
  evaluation; its late window is then its last 100 updates, its final accuracy the evaluation(s) at the end.
- **late-unstable** = explosion or rebound or accuracy drop or collapse without gain.
- **A regime shows** at the lowest learning rate where one unmasked arm (JustRL, then GRPO, then 20-Entropy) has
  >= 2 of its 4 pilot seeds late-unstable and < 2 early blow-ups. Then the confirm phase runs JustRL against STAPO at
  that lr on 16 fresh seeds (100-115), paired by seed, and tests (two-sided, exact: sign test, Wilcoxon signed-rank,
  sign-flip permutation of the mean) (a) the accuracy drop from each run's peak, peak - final, and (b) the entropy
  drift |ln(E_late / E0)|, JustRL minus STAPO. STAPO's claim predicts both differences > 0.
"""


def strict_json(value: Any) -> Any:
    """`value` with every non-finite float replaced by `None` (strict JSON has no NaN or infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def write_report(
    out: Path, name: str, commands: list[str], notes: dict[str, Any], results_dir: Path = RESULTS_DIR
) -> Path:
    """Rewrite `<results_dir>/<name>.md`, `.json` and the PNG figures from the finished runs under `out`."""
    pilot = finished_runs(out, "pilot")
    confirm = finished_runs(out, "confirm")
    pilot_summaries = [r["summary"] for r in pilot]
    regime = select_regime(pilot_summaries)
    figures = {}
    fig = plot_phase(pilot, results_dir / f"{name}-pilot.png", "Pilot: one thin line per run, thick: median per arm")
    if fig:
        figures["pilot"] = fig.name
    fig = plot_phase(
        confirm,
        results_dir / f"{name}-confirm.png",
        "Confirm: JustRL vs STAPO, one thin line per run, thick: median per arm",
    )
    if fig:
        figures["confirm"] = fig.name
    comparisons = {}
    if confirm:
        by_arm: dict[str, dict[int, dict]] = {}
        for r in confirm:
            by_arm.setdefault(r["spec"]["arm"], {})[r["spec"]["seed"]] = r["summary"]
        j, s = by_arm.get("justrl", {}), by_arm.get("stapo", {})
        comparisons = {
            "drop": paired_comparison({k: v["drop"] for k, v in j.items()}, {k: v["drop"] for k, v in s.items()}),
            "abs_log_entropy_drift": paired_comparison(
                {
                    k: abs(math.log(v["e_late_ratio"]))
                    for k, v in j.items()
                    if _finite(v["e_late_ratio"]) and v["e_late_ratio"] > 0
                },
                {
                    k: abs(math.log(v["e_late_ratio"]))
                    for k, v in s.items()
                    if _finite(v["e_late_ratio"]) and v["e_late_ratio"] > 0
                },
            ),
            "final_accuracy": paired_comparison(
                {k: v["acc_final"] for k, v in j.items()}, {k: v["acc_final"] for k, v in s.items()}
            ),
        }

    def timing(runs):
        per_update = [
            (r["timing"]["cpu_s"] - r["timing"]["eval_s"]) / r["timing"]["updates_timed"]
            for r in runs
            if r["timing"]["updates_timed"] > 0
        ]
        share = [r["timing"]["cpu_s"] / r["timing"]["wall_s"] for r in runs if r["timing"]["wall_s"] > 0]
        return {
            "runs": len(runs),
            "cpu_hours": round(sum(r["timing"]["cpu_s"] for r in runs) / 3600, 2),
            "wall_hours": round(sum(r["timing"]["wall_s"] for r in runs) / 3600, 2),
            "cpu_s_per_update_median": round(statistics.median(per_update), 4) if per_update else None,
            "cpu_over_wall_median": round(statistics.median(share), 2) if share else None,
        }

    lines = [
        f"# Looking for the paper's instability at laptop scale ({name[:10]})",
        "",
        "STAPO (arXiv:2602.15620) says: without the S2T mask, clip-higher GRPO (JustRL) drifts into entropy explosion "
        "late in training, plain GRPO into entropy collapse, and silencing every low-probability token (FullMask) "
        "into collapse; STAPO keeps entropy level and accuracy from decaying. This is a bounded search for that "
        "regime on the CPU demo model (`builtin:tiny-math`, 144k parameters, two-digit addition), produced by "
        "`benchmarks/stability.py`.",
        "",
        "## Setup",
        "",
        "Every trainer setting of `recipes/demo/stapo.yaml` (16 completions per update, num_generations 8, "
        "steps_per_generation 4, max_completion_length 48, T 1.0, loss dapo, clip 0.2 / 0.28, beta 0, constant lr, "
        "weight decay 0.1, grad clip 1.0, one torch thread), changed only by the arm, the lr, the seed and the "
        "horizon. All arms run on `STAPOTrainer`:",
        "",
        "| arm | settings |",
        "|---|---|",
        *[f"| {a} | {', '.join(f'{k}={v}' for k, v in o.items())} |" for a, o in ARMS.items()],
        "",
        f"Held-out: avg@{EVAL['k']} on the first `eval_problems` problems of the built-in test split (300 = all of "
        f"it), T 1.0, top-p 1.0, {EVAL['max_new_tokens']} new tokens, sampling seed 10000 + update, every "
        "`eval_every` "
        "updates and at the last one; the start model once (update 0, shared by all runs).",
        "",
        "## Design choices",
        "",
        DESIGN_TEXT,
        "## Criteria",
        "",
        CRITERIA_TEXT,
        "## Status",
        "",
    ]
    for key, value in notes.items():
        lines.append(f"- {key}: {value}")
    lines += [
        f"- pilot: {len(pilot)} finished runs; {json.dumps(timing(pilot))} (cpu_over_wall: the share of a core the "
        "run got; below 1 when the other core's job and this one contend)",
        f"- confirm: {len(confirm)} finished runs; {json.dumps(timing(confirm))}",
        f"- regime by the criteria: {json.dumps(regime) if regime else 'none among the finished pilot runs'}",
        "",
        "## Pilot",
        "",
    ]
    if pilot:
        ranges = {
            "lrs": sorted({r["spec"]["lr"] for r in pilot}),
            "updates": sorted({r["spec"]["updates"] for r in pilot}),
            "seeds": sorted({r["spec"]["seed"] for r in pilot}),
            "eval_every": sorted({r["spec"]["eval_every"] for r in pilot}),
            "eval_problems": sorted({r["spec"]["eval_problems"] for r in pilot}),
        }
        lines += [f"Searched: {json.dumps(ranges)}.", "", "Per cell (median [min, max] over seeds):", ""]
        lines += cell_table(pilot)
        if "pilot" in figures:
            lines += ["", f"![pilot curves]({figures['pilot']})"]
        lines += ["", "<details><summary>Per run</summary>", "", *per_run_table(pilot), "", "</details>", ""]
    else:
        lines += ["No finished pilot run yet.", ""]
    lines += ["## Confirm", ""]
    if confirm:
        lines += cell_table(confirm)
        if "confirm" in figures:
            lines += ["", f"![confirm curves]({figures['confirm']})"]
        lines += [
            "",
            "Paired by seed, JustRL minus STAPO:",
            "",
            "| measure | n | mean | median | + / - | p sign | p Wilcoxon | p permutation |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for key, cmp in comparisons.items():
            if cmp.get("n"):
                lines.append(
                    f"| {key} | {cmp['n']} | {cmp['mean']:.4f} | {cmp['median']:.4f} | {cmp['positive']} / "
                    f"{cmp['negative']} | {cmp['p_sign']:.3g} | {cmp['p_wilcoxon']:.3g} | {cmp['p_permutation']:.3g} |"
                )
        lines += ["", "<details><summary>Per run</summary>", "", *per_run_table(confirm), "", "</details>", ""]
    else:
        lines += [
            "Not run (yet)." if regime else "Not run: no regime met the criteria among the finished pilot runs.",
            "",
        ]
    lines += [
        "## Provenance",
        "",
        f"- machine: {machine_line()}",
        f"- versions: {versions_line()}",
        f"- run folders: `{display_path(out)}` (git-ignored)",
        "- commands:",
        "",
        "```bash",
        *commands,
        "```",
        "",
    ]
    md = results_dir / f"{name}.md"
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text("\n".join(lines))
    raw = {
        "criteria": CRITERIA,
        "arms": ARMS,
        "eval": EVAL,
        "regime": regime,
        "comparisons": comparisons,
        "notes": notes,
        "commands": commands,
        "runs": [
            {
                "spec": r["spec"],
                "summary": r["summary"],
                "timing": r["timing"],
                "heldout": r["heldout"],
                "silenced_tokens": r["silenced_tokens"],
            }
            for r in pilot + confirm
        ],
    }
    (results_dir / f"{name}.json").write_text(json.dumps(strict_json(raw), indent=1, default=str, allow_nan=False))
    return md


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    phase = p.add_mutually_exclusive_group(required=True)
    phase.add_argument("--pilot", action="store_true", help="the search: arms x lrs x seeds, in priority tiers")
    phase.add_argument("--confirm", action="store_true", help="JustRL vs STAPO on fresh seeds in the regime found")
    phase.add_argument("--report", action="store_true", help="only rewrite the report from the finished runs")
    p.add_argument("--seeds", type=int, nargs="+", help="pilot: 0 1 2 3; confirm: 100 ... 115")
    p.add_argument("--lrs", type=float, nargs="+", help="pilot: 1e-4 3e-4 6e-4; confirm: the regime's lr")
    p.add_argument("--arms", nargs="+", choices=list(ARMS), help="one tier of these arms instead of the phase's tiers")
    p.add_argument("--updates", type=int, help="optimizer updates per run (pilot and confirm: 2000)")
    p.add_argument(
        "--budget-hours", type=float, help="no run starts once the phase's finished runs used this much CPU"
    )
    p.add_argument("--eval-every", type=int, default=EVAL["every"], help="held-out evaluation period (updates)")
    p.add_argument("--eval-problems", type=int, default=EVAL["problems"], help="held-out problems (first N of 300)")
    p.add_argument("--eval-k", type=int, default=EVAL["k"], help="samples per held-out problem (avg@k)")
    p.add_argument("--save-every", type=int, default=500, help="checkpoint period (updates; a multiple of 4)")
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "stability", help="run folders (under outputs/)")
    p.add_argument("--name", default=f"{datetime.date.today()}-stability", help="report name (without suffix)")
    p.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where the report goes")
    args = p.parse_args(argv)
    defaults = CONFIRM if args.confirm else PILOT
    args.seeds = args.seeds or defaults["seeds"]
    args.tiers = [args.arms] if args.arms else defaults["tiers"]
    args.updates = args.updates or defaults["updates"]
    args.budget_hours = defaults["budget_hours"] if args.budget_hours is None else args.budget_hours
    if args.pilot:
        args.lrs = args.lrs or PILOT["lrs"]
    if args.save_every % 4:
        p.error("--save-every must be a multiple of steps_per_generation (4)")
    args.out = args.out if args.out.is_absolute() else Path.cwd() / args.out
    args.results_dir = args.results_dir if args.results_dir.is_absolute() else Path.cwd() / args.results_dir
    return args


def display_path(path: Path | str) -> str:
    """`path` relative to the working directory when it lies inside it (the repository root, in the commands)."""
    path = Path(path).resolve()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def command_line(args: list[str] | None = None) -> str:
    """This command (or this script with `args`) as typed from the repository root: the script's own path, a
    snapshot's when run from one."""
    return shlex.join([".venv/bin/python", display_path(sys.argv[0]), *(sys.argv[1:] if args is None else args)])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    commands_file = args.out / "commands.txt"
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report:
        with open(commands_file, "a") as f:
            f.write(command_line() + "\n")
    commands = commands_file.read_text().splitlines() if commands_file.is_file() else []
    report = ["--report", "--out", display_path(args.out), "--results-dir", display_path(args.results_dir)]
    commands = list(dict.fromkeys(commands + [command_line(report)]))
    notes = {
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "load average at start (1/5/15 min)": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    if args.report:
        print(write_report(args.out, args.name, commands, {}, args.results_dir))
        return
    phase = "confirm" if args.confirm else "pilot"
    if args.confirm and not args.lrs:
        regime = select_regime([r["summary"] for r in finished_runs(args.out, "pilot")])
        if regime is None:
            print("No regime met the criteria among the finished pilot runs: nothing to confirm (--lrs forces one).")
            print(write_report(args.out, args.name, commands, notes, args.results_dir))
            return
        args.lrs = [regime["lr"]]
    specs = phase_specs(args)
    todo = [s for s in specs if not is_done(s.folder(args.out))]
    print(f"{len(specs)} runs, {len(specs) - len(todo)} already done, {len(todo)} to run", flush=True)
    for i, spec in enumerate(todo):
        spent = spent_hours(args.out, phase)
        if spent >= args.budget_hours:
            print(
                f"Budget spent ({spent:.2f} of {args.budget_hours} h): {len(todo) - i} runs not started.", flush=True
            )
            notes["budget"] = f"{spent:.2f} of {args.budget_hours} h spent; {len(todo) - i} runs not started"
            break
        t0 = time.perf_counter()
        print(f"[{i + 1}/{len(todo)}] {spec.phase} {spec.arm} lr {spec.lr:g} seed {spec.seed} ...", flush=True)
        try:
            run_one(spec, args.out)
        except Exception as e:  # noqa: BLE001 (one failed run must not stop a sweep of hours; it is retried on rerun)
            print(f"    FAILED: {type(e).__name__}: {e}", flush=True)
            continue
        print(f"    done in {time.perf_counter() - t0:.0f} s", flush=True)
        write_report(args.out, args.name, commands, notes, args.results_dir)
    print(write_report(args.out, args.name, commands, notes, args.results_dir))


if __name__ == "__main__":
    main()
