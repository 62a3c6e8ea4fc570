"""The stress experiment's report (`stress.py`): per-arm summary with paired tests against `off`, per-seed values,
the mask check at injected positions, the `}` probe and the token attribution, as Markdown."""

from __future__ import annotations

import datetime
import math
import statistics
from collections import Counter, defaultdict
from pathlib import Path

from stress_stats import paired_permutation_test, sign_test
from stress_trainer import ARMS, KINDS, RECIPE


METRICS = (
    ("accuracy", "accuracy %", 100.0, 1),
    ("junk_rate", "post-answer junk %", 100.0, 2),
    ("brace_junk_rate", "junk starting with `}` %", 100.0, 2),
    ("post_box_entropy", "entropy after box (nats)", 1.0, 3),
    ("silenced_ratio_mean", "silenced ratio %", 100.0, 3),
    ("probe_close_end", "probe p(`}`) x1e3 at the end", 1000.0, 2),
)


def _fmt(values: list[float], scale: float, digits: int) -> str:
    values = [v * scale for v in values if v is not None and not math.isnan(v)]
    if not values:
        return "-"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {std:.{digits}f}"


def summary_table(runs: list[dict], arms: list[str]) -> str:
    by = defaultdict(dict)
    for r in runs:
        by[r["arm"]][r["seed"]] = r
    lines = ["| arm | seeds | " + " | ".join(label for _, label, _, _ in METRICS) + " |"]
    lines.append("|---|---|" + "---|" * len(METRICS))
    for arm in arms:
        if arm not in by:
            continue
        seeds = sorted(by[arm])
        cells = [_fmt([by[arm][s][key] for s in seeds], scale, d) for key, _, scale, d in METRICS]
        lines.append(f"| {arm} | {len(seeds)} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Paired against `off` over the common seeds (difference arm - off; exact two-sided sign test and")
    lines.append("sign-flip permutation test of the mean difference):")
    lines.append("")
    lines.append("| arm | metric | n | mean diff | arm > off | sign p | permutation p |")
    lines.append("|---|---|---|---|---|---|---|")
    for arm in arms:
        if arm == "off" or arm not in by or "off" not in by:
            continue
        common = sorted(set(by[arm]) & set(by["off"]))
        for key, label, scale, digits in METRICS:
            if key == "silenced_ratio_mean":
                continue
            diffs = [(by[arm][s][key] - by["off"][s][key]) * scale for s in common]
            diffs = [d for d in diffs if not math.isnan(d)]
            if not diffs:
                continue
            lines.append(
                f"| {arm} | {label} | {len(diffs)} | {statistics.mean(diffs):+.{digits}f} | "
                f"{sum(d > 0 for d in diffs)}/{len(diffs)} | {sign_test(diffs):.3f} | "
                f"{paired_permutation_test(diffs):.3f} |"
            )
    return "\n".join(lines)


def per_seed_table(runs: list[dict]) -> str:
    lines = [
        "| arm | seed | accuracy % | junk % | of which `}...` % | entropy after box | silenced % | p(`}`) probe end "
        "| most common junk |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(runs, key=lambda r: (r["arm"], r["seed"])):
        junk = ", ".join(f"`{t!r}` x{n}" for t, n in r["junk_examples"][:2])
        brace = f"{100 * r['brace_junk_rate']:.2f}" if "brace_junk_rate" in r else "-"
        lines.append(
            f"| {r['arm']} | {r['seed']} | {100 * r['accuracy']:.1f} | {100 * r['junk_rate']:.2f} | {brace} | "
            f"{r['post_box_entropy']:.3f} | {100 * r['silenced_ratio_mean']:.3f} | {r['probe'][-1]['p_close']:.2e} | "
            f"{junk} |"
        )
    return "\n".join(lines)


def mask_table(runs: list[dict]) -> str:
    """Ground truth: the trainer's mask against the rule recomputed, at injected and policy-sampled positions."""
    lines = [
        "| arm | where | loss tokens | A > 0 | candidates | silenced | candidate mismatches | silenced mismatches |"
    ]
    lines.append("|---|---|---|---|---|---|---|---|")
    totals = defaultdict(Counter)
    for r in runs:
        totals[r["arm"]].update(r["mask_stats"])
    for arm, s in totals.items():
        for where in ("injected", "policy"):
            lines.append(
                f"| {arm} | {where} | {s[f'{where}/tokens']} | {s[f'{where}/positive']} | {s[f'{where}/candidates']} | "
                f"{s[f'{where}/silenced']} | {s[f'{where}/candidate_mismatch']} | {s[f'{where}/silenced_mismatch']} |"
            )
    return "\n".join(lines)


def bracket_table(runs: list[dict]) -> str:
    lines = ["| arm | `}` after the box drawn from | A > 0 (silenced) | A < 0 | A = 0 |", "|---|---|---|---|---|"]
    totals = defaultdict(Counter)
    for r in runs:
        totals[r["arm"]].update(r["bracket_counts"])
    for arm, c in totals.items():
        for name, label in (("junk", "uniform (injected)"), ("policy", "the policy")):
            lines.append(
                f"| {arm} | {label} | {c[f'{name}/pos']} ({c[f'{name}/pos/silenced']}) | {c[f'{name}/neg']} | "
                f"{c[f'{name}/zero']} |"
            )
    return "\n".join(lines)


def attribution_table(runs: list[dict]) -> str:
    rows = [r for r in runs if r["attribution_sums"]]
    if not rows:
        return ""
    keys = [f"{k}/{s}" for k in KINDS for s in ("pos", "neg")]
    keys += [f"{k}/{s}/close" for k in KINDS[1:-1] for s in ("pos", "neg")]
    lines = ["| arm | seed | " + " | ".join(keys) + " | sum | probe log p(`}`) start -> end |"]
    lines.append("|---|---|" + "---|" * (len(keys) + 2))
    for r in rows:
        a = r["attribution_sums"]
        start, end = r["probe"][0]["p_close"], r["probe"][-1]["p_close"]
        lines.append(
            f"| {r['arm']} | {r['seed']} | "
            + " | ".join(f"{a.get(k, 0.0):+.2f}" for k in keys)
            + f" | {sum(a.get(k, 0.0) for k in keys[: 2 * len(KINDS)]):+.2f} | {math.log(start):.2f} -> {math.log(end):.2f} |"
        )
    return "\n".join(lines)


def candidate_attribution_table(runs: list[dict]) -> str:
    """The attribution carried by S2T candidates (A > 0, p < tau_p), split at the q-quantile of their entropy."""
    rows = [r for r in runs if r["attribution_sums"]]
    if not rows:
        return ""
    keys = [f"{c}/{k}" for c in ("cand_lowH", "cand_highH") for k in KINDS]
    lines = ["| arm | seed | " + " | ".join(keys) + " | of which `}` tokens (lowH / highH) |"]
    lines.append("|---|---|" + "---|" * (len(keys) + 1))
    for r in rows:
        a = r["attribution_sums"]
        close = [sum(a.get(f"{c}/{k}/close", 0.0) for k in KINDS) for c in ("cand_lowH", "cand_highH")]
        lines.append(
            f"| {r['arm']} | {r['seed']} | "
            + " | ".join(f"{a.get(k, 0.0):+.3f}" for k in keys)
            + f" | {close[0]:+.3f} / {close[1]:+.3f} |"
        )
    return "\n".join(lines)


def probe_table(runs: list[dict]) -> str:
    """Mean probe p(`}`) per arm at a few steps (over seeds)."""
    steps_seen = sorted({h["step"] for r in runs for h in r["probe"]})
    if not steps_seen:
        return ""
    marks = sorted({steps_seen[0], *[s for s in steps_seen if s % 100 == 0], steps_seen[-1]})
    lines = ["| arm | " + " | ".join(f"step {s}" for s in marks) + " |", "|---|" + "---|" * len(marks)]
    by_arm = defaultdict(list)
    for r in runs:
        by_arm[r["arm"]].append({h["step"]: h["p_close"] for h in r["probe"]})
    for arm, histories in by_arm.items():
        cells = []
        for s in marks:
            vals = [h[s] for h in histories if s in h]
            cells.append(f"{statistics.mean(vals):.2e}" if vals else "-")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fill_brace_rate(run: dict) -> None:
    """Runs measured before `brace_junk_rate` existed: count it from the 10 most common junk texts (a lower bound).
    Also sets `probe_close_end`, the probe's last p(`}`)."""
    run["probe_close_end"] = run["probe"][-1]["p_close"]
    if "brace_junk_rate" not in run:
        count = sum(n for text, n in run["junk_examples"] if text.lstrip().startswith("}"))
        run["brace_junk_rate"] = count / run["num_completions"]
        run["brace_junk_rate_from_top10"] = True


def write_report(path: Path, args, runs: list[dict], command: str, start: dict | None = None) -> None:
    for run in runs:
        fill_brace_rate(run)
    arms = [arm for arm in ARMS if any(r["arm"] == arm for r in runs)]
    start_line = (
        ""
        if start is None
        else f"SFT start (before RL, same measurement, seed 1000): accuracy {100 * start['accuracy']:.1f} %, junk "
        f"{100 * start['junk_rate']:.2f} % (starting with `}}`: {100 * start.get('brace_junk_rate', float('nan')):.2f} %), "
        f"entropy after box {start['post_box_entropy']:.3f} nats."
    )
    text = [
        f"# Stress experiment, design `{args.design}` (eps {args.eps}), {datetime.date.today().isoformat()}",
        "",
        "Command (from the repository root; several when the sweep was run in parts and merged with `--merge`):",
        "",
        *[f"    {c}" for c in command.split("\n")],
        "",
        f"Demo recipe `{RECIPE}` on STAPOTrainer, {args.steps} steps, tau_h per optimizer update;"
        f" noise in rollouts only; held-out measurement without noise: {args.eval_problems} test problems x "
        f"{args.eval_samples} samples, T = 1, 48 new tokens. Junk = any non-blank text after the last closed box.",
        "Runs marked in the JSON with `brace_junk_rate_from_top10` counted the `}`-junk from their 10 most common junk",
        "texts only (a lower bound).",
        "",
        start_line,
        "",
        "## Per arm (mean ± std over seeds)",
        "",
        summary_table(runs, arms),
        "",
        "## Per seed",
        "",
        per_seed_table(runs),
        "",
        "## The mask at the injected positions (ground truth), all runs summed",
        "",
        "Mismatches: the trainer's mask against the rule recomputed from its own inputs (p in float64, realised tau_h).",
        "",
        mask_table(runs),
        "",
        "## The `}` tokens sampled after a closed box in training, all runs summed",
        "",
        bracket_table(runs),
        "",
        "## Probe: mean p(`}` | prompt + gold completion ending in `\\boxed{sum}`), 32 held-out problems",
        "",
        probe_table(runs),
        "",
    ]
    table = attribution_table(runs)
    if table:
        text += [
            "## Attribution: first-order change of the probe's mean log p(`}`), summed over training, by token kind",
            "",
            "answer = tokens up to the box; junk1 / pi1 = injected / policy-sampled non-EOS token at the first position",
            "after the box, junk / pi = the same at later positions; eos = policy-sampled EOS after the box.",
            "pos/neg = advantage sign. Linearised through Adam's v (no momentum, no clipping).",
            "",
            table,
            "",
            "Of that, the share carried by S2T candidates (A > 0, p < tau_p; the classes are computed in every arm):",
            "lowH = entropy below the q-quantile of the batch's candidates (what `low_entropy` silences), highH = the",
            "rest. In the `off` arm these are the updates that `low_entropy` would have removed / kept.",
            "",
            candidate_attribution_table(runs),
            "",
        ]
    path.write_text("\n".join(text))
