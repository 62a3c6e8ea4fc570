"""Section 2 (`mask`): `s2t_mask` alone against a naive `torch.quantile` implementation, 1M to 64M tokens."""

from __future__ import annotations

import functools
import statistics
import time
from typing import Any

import torch
from harness import QUANTILE_LIMIT, fmt_bytes, torch_cpu_allocations


# ---------------------------------------------------------------------------------------------------------------
# Section 2: s2t_mask alone, against a naive torch.quantile implementation
# ---------------------------------------------------------------------------------------------------------------


def naive_s2t_keep(per_token_logps, entropies, advantages, loss_mask, prob_threshold=0.002, entropy_quantile=0.75):
    """The obvious implementation: a float probability copy and `torch.quantile` (raises above 2**24 candidates)."""
    with torch.no_grad():
        probs = per_token_logps.exp()  # (B, T) float copy
        candidate = loss_mask.bool() & (advantages.view(-1, 1) > 0) & (probs < prob_threshold)  # (B, T)
        candidate_entropies = entropies[candidate]
        if candidate_entropies.numel() == 0:
            return torch.ones_like(candidate)
        tau_h = torch.quantile(candidate_entropies, entropy_quantile)
        return ~(candidate & (entropies < tau_h))


def make_mask_inputs(num_tokens: int, candidate_fraction: float, seq_len: int = 4096, seed: int = 0):
    """Synthetic (B, T) inputs with `candidate_fraction` of all tokens being S2T candidates.

    Half the rows have a positive advantage; in every row a random 2 x `candidate_fraction` of positions get a
    log-probability below log(0.002), so candidates = positive rows x low-probability positions. Entropies are
    uniform in [0, 3) nats. The loss mask is a bool tensor (TRL's int64 mask would add one bool conversion).
    """
    batch = num_tokens // seq_len
    generator = torch.Generator().manual_seed(seed)
    per_token_logps = torch.rand(batch, seq_len, generator=generator).mul_(-3.0)  # p in (0.05, 1]
    low = torch.rand(batch, seq_len, generator=generator) < 2 * candidate_fraction
    per_token_logps[low] -= 7.0  # p < e^-7 < 0.002
    del low
    entropies = torch.rand(batch, seq_len, generator=generator).mul_(3.0)
    advantages = torch.where(torch.arange(batch) % 2 == 0, 1.0, -1.0)  # (B,)
    loss_mask = torch.ones(batch, seq_len, dtype=torch.bool)
    return per_token_logps, entropies, advantages, loss_mask


def _timed(fn, reps: int) -> tuple[list[float], Any]:
    times, result = [], None
    for _ in range(reps):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times, result


def run_mask(args) -> dict:
    from stapo_trl.core.s2t import linear_quantile, s2t_mask

    cases = [(n, f) for n in args.mask_sizes for f in args.mask_fractions]
    cases.append((args.mask_sizes[-1], args.mask_overflow_fraction))  # past 2**24 candidates
    rows = []
    for num_tokens, fraction in cases:
        inputs = make_mask_inputs(num_tokens, fraction)
        input_bytes = sum(t.numel() * t.element_size() for t in inputs)
        stapo_fn = functools.partial(s2t_mask, *inputs)
        naive_fn = functools.partial(naive_s2t_keep, *inputs)
        times, result = _timed(stapo_fn, args.mask_reps)
        _, peak, largest = torch_cpu_allocations(stapo_fn)
        row = dict(
            num_tokens=inputs[0].numel(),
            candidate_fraction=fraction,
            num_candidates=result.num_candidates,
            input_bytes=input_bytes,
            s2t_seconds=times,
            s2t_peak_bytes=peak,
            s2t_largest_bytes=largest,
        )
        try:
            naive_times, naive_keep = _timed(naive_fn, args.mask_reps)
            _, naive_peak, naive_largest = torch_cpu_allocations(naive_fn)
            row.update(
                naive_seconds=naive_times,
                naive_peak_bytes=naive_peak,
                naive_largest_bytes=naive_largest,
                naive_status="ok",
                same_keep=bool(torch.equal(naive_keep, result.keep)),
            )
        except RuntimeError as e:
            row.update(naive_status=f"RuntimeError: {e}".splitlines()[0])
        rows.append(row)
        print(
            f"  mask {row['num_tokens'] / 1e6:5.1f}M tokens, {100 * fraction:g} % candidates: s2t "
            f"{statistics.median(times):.3f} s, naive {row['naive_status']}",
            flush=True,
        )
        del inputs, result, stapo_fn, naive_fn

    # Exactly where torch.quantile stops: 2**24 elements work, 2**24 + 1 raise; linear_quantile takes both.
    boundary = []
    for n in (QUANTILE_LIMIT, QUANTILE_LIMIT + 1):
        values = torch.rand(n, generator=torch.Generator().manual_seed(0))
        start = time.perf_counter()
        try:
            torch.quantile(values, 0.75)
            status = f"ok ({time.perf_counter() - start:.2f} s)"
        except RuntimeError as e:
            status = f"RuntimeError: {e}".splitlines()[0]
        start = time.perf_counter()
        linear_quantile(values, 0.75)
        boundary.append(dict(n=n, torch_quantile=status, linear_quantile_seconds=time.perf_counter() - start))
        del values
    return dict(rows=rows, boundary=boundary, reps=args.mask_reps)


def mask_table(result: dict) -> str:
    lines = [
        "| tokens | candidates | s2t_mask time, median | ns / token | s2t peak alloc (B / token) | s2t largest "
        "alloc (B / token) | naive time | naive peak alloc (B / token) | naive largest alloc (B / token) | "
        "same keep mask |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        n = r["num_tokens"]
        s2t_time = statistics.median(r["s2t_seconds"])
        if r["naive_status"] == "ok":
            naive = (
                f"{statistics.median(r['naive_seconds']):.3f} s",
                f"{fmt_bytes(r['naive_peak_bytes'])} ({r['naive_peak_bytes'] / n:.2f})",
                f"{fmt_bytes(r['naive_largest_bytes'])} ({r['naive_largest_bytes'] / n:.2f})",
                "yes" if r["same_keep"] else "NO",
            )
        else:
            naive = (f"fails: {r['naive_status']}", "-", "-", "-")
        past_limit = " **> 2^24**" if r["num_candidates"] > QUANTILE_LIMIT else ""
        stapo = (
            f"{n / 2**20:g} Mi ({n:,})",
            f"{100 * r['candidate_fraction']:g} % ({r['num_candidates']:,}){past_limit}",
            f"{s2t_time:.3f} s",
            f"{1e9 * s2t_time / n:.1f}",
            f"{fmt_bytes(r['s2t_peak_bytes'])} ({r['s2t_peak_bytes'] / n:.2f})",
            f"{fmt_bytes(r['s2t_largest_bytes'])} ({r['s2t_largest_bytes'] / n:.2f})",
        )
        lines.append("| " + " | ".join(stapo + naive) + " |")
    boundary = "; ".join(
        f"n = {b['n']:,}: torch.quantile {b['torch_quantile']}, linear_quantile {b['linear_quantile_seconds']:.2f} s"
        for b in result["boundary"]
    )
    return "\n".join(lines) + f"\n\nQuantile boundary (1-D tensors): {boundary}."


def section_text(args, r) -> str:
    """The Markdown section of the mask results."""
    return (
        "## 2. `s2t_mask` alone vs a naive `torch.quantile` implementation\n\n"
        "Synthetic float32 (B, 4096) log-probs and entropies, bool loss mask, (B,) advantages (half positive); "
        f"median of {r['reps']} calls, 1 torch thread. Memory: one profiled call; *peak alloc*: "
        "peak of live torch CPU allocations made inside the call (outputs included: `keep`, `candidate`, "
        "`silenced` are three bool (B, T) masks = 3 B/token); *largest alloc*: the biggest single allocation "
        "(1 B/token = a bool (B, T) mask, 4 B/token = a float32 (B, T) copy). The inputs are "
        "9 B/token (two float32 tensors and a bool mask). Naive: `p = logps.exp()` then "
        "`torch.quantile(entropies[candidate], q)`.\n\n" + mask_table(r)
    )
