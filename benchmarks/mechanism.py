#!/usr/bin/env python
r"""Two of STAPO's mechanism claims measured on a real tokenizer: the gradient norm (Theorem 3.3) and the entropy change
(Lemma 3.2) of positive-advantage tokens, on SmolLM2-135M SFT-warmed on tiny-math (`builtin:smollm2-135m-math`).

    python benchmarks/mechanism.py --tokens 50000

What it does:
1. **Tokens.** Rollouts are sampled as training samples them: a trainer is built from the recipe
   (`recipes/SmolLM2-135M/stapo.yaml`: its prompts, chat template, group size 8, T = 1.0, binary reward, advantages)
   and `benchmarks/census.py::sample_rollouts` scores rollout batches until `--tokens` completion tokens exist. Every
   token of a completion with advantage A > 0 is pooled.
2. **Exact per-token quantities.** One no-grad forward per pooled completion gives the FULL logits (vocabulary 49,152,
   at the loss's temperature); in float64, in chunks of positions: p = π_a, H (nats), Σ_v π_v², Σ_v π_v² log π_v
   ([`~stapo_trl.diagnostics.gradients.softmax_statistics`]); the exact squared logit-gradient norm of the token's
   loss -w log π_a with w = A (on-policy: ratio 1, no clip), ||∂ℓ/∂z||² = A² (1 - 2p + Σ π²), and the Theorem's
   bounds A² (1 - 2p + e^{-H}) <= ||∂ℓ/∂z||² <= A² (2 - 2p - C_V H²), C_V = (V - 1) / (V (ln V)²).
3. **Quadrants.** p below/above τ_p (the recipe's 0.002) x H below/above a split. Primary split: the paper's τ_h, the
   q-quantile (the recipe's 0.75) of the entropies of the candidates (A > 0, p < τ_p) of the whole pool, computed by
   the public `stapo_trl.s2t_mask` with the pool as one mini-batch, so the low-p/low-H quadrant is exactly the set
   S2T would silence. The same H split is used for the high-p tokens. Secondary split (a sensitivity check): the median
   entropy of all pooled tokens, which balances the high-p side instead.
4. **Claim 1 (gradient norm).** Per quadrant: count, mean and median of ||∂ℓ/∂z|| / |A| (advantages do not confound)
   and of ||∂ℓ/∂z|| (raw), each with a 95 % percentile interval from a cluster bootstrap that resamples whole
   completions (tokens of one completion are not independent); the ratio of the low-p/low-H mean (and median) to the
   high-p/high-H one, from the same resamples (the paper's early version: spurious tokens ~16.7 % above the
   high-p/high-H baseline on Qwen3-8B). The share of tokens inside the bounds (float64; tolerance 1e-12 A²).
5. **Claim 2 (entropy change, logit view).** One gradient step of size η (`--logit-step`) on the token's own loss,
   in logit space: z <- z + η A (e_a - π). Exact change: H(softmax(z + η A (e_a - π))) - H(softmax(z))
   ([`~stapo_trl.diagnostics.gradients.entropy_after_logit_step`]). Lemma 3.2's first-order prediction, from
   ∂H/∂z_k = -π_k (log π_k + H):

       ΔH ≈ η A [Σ_v π_v² (log π_v + H) - p (log p + H)]

   ([`~stapo_trl.diagnostics.gradients.entropy_change_first_order`], tested against finite differences in
   `tests/diagnostics/test_gradients.py`). For A > 0 it is > 0 whenever p < e^{-H} and <= 0 for the most likely
   token. Per quadrant: the share with ΔH > 0, the sign agreement of prediction and exact change, and the same at
   η = 1 (a step far outside the first-order regime for confident positions).
6. **Claim 2 (a real parameter step).** For `--param-tokens` tokens per quadrant (a seeded sample): plain SGD
   θ <- θ - lr ∇_θ(-A log π_a) on that one token's loss at its own position, for each `--param-lr`; a fresh forward of
   the same prefix gives the entropy after; the parameters are restored exactly. Reported: the sign agreement and the
   correlation (Pearson and Spearman) of the real ΔH with the logit-view prediction; the linearization check (the real
   ΔH against ∇_z H · Δz_real, from the actual logit change Δz_real); the cosine of the centered Δz_real with the
   logit view's direction A (e_a - π); the ratio of ΔH at the two learning rates (2 for a step in the linear regime).

It writes `<out>.md` (tables with the counts behind every cell, provenance), `<out>.json` (the summaries, every
low-p token and every parameter-step token with its text, a seeded sample of 1,000 high-p tokens), two figures beside
them (`<out>-gradnorm.png`, `<out>-entropy.png`) and every pooled token's numbers as `outputs/<out name>-tokens.npz`
(not committed; for re-plotting). What it does not show: anything about training dynamics, other models, long
responses or the paper's scale: one small, SFT-warmed model on a synthetic task, at one checkpoint.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import random
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import script_env  # noqa: I001 (first: the environment and sys.path)


# isort: split
import numpy as np  # noqa: E402 (after script_env: OpenBLAS reads OMP_NUM_THREADS at import)
import torch  # noqa: E402
from census import sample_rollouts  # noqa: E402
from harness import build_trainer, machine_info, versions  # noqa: E402

from stapo_trl import s2t_mask  # noqa: E402
from stapo_trl.diagnostics.gradients import (  # noqa: E402
    entropy_after_logit_step,
    entropy_change_first_order,
    entropy_logit_gradient,
    logit_grad_norm_bounds,
    logit_grad_norm_sq,
    softmax_statistics,
)


RESULTS_DIR = script_env.REPO / "benchmarks" / "results"
RECIPE = "recipes/SmolLM2-135M/stapo.yaml"
MODEL = "builtin:smollm2-135m-math"
QUADRANTS = ("low p, low H", "low p, high H", "high p, low H", "high p, high H")  # index = 2 * high_p + high_h
SPURIOUS, BASELINE = 0, 3  # the paper's comparison: low-p/low-H against high-p/high-H
BOUND_TOL = 1e-12  # float64 rounding, relative to A^2 (the bounds and the exact norm are O(1) times A^2)
CHUNK = 128  # positions per float64 softmax over the 49,152-token vocabulary (~50 MB per copy)
PAPER_RATIO = 1.167  # the paper's early version: spurious tokens ~16.7 % above the high-p/high-H baseline (Qwen3-8B)


# ---------------------------------------------------------------------------------------------------------------
# Tokens: rollouts as training samples them, then full logits
# ---------------------------------------------------------------------------------------------------------------


def sample_with_prompts(trainer, tokens: int, seed: int) -> dict[str, Any]:
    """`census.sample_rollouts`, also keeping each completion's unpadded prompt ids (`prompt_ids`, list[list[int]]),
    which a full-logits forward needs. The rollout batches are captured as `sample_rollouts` scores them (same order)."""
    prompts: list[list[int]] = []
    generate = trainer._generate_and_score_completions

    def capture(inputs):
        batch = generate(inputs)
        for row in range(batch["prompt_ids"].size(0)):
            prompts.append(batch["prompt_ids"][row][batch["prompt_mask"][row].bool()].tolist())
        return batch

    trainer._generate_and_score_completions = capture  # instance attribute: sample_rollouts' calls go through it
    try:
        torch.manual_seed(seed)
        sample = sample_rollouts(trainer, tokens, seed)
    finally:
        del trainer._generate_and_score_completions
    assert len(prompts) == len(sample["completion_ids"])
    sample["prompt_ids"] = prompts
    return sample


@torch.no_grad()
def completion_logits(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """(T, V) float32 logits at the loss's temperature that predict each of the T completion tokens."""
    ids = torch.tensor([prompt + completion])  # (1, P+T)
    logits = model(input_ids=ids).logits[0]  # (P+T, V)
    return logits[len(prompt) - 1 : len(prompt) + len(completion) - 1] / temperature  # (T, V)


def token_table(trainer, sample: dict[str, Any], logit_step: float) -> dict[str, np.ndarray]:
    """Per pooled token (every token of every completion with A > 0), as numpy arrays (float64 unless said):
    `completion` and `position` (int), `token_id` (int), `advantage`, `prob`, `entropy` (nats), `collision`
    (Σ π²), `collision_logp` (Σ π² log π), `dh_exact` / `dh_first` (ΔH after the logit step η = `logit_step`, exact and
    first order), `dh_exact_unit` / `dh_first_unit` (the same at η = 1), `trainer_logp` / `trainer_entropy` (the
    trainer's own float32 values, for a cross-check)."""
    model, temperature = trainer.model, trainer.args.temperature
    columns: dict[str, list] = {
        k: []
        for k in (
            "completion", "position", "token_id", "advantage", "prob", "entropy", "collision", "collision_logp",
            "dh_exact", "dh_first", "dh_exact_unit", "dh_first_unit", "trainer_logp", "trainer_entropy",
        )
    }  # fmt: skip
    positive = [i for i, a in enumerate(sample["advantage"]) if a > 0]
    start = time.perf_counter()
    for done, i in enumerate(positive):
        completion = sample["completion_ids"][i]
        logits = completion_logits(model, sample["prompt_ids"][i], completion, temperature)  # (T, V)
        sampled = torch.tensor(completion)  # (T,)
        advantage = sample["advantage"][i]
        for lo in range(0, len(completion), CHUNK):
            z, a = logits[lo : lo + CHUNK], sampled[lo : lo + CHUNK]  # (C, V), (C,)
            stats = softmax_statistics(z, a)  # four (C,) float64
            for name, step in (("", logit_step), ("_unit", 1.0)):
                after = entropy_after_logit_step(z, a, advantage, step)
                columns["dh_exact" + name] += (after - stats.entropy).tolist()
                columns["dh_first" + name] += entropy_change_first_order(*stats, advantage, step).tolist()
            columns["prob"] += stats.probs_sampled.tolist()
            columns["entropy"] += stats.entropy.tolist()
            columns["collision"] += stats.collision_prob.tolist()
            columns["collision_logp"] += stats.collision_logp.tolist()
        n = len(completion)
        columns["completion"] += [i] * n
        columns["position"] += list(range(n))
        columns["token_id"] += completion
        columns["advantage"] += [advantage] * n
        columns["trainer_logp"] += sample["logps"][i]
        columns["trainer_entropy"] += sample["entropies"][i]
        if (done + 1) % 100 == 0:
            print(f"  full logits: {done + 1}/{len(positive)} completions ({time.perf_counter() - start:.0f} s)")
    ints = {"completion", "position", "token_id"}
    return {k: np.asarray(v, dtype=np.int64 if k in ints else np.float64) for k, v in columns.items()}


def add_gradient_columns(table: dict[str, np.ndarray], vocab_size: int) -> None:
    """Adds `grad_sq` (||∂ℓ/∂z||², w = A), `lower` and `upper` (the Theorem's bounds), float64."""
    t = {k: torch.from_numpy(table[k]) for k in ("prob", "entropy", "collision", "advantage")}
    table["grad_sq"] = logit_grad_norm_sq(t["prob"], t["collision"], t["advantage"]).numpy()
    lower, upper = logit_grad_norm_bounds(t["prob"], t["entropy"], t["advantage"], vocab_size)
    table["lower"], table["upper"] = lower.numpy(), upper.numpy()


def quadrants(table: dict[str, np.ndarray], tau_p: float, q: float) -> dict[str, Any]:
    """The two H splits and each token's quadrant (0..3, `QUADRANTS` order) under each.

    Primary: τ_h of the S2T rule over the whole pool, from the public `s2t_mask` (the pool is one mini-batch of one row
    with advantage 1, as every pooled token has A > 0); quadrant 0 is then exactly its `silenced` set. Secondary: the
    median entropy of the pool. The comparisons are strict, as the rule's: H < split is "low H"."""
    logp = torch.from_numpy(np.log(table["prob"])).unsqueeze(0)  # (1, N)
    entropy = torch.from_numpy(table["entropy"]).unsqueeze(0)  # (1, N)
    result = s2t_mask(
        logp, entropy, torch.ones(1, dtype=torch.float64), torch.ones_like(logp, dtype=torch.bool),
        prob_threshold=tau_p, entropy_quantile=q,
    )  # fmt: skip
    tau_h = float(result.entropy_threshold)
    high_p = table["prob"] >= tau_p
    splits = {"tau_h": tau_h, "median": float(np.median(table["entropy"]))}
    out = {"splits": splits, "candidates": int(result.candidate.sum()), "silenced": int(result.silenced.sum())}
    for name, split in splits.items():
        out[name] = 2 * high_p.astype(np.int64) + (table["entropy"] >= split).astype(np.int64)
    # The rule's silenced set is the primary split's low-p/low-H quadrant (a check of this script, not of s2t_mask).
    assert np.array_equal(result.silenced[0].numpy(), out["tau_h"] == SPURIOUS) or math.isnan(tau_h)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Cluster bootstrap (whole completions)
# ---------------------------------------------------------------------------------------------------------------


def _weighted_median(sorted_values: np.ndarray, counts: np.ndarray) -> float:
    """The median of `sorted_values` repeated `counts` (integer) times each, as `np.median` of the expanded array."""
    total = int(counts.sum())
    if total <= 0:
        return math.nan
    cum = np.cumsum(counts)
    lo, hi = np.searchsorted(cum, [(total - 1) // 2, total // 2], side="right")  # 0-based ranks -> value indices
    return float(0.5 * (sorted_values[lo] + sorted_values[hi]))


def bootstrap_quadrants(
    values: np.ndarray, quadrant: np.ndarray, completion: np.ndarray, reps: int, seed: int
) -> dict[str, Any]:
    """Per quadrant: mean and median of `values`, each with a 95 % percentile interval from resampling whole
    completions with replacement (`reps` times); and the ratio of quadrant `SPURIOUS` to `BASELINE` (mean and median)
    from the same resamples. Resamples in which a quadrant is empty give NaN and are dropped (counted)."""
    ids, cluster = np.unique(completion, return_inverse=True)
    rng = np.random.default_rng(seed)
    order = {k: np.argsort(values[quadrant == k], kind="stable") for k in range(4)}
    members = {k: np.flatnonzero(quadrant == k) for k in range(4)}
    means = np.full((reps, 4), np.nan)
    medians = np.full((reps, 4), np.nan)
    for b in range(reps):
        weight = rng.multinomial(len(ids), np.full(len(ids), 1.0 / len(ids)))[cluster].astype(np.float64)  # (N,)
        for k in range(4):
            w = weight[members[k]]
            if w.sum() > 0:
                v = values[members[k]]
                means[b, k] = float((w * v).sum() / w.sum())
                medians[b, k] = _weighted_median(v[order[k]], w[order[k]])
    if reps:  # the definition the resamples use gives np.median at unit counts
        assert all(
            _weighted_median(np.sort(values[members[k]]), np.ones(len(members[k]))) == np.median(values[members[k]])
            for k in range(4)
            if len(members[k])
        )

    def interval(x: np.ndarray) -> list[float]:
        x = x[np.isfinite(x)]
        return [float(np.percentile(x, 2.5)), float(np.percentile(x, 97.5))] if len(x) else [math.nan, math.nan]

    out: dict[str, Any] = {"quadrants": [], "reps": reps}
    for k in range(4):
        v = values[members[k]]
        out["quadrants"].append(
            {
                "count": int(len(v)),
                "completions": int(len(np.unique(completion[members[k]]))),
                "mean": float(v.mean()) if len(v) else math.nan,
                "mean_ci": interval(means[:, k]),
                "median": float(np.median(v)) if len(v) else math.nan,
                "median_ci": interval(medians[:, k]),
            }
        )
    for stat, arr in (("mean", means), ("median", medians)):
        point = out["quadrants"][SPURIOUS][stat] / out["quadrants"][BASELINE][stat]
        ratios = arr[:, SPURIOUS] / arr[:, BASELINE]
        out[f"ratio_{stat}"] = {
            "point": point,
            "ci": interval(ratios),
            "dropped_resamples": int((~np.isfinite(ratios)).sum()),
        }
    return out


# ---------------------------------------------------------------------------------------------------------------
# A real parameter step
# ---------------------------------------------------------------------------------------------------------------


def parameter_steps(
    trainer, sample: dict[str, Any], table: dict[str, np.ndarray], quadrant: np.ndarray, per_quadrant: int,
    lrs: list[float], seed: int,
) -> list[dict[str, Any]]:  # fmt: skip
    """For `per_quadrant` sampled tokens of each quadrant: SGD on that token's loss -A log π_a at each `lrs`, the
    entropy at its position after the step (a fresh forward of the same prefix), parameters restored after each.

    Returns one record per token: its index in `table`, quadrant, p, H (before, from this prefix's forward), the
    logit-view first-order prediction per unit step `dh_logit_unit` = A [Σ π² (log π + H) - p (log p + H)],
    `param_grad_norm` (‖∇_θ ℓ‖), and per lr: `dh` (real ΔH, nats), `dh_linear` (∇_z H · Δz_real), `cosine` (Δz_real
    against the logit view's direction A (e_a - π), both centered: softmax ignores a common shift), `cosine_fisher`
    (the same in the π-weighted inner product Σ_v π_v x_v y_v, π-centered: the alignment where the probability mass
    is), `logit_step_norm` (‖Δz_real‖, centered), `prob_after`."""
    model, temperature = trainer.model, trainer.args.temperature
    params = [p for p in model.parameters() if p.requires_grad]
    saved = [p.detach().clone() for p in params]
    rng = random.Random(seed)
    records = []
    for k in range(4):
        members = np.flatnonzero(quadrant == k).tolist()
        for index in sorted(rng.sample(members, min(per_quadrant, len(members)))):
            c, t = int(table["completion"][index]), int(table["position"][index])
            prompt, completion = sample["prompt_ids"][c], sample["completion_ids"][c]
            ids = torch.tensor([prompt + completion[: t + 1]])  # (1, P+t+1): the prefix ending with the token
            pos, token, advantage = len(prompt) + t - 1, completion[t], sample["advantage"][c]
            with torch.no_grad():
                z_before = model(input_ids=ids).logits[0, pos].double() / temperature  # (V,)
            before = softmax_statistics(z_before, torch.tensor(token))
            model.zero_grad(set_to_none=True)
            logits = model(input_ids=ids).logits[0, pos] / temperature  # (V,)
            (-advantage * torch.log_softmax(logits, -1)[token]).backward()
            grad_norm = math.sqrt(sum(float(p.grad.double().square().sum()) for p in params if p.grad is not None))
            probs = torch.softmax(z_before, -1)
            direction = advantage * (torch.nn.functional.one_hot(torch.tensor(token), probs.numel()).double() - probs)
            grad_h = entropy_logit_gradient(z_before)  # (V,)
            record = {
                "index": int(index),
                "quadrant": k,
                "token_id": int(token),
                "advantage": advantage,
                "prob": float(before.probs_sampled),
                "entropy": float(before.entropy),
                "dh_logit_unit": float(entropy_change_first_order(*before, advantage, 1.0)),
                "param_grad_norm": grad_norm,
                "steps": {},
            }
            for lr in lrs:
                with torch.no_grad():
                    for p in params:
                        if p.grad is not None:
                            p.add_(p.grad, alpha=-lr)
                    z_after = model(input_ids=ids).logits[0, pos].double() / temperature  # (V,)
                    for p, s in zip(params, saved, strict=True):
                        p.copy_(s)
                dz = z_after - z_before  # (V,)
                dz_c, dir_c = dz - dz.mean(), direction - direction.mean()  # softmax ignores a common shift
                dz_f, dir_f = dz - (probs * dz).sum(), direction - (probs * direction).sum()  # π-centered
                fisher = (probs * dz_f * dir_f).sum() / ((probs * dz_f**2).sum() * (probs * dir_f**2).sum()).sqrt()
                after = softmax_statistics(z_after, torch.tensor(token))
                record["steps"][str(lr)] = {
                    "dh": float(after.entropy - before.entropy),
                    "dh_linear": float((grad_h * dz).sum()),
                    "cosine": float((dz_c * dir_c).sum() / (dz_c.norm() * dir_c.norm()).clamp(min=1e-300)),
                    "cosine_fisher": float(fisher),
                    "logit_step_norm": float(dz_c.norm()),
                    "prob_after": float(after.probs_sampled),
                }
            model.zero_grad(set_to_none=True)
            records.append(record)
            print(f"  parameter step: quadrant {k}, token {index}: ΔH {[s['dh'] for s in record['steps'].values()]}")
    for p, s in zip(params, saved, strict=True):
        assert torch.equal(p, s)  # restored exactly
    return records


def _rank(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x))
    return ranks


def _correlations(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    if len(x) < 3:
        return {"pearson": math.nan, "spearman": math.nan}
    return {"pearson": float(np.corrcoef(x, y)[0, 1]), "spearman": float(np.corrcoef(_rank(x), _rank(y))[0, 1])}


def summarize_parameter_steps(records: list[dict[str, Any]], lrs: list[float]) -> dict[str, Any]:
    """Sign agreement of the real ΔH with the logit view, correlations, linearization and lr-doubling checks."""
    out: dict[str, Any] = {}
    for lr in lrs:
        key = str(lr)
        per: dict[str, Any] = {"quadrants": []}
        groups = [[r for r in records if r["quadrant"] == k] for k in range(4)] + [records]
        for k, group in enumerate(groups):
            pred = np.array([r["dh_logit_unit"] for r in group])
            real = np.array([r["steps"][key]["dh"] for r in group])
            linear = np.array([r["steps"][key]["dh_linear"] for r in group])
            cos = np.array([r["steps"][key]["cosine"] for r in group])
            cos_f = np.array([r["steps"][key]["cosine_fisher"] for r in group])
            cell = {
                "count": len(group),
                "real_positive": int((real > 0).sum()),
                "sign_agree": int((np.sign(real) == np.sign(pred)).sum()),
                "correlation": _correlations(pred, real),
                "linear_sign_agree": int((np.sign(real) == np.sign(linear)).sum()),
                "linear_rel_error_median": float(np.median(np.abs(real - linear) / np.abs(real).clip(1e-300)))
                if len(group)
                else math.nan,
                "cosine_median": float(np.median(cos)) if len(group) else math.nan,
                "cosine_fisher_median": float(np.median(cos_f)) if len(group) else math.nan,
                "real_dh_median": float(np.median(real)) if len(group) else math.nan,
            }
            if k < 4:
                per["quadrants"].append(cell)
            else:
                per["all"] = cell
        out[key] = per
    if len(lrs) >= 2:
        a, b = str(lrs[0]), str(lrs[1])
        ratio = [r["steps"][b]["dh"] / r["steps"][a]["dh"] for r in records if r["steps"][a]["dh"] != 0]
        out["lr_ratio"] = {"lrs": [lrs[0], lrs[1]], "dh_ratio_median": float(np.median(ratio)) if ratio else math.nan}
        out["lr_ratio"]["dh_ratio_p10_p90"] = [float(np.percentile(ratio, 10)), float(np.percentile(ratio, 90))]
    return out


# ---------------------------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------------------------

COLORS = ("#d62728", "#ff7f0e", "#1f77b4", "#2ca02c")


def plot_gradnorm(table, quadrant, split, tau_p, vocab_size, summary, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p, h = table["prob"], table["entropy"]
    norm_sq = table["grad_sq"] / table["advantage"] ** 2  # ||∂ℓ/∂z||² / A²
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    ax = axes[0]
    sc = ax.scatter(p, norm_sq, c=h, s=4, cmap="viridis", rasterized=True)
    fig.colorbar(sc, ax=ax, label="entropy H (nats)")
    grid = np.logspace(np.log10(max(p.min(), 1e-12)), 0, 200)
    c_v = (vocab_size - 1) / (vocab_size * math.log(vocab_size) ** 2)
    for h_fixed, style in ((0.05, "-"), (1.0, "--"), (3.0, ":")):
        color = plt.get_cmap("viridis")((h_fixed - h.min()) / max(h.max() - h.min(), 1e-12))
        ax.plot(grid, 1 - 2 * grid + math.exp(-h_fixed), style, color=color, lw=1.2, label=f"lower, H = {h_fixed}")
        ax.plot(grid, 2 - 2 * grid - c_v * h_fixed**2, style, color="k", lw=0.8, alpha=0.6)
    ax.axvline(tau_p, color="grey", lw=0.8)
    ax.set(xscale="log", xlabel="p (sampled-token probability)", ylabel="‖∂ℓ/∂z‖² / A²", ylim=(-0.05, 2.1))
    ax.set_title("exact squared norm vs p (black: upper bounds)")
    ax.legend(fontsize=7, loc="lower left")
    ax = axes[1]
    position = (table["grad_sq"] - table["lower"]) / np.clip(table["upper"] - table["lower"], 1e-300, None)
    for k in (2, 3, 1, 0):  # the rare low-p quadrants on top
        m = quadrant == k
        ax.scatter(h[m], position[m], color=COLORS[k], s=4 if k >= 2 else 14, label=QUADRANTS[k], rasterized=True)
    ax.axhline(0, color="k", lw=0.8)
    ax.axhline(1, color="k", lw=0.8)
    ax.set_xscale("symlog", linthresh=1e-3)
    ax.set_xlim(left=0)
    ax.legend(fontsize=7, loc="lower left")
    ax.set(xlabel="entropy H (nats, symlog)", ylabel="(exact - lower) / (upper - lower)")
    ax.set_title(f"position between the bounds ({summary['inside_share'] * 100:.2f} % inside)")
    ax = axes[2]
    cells = summary["normalized"]["quadrants"]
    for k, cell in enumerate(cells):
        if cell["count"]:
            lo, hi = cell["mean_ci"]
            ax.errorbar(k, cell["mean"], yerr=[[cell["mean"] - lo], [hi - cell["mean"]]], fmt="o", color=COLORS[k],
                        capsize=4, label=f"{QUADRANTS[k]} (n = {cell['count']})")  # fmt: skip
            ax.plot(k + 0.15, cell["median"], "x", color=COLORS[k])
    ax.set_xticks(range(4), [q.replace(", ", "\n") for q in QUADRANTS], fontsize=8)
    ax.set(ylabel="‖∂ℓ/∂z‖ / |A|  (o mean with 95 % CI, x median)")
    ax.set_title(f"per quadrant (H split: {split})")
    ax.legend(fontsize=7)
    fig.suptitle("Theorem 3.3 on SmolLM2-135M (tiny-math SFT): positive-advantage tokens, full 49,152-token softmax")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def plot_entropy(table, quadrant, logit_step, records, lr, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    unit = table["dh_exact"] / (logit_step * table["advantage"])  # nats per unit step per unit advantage
    ax = axes[0]
    for k in (2, 3, 1, 0):
        m = quadrant == k
        ax.scatter(table["prob"][m], unit[m], s=4 if k >= 2 else 14, color=COLORS[k],
                   label=f"{QUADRANTS[k]} (n = {m.sum()})", rasterized=True)  # fmt: skip
    ax.axhline(0, color="k", lw=0.8)
    ax.set(xscale="log", yscale="symlog", xlabel="p", ylabel=f"exact ΔH / (η A), η = {logit_step:g} (nats, symlog)")
    ax.set_yscale("symlog", linthresh=1e-4)
    ax.set_title("logit step on the token's own loss: entropy change")
    ax.legend(fontsize=7)
    ax = axes[1]
    first = table["dh_first"] / (logit_step * table["advantage"])
    for k in (2, 3, 1, 0):
        m = quadrant == k
        ax.scatter(first[m], unit[m], color=COLORS[k], s=4 if k >= 2 else 14, rasterized=True)
    lim = np.nanmax(np.abs(np.concatenate([first, unit])))
    ax.plot([-lim, lim], [-lim, lim], "k-", lw=0.6)
    ax.set_xscale("symlog", linthresh=1e-4)
    ax.set_yscale("symlog", linthresh=1e-4)
    ax.set(xlabel="Lemma 3.2 first order / (η A)", ylabel="exact / (η A)")
    ax.set_title("first-order prediction vs exact (logit view)")
    ax = axes[2]
    key = str(lr)
    for k in range(4):
        group = [r for r in records if r["quadrant"] == k]
        if group:
            ax.scatter([r["dh_logit_unit"] for r in group], [r["steps"][key]["dh"] for r in group], color=COLORS[k],
                       s=18, label=QUADRANTS[k])  # fmt: skip
    ax.axhline(0, color="k", lw=0.6)
    ax.axvline(0, color="k", lw=0.6)
    ax.set_xscale("symlog", linthresh=1e-4)
    ax.set_yscale("symlog", linthresh=1e-7)
    ax.set(xlabel="logit-view first-order ΔH per unit step (nats)", ylabel=f"real ΔH after SGD, lr = {lr:g} (nats)")
    ax.set_title("one real parameter step (one token's loss)")
    ax.legend(fontsize=7)
    fig.suptitle("Lemma 3.2 on SmolLM2-135M (tiny-math SFT): the entropy change of a positive update at its position")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------


def _ci(cell: dict, stat: str, fmt: str = "{:.3f}") -> str:
    if not cell["count"]:
        return "-"
    lo, hi = cell[f"{stat}_ci"]
    return f"{fmt.format(cell[stat])} [{fmt.format(lo)}, {fmt.format(hi)}]"


def entropy_cells(table, quadrant) -> list[dict[str, Any]]:
    """Per quadrant: counts behind the logit-view entropy-change claims."""
    cells = []
    for k in range(4):
        m = quadrant == k
        exact, first = table["dh_exact"][m], table["dh_first"][m]
        exact_u, first_u = table["dh_exact_unit"][m], table["dh_first_unit"][m]
        rel = np.abs(first - exact) / np.clip(np.abs(exact), 1e-300, None)
        cells.append(
            {
                "count": int(m.sum()),
                "exact_positive": int((exact > 0).sum()),
                "first_positive": int((first > 0).sum()),
                "sign_agree": int((np.sign(exact) == np.sign(first)).sum()),
                "p_below_exp_minus_h": int((table["prob"][m] < np.exp(-table["entropy"][m])).sum()),
                "rel_error_median": float(np.median(rel)) if m.any() else math.nan,
                "dh_per_step_median": float(np.median(exact / table["advantage"][m])) if m.any() else math.nan,
                "unit_exact_positive": int((exact_u > 0).sum()),
                "unit_sign_agree": int((np.sign(exact_u) == np.sign(first_u)).sum()),
            }
        )
    return cells


def write_report(out: Path, result: dict[str, Any], figures: dict[str, Path]) -> None:
    r = result
    pr, sp = r["pool"], r["splits"]
    lines = [
        f"# Mechanism: gradient norm (Theorem 3.3) and entropy change (Lemma 3.2) on a real tokenizer ({r['date']})",
        "",
        f"Command: `{r['command']}` ({r['wall_seconds'] / 60:.1f} min wall, {r['cpu_seconds'] / 60:.1f} min CPU)",
        "",
        f"Model `{r['model']}` (SmolLM2-135M-Instruct SFT-warmed on tiny-math, vocabulary {r['vocab_size']:,}), "
        f"recipe `{r['recipe']}`. {pr['completions']} completions sampled as training samples them "
        f"({pr['tokens']:,} tokens, mean reward {pr['reward_mean']:.2f}); every token of the {pr['positive_completions']} "
        f"completions with A > 0 pooled: **{pr['positive_tokens']:,} tokens**. p, H (nats), Σπ² exactly from the full "
        f"softmax at T = {r['temperature']:g}, in float64; w = A (on-policy). The trainer's own float32 values agree: "
        f"max |Δ log p| = {pr['check_logp_max_abs']:.1e}, max |ΔH| = {pr['check_entropy_max_abs']:.1e} nats.",
        "",
        f"Quadrants: p < τ_p = {r['tau_p']:g} (low p) or not, and H below the split or not. **Primary split: the "
        f"paper's τ_h = {sp['tau_h']:.4f} nats**, the q = {r['q']:g} quantile of the candidates' entropies over the pool "
        f"({r['candidates']} candidates), from `stapo_trl.s2t_mask` with the pool as one mini-batch: the low-p/low-H "
        f"quadrant is exactly what S2T silences ({r['silenced']} tokens); the same split for high p. Secondary split "
        f"(sensitivity): the pool's median entropy, {sp['median']:.2e} nats. Intervals: 95 % percentile, cluster "
        f"bootstrap over completions ({r['bootstrap']} resamples).",
        "",
        "## Claim 1: gradient norm (Theorem 3.3)",
        "",
        f"Inside the bounds A²(1 - 2p + e^(-H)) <= ‖∂ℓ/∂z‖² <= A²(2 - 2p - C_V H²): **{r['inside']} of "
        f"{pr['positive_tokens']} tokens ({r['inside_share'] * 100:.2f} %)** (tolerance {BOUND_TOL:g} A²; inside "
        f"without tolerance: {r['inside_strict']}). The largest excess over a bound is {r['max_violation']:.1e} A² "
        "(negative: every token is inside, and that is minus the closest any token comes to a bound).",
        "",
    ]
    for split in ("tau_h", "median"):
        s = r["gradnorm"][split]
        title = f"τ_h = {sp['tau_h']:.4f}" if split == "tau_h" else f"median H = {sp['median']:.2e}"
        lines += [
            f"### H split: {title}" + (" (primary)" if split == "tau_h" else " (sensitivity)"),
            "",
            "| quadrant | tokens | completions | mean ‖∂ℓ/∂z‖ / \\|A\\| | median ‖∂ℓ/∂z‖ / \\|A\\| | mean ‖∂ℓ/∂z‖ (raw) | "
            "median ‖∂ℓ/∂z‖ (raw) |",
            "|---|---|---|---|---|---|---|",
        ]
        for k, (cn, cr) in enumerate(zip(s["normalized"]["quadrants"], s["raw"]["quadrants"], strict=True)):
            lines.append(
                f"| {QUADRANTS[k]} | {cn['count']} | {cn['completions']} | {_ci(cn, 'mean')} | {_ci(cn, 'median')} | "
                f"{_ci(cr, 'mean')} | {_ci(cr, 'median')} |"
            )
        for kind in ("normalized", "raw"):
            rm, rmed = s[kind]["ratio_mean"], s[kind]["ratio_median"]
            lines.append("")
            lines.append(
                f"Ratio low-p/low-H to high-p/high-H ({kind}): mean {rm['point']:.3f} [{rm['ci'][0]:.3f}, "
                f"{rm['ci'][1]:.3f}], median {rmed['point']:.3f} [{rmed['ci'][0]:.3f}, {rmed['ci'][1]:.3f}] "
                f"(paper, early version, Qwen3-8B: ~{PAPER_RATIO:.3f}; resamples without a token in one of the two "
                f"quadrants dropped: {rm['dropped_resamples']})."
            )
        lines.append("")
    lines += [f"![gradient norm]({figures['gradnorm'].name})", "", "## Claim 2: entropy change (Lemma 3.2)", ""]
    lines += [
        f"Logit view: one gradient step on the token's own loss -A log π_a in logit space, z <- z + η A (e_a - π), "
        f"η = {r['logit_step']:g}; exact ΔH (float64 softmax) against Lemma 3.2's first order "
        "η A [Σ π² (log π + H) - p (log p + H)]. Counts per quadrant (primary split).",
        "",
        f"| quadrant | tokens | exact ΔH > 0 | first order ΔH > 0 | signs agree | p < e^(-H) | median rel. error of "
        f"first order | median ΔH / A at η = {r['logit_step']:g} (nats) | η = 1: exact ΔH > 0 | η = 1: signs agree |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k, c in enumerate(r["entropy"]["tau_h"]):
        lines.append(
            f"| {QUADRANTS[k]} | {c['count']} | {c['exact_positive']} | {c['first_positive']} | {c['sign_agree']} | "
            f"{c['p_below_exp_minus_h']} | {c['rel_error_median']:.1e} | {c['dh_per_step_median']:.2e} | "
            f"{c['unit_exact_positive']} | {c['unit_sign_agree']} |"
        )
    lines += ["", "Same, median-entropy split:", "", "| quadrant | tokens | exact ΔH > 0 | signs agree | p < e^(-H) |",
              "|---|---|---|---|---|"]  # fmt: skip
    for k, c in enumerate(r["entropy"]["median"]):
        lines.append(
            f"| {QUADRANTS[k]} | {c['count']} | {c['exact_positive']} | {c['sign_agree']} | "
            f"{c['p_below_exp_minus_h']} |"
        )
    ps = r["param_steps"]
    lines += [
        "",
        f"A real parameter step: {r['param_tokens']} seeded tokens per quadrant (primary split; fewer where the "
        f"quadrant has fewer), plain SGD on that one token's loss -A log π_a at lr {', '.join(map(str, r['lrs']))}, "
        "the entropy at the same position from a fresh forward of the same prefix; parameters restored exactly after "
        "each. 'Logit view' is the first-order prediction above (its sign is the Lemma's); 'linearized' is "
        "∇_z H · Δz_real from the actual logit change.",
        "",
        "| lr | quadrant | tokens | real ΔH > 0 | sign = logit view | Pearson / Spearman (real vs logit view) | "
        "sign = linearized | median cos(Δz_real, A(e_a - π)): plain / π-weighted | median real ΔH (nats) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for lr in r["lrs"]:
        per = ps[str(lr)]
        for k, c in enumerate([*per["quadrants"], per["all"]]):
            name = QUADRANTS[k] if k < 4 else "all"
            cor = c["correlation"]
            lines.append(
                f"| {lr:g} | {name} | {c['count']} | {c['real_positive']} | {c['sign_agree']} | "
                f"{cor['pearson']:.2f} / {cor['spearman']:.2f} | {c['linear_sign_agree']} | {c['cosine_median']:.2f} / "
                f"{c['cosine_fisher_median']:.2f} | "
                f"{c['real_dh_median']:.2e} |"
            )
    if "lr_ratio" in ps:
        lr_ratio = ps["lr_ratio"]
        lines += [
            "",
            f"Linear regime check: real ΔH at lr {lr_ratio['lrs'][1]:g} / at lr {lr_ratio['lrs'][0]:g}: median "
            f"{lr_ratio['dh_ratio_median']:.3f} (10-90 %: {lr_ratio['dh_ratio_p10_p90'][0]:.3f}-"
            f"{lr_ratio['dh_ratio_p10_p90'][1]:.3f}; {lr_ratio['lrs'][1] / lr_ratio['lrs'][0]:g} if linear).",
        ]
    lines += ["", f"![entropy change]({figures['entropy'].name})", ""]
    lines += r.get("notes", [])
    m = r["machine"]
    lines += [
        "",
        "## Provenance",
        "",
        f"- Date {r['date']}; started {r['started']}; phases (wall s): {json.dumps(r['phase_seconds'])}",
        f"- Machine: {m['cpu_model']}, {m['cores_available']} cores available, torch threads {m['torch_threads']}, "
        f"load average at start {', '.join(f'{x:.2f}' for x in m['load_average_start'])}, at end "
        f"{', '.join(f'{x:.2f}' for x in r['load_average_end'])} (shared machine: times are indicative)",
        f"- Versions: {json.dumps(r['versions'])}",
        f"- Raw numbers: `{out.with_suffix('.json').name}`; every pooled token: `{r['tokens_file']}` (not committed)",
        "",
    ]
    out.write_text("\n".join(lines))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--recipe", default=RECIPE, help="the training recipe the rollouts follow")
    parser.add_argument("--model", default=MODEL, help="model folder or builtin: name")
    parser.add_argument("--tokens", type=int, default=50_000, help="completion tokens to sample (all advantages)")
    parser.add_argument("--logit-step", type=float, default=0.01, help="η of the logit-space step (Claim 2)")
    parser.add_argument("--param-tokens", type=int, default=12, help="tokens per quadrant for the real SGD step")
    parser.add_argument(
        "--param-lr",
        type=float,
        nargs="+",
        default=[5e-6, 1e-5],
        help="SGD learning rates (the first two: linearity check)",
    )
    parser.add_argument("--bootstrap", type=int, default=2000, help="cluster-bootstrap resamples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="report path (default benchmarks/results/<date>-mechanism.md)")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    started, wall0, cpu0 = datetime.datetime.now(), time.perf_counter(), time.process_time()
    date = str(datetime.date.today())
    out = Path(args.out) if args.out else RESULTS_DIR / f"{date}-mechanism.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/mechanism.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    machine = machine_info()
    phases: dict[str, float] = {}

    tick = time.perf_counter()
    trainer, _ = build_trainer(args.recipe, ["--model_name_or_path", args.model], workdir=tempfile.mkdtemp())
    vocab_size = trainer.model.config.vocab_size
    tau_p, q = trainer.args.s2t_prob_threshold, trainer.args.s2t_entropy_quantile
    phases["build"] = time.perf_counter() - tick

    tick = time.perf_counter()
    print(f"sampling {args.tokens} tokens ...")
    sample = sample_with_prompts(trainer, args.tokens, args.seed)
    phases["sample"] = time.perf_counter() - tick

    tick = time.perf_counter()
    table = token_table(trainer, sample, args.logit_step)
    add_gradient_columns(table, vocab_size)
    phases["full_logits"] = time.perf_counter() - tick
    if not len(table["prob"]):
        raise SystemExit("no positive-advantage token was sampled: raise --tokens")

    tick = time.perf_counter()
    split = quadrants(table, tau_p, q)
    a_sq = table["advantage"] ** 2
    excess = np.maximum(table["lower"] - table["grad_sq"], table["grad_sq"] - table["upper"]) / a_sq
    inside = int((excess <= BOUND_TOL).sum())
    norm = np.sqrt(table["grad_sq"])
    gradnorm = {
        name: {
            kind: bootstrap_quadrants(values, split[name], table["completion"], args.bootstrap, args.seed)
            for kind, values in (("normalized", norm / np.abs(table["advantage"])), ("raw", norm))
        }
        for name in ("tau_h", "median")
    }
    entropy = {name: entropy_cells(table, split[name]) for name in ("tau_h", "median")}
    phases["statistics"] = time.perf_counter() - tick

    tick = time.perf_counter()
    records = parameter_steps(trainer, sample, table, split["tau_h"], args.param_tokens, args.param_lr, args.seed)
    param_summary = summarize_parameter_steps(records, args.param_lr)
    phases["parameter_steps"] = time.perf_counter() - tick

    rewards = trainer._metrics["train"].get("reward", [])
    tokenizer = trainer.processing_class
    low_p = np.flatnonzero(table["prob"] < tau_p)
    high_p_sample = np.random.default_rng(args.seed).choice(
        np.flatnonzero(table["prob"] >= tau_p), size=min(1000, int((table["prob"] >= tau_p).sum())), replace=False
    )
    fields = ("completion", "position", "token_id", "advantage", "prob", "entropy", "collision", "grad_sq", "lower",
              "upper", "dh_exact", "dh_first", "dh_exact_unit", "dh_first_unit")  # fmt: skip

    def token_record(i: int) -> dict[str, Any]:
        rec = {f: table[f][i].item() for f in fields}
        rec["quadrant_tau_h"], rec["quadrant_median"] = int(split["tau_h"][i]), int(split["median"][i])
        rec["token"] = tokenizer.decode([int(table["token_id"][i])])
        completion = sample["completion_ids"][int(table["completion"][i])]
        t = int(table["position"][i])
        rec["context"] = (
            tokenizer.decode(completion[max(0, t - 10) : t]) + "⟦" + rec["token"] + "⟧" + tokenizer.decode(
                completion[t + 1 : t + 6]
            )
        )  # fmt: skip
        return rec

    tokens_file = Path("outputs") / f"{out.stem}-tokens.npz"
    (script_env.REPO / tokens_file).parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(script_env.REPO / tokens_file, quadrant_tau_h=split["tau_h"], quadrant_median=split["median"],
                        **table)  # fmt: skip
    for r in records:
        r["token"] = tokenizer.decode([r["token_id"]])
    result = {
        "date": date,
        "started": started.isoformat(timespec="seconds"),
        "command": command,
        "model": args.model,
        "recipe": args.recipe,
        "vocab_size": vocab_size,
        "temperature": trainer.args.temperature,
        "tau_p": tau_p,
        "q": q,
        "logit_step": args.logit_step,
        "lrs": args.param_lr,
        "param_tokens": args.param_tokens,
        "bootstrap": args.bootstrap,
        "seed": args.seed,
        "pool": {
            "completions": len(sample["advantage"]),
            "tokens": sum(len(c) for c in sample["completion_ids"]),
            "reward_mean": sum(rewards) / len(rewards) if rewards else math.nan,
            "positive_completions": sum(a > 0 for a in sample["advantage"]),
            "positive_tokens": len(table["prob"]),
            "low_p_tokens": len(low_p),
            "check_logp_max_abs": float(np.abs(np.log(table["prob"]) - table["trainer_logp"]).max()),
            "check_entropy_max_abs": float(np.abs(table["entropy"] - table["trainer_entropy"]).max()),
        },
        "splits": split["splits"],
        "candidates": split["candidates"],
        "silenced": split["silenced"],
        "inside": inside,
        "inside_share": inside / len(excess),
        "inside_strict": int((excess <= 0).sum()),
        "max_violation": float(excess.max()),
        "gradnorm": gradnorm,
        "entropy": entropy,
        "param_steps": param_summary,
        "param_step_records": records,
        "low_p_records": [token_record(int(i)) for i in low_p],
        "high_p_sample_records": [token_record(int(i)) for i in high_p_sample],
        "tokens_file": str(tokens_file),
        "phase_seconds": {k: round(v, 1) for k, v in phases.items()},
        "machine": machine,
        "versions": versions(),
    }
    figures = {
        "gradnorm": out.with_name(out.stem + "-gradnorm.png"),
        "entropy": out.with_name(out.stem + "-entropy.png"),
    }
    summary = {"inside_share": result["inside_share"], "normalized": gradnorm["tau_h"]["normalized"]}
    plot_gradnorm(table, split["tau_h"], f"τ_h = {split['splits']['tau_h']:.3f}", tau_p, vocab_size, summary,
                  figures["gradnorm"])  # fmt: skip
    plot_entropy(table, split["tau_h"], args.logit_step, records, args.param_lr[0], figures["entropy"])
    result["wall_seconds"] = time.perf_counter() - wall0
    result["cpu_seconds"] = time.process_time() - cpu0
    result["load_average_end"] = os.getloadavg()
    out.with_suffix(".json").write_text(json.dumps(result, indent=1, ensure_ascii=False, default=float) + "\n")
    write_report(out, result, figures)
    print(out.read_text())


if __name__ == "__main__":
    main()
