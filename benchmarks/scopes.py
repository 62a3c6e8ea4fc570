#!/usr/bin/env python
"""Which tokens the S2T scopes and policies silence on the demo, update by update (issue 10's measurement).

    .venv/bin/python benchmarks/scopes.py                       # 48 optimizer updates, tau_p 0.05, ~1 min
    .venv/bin/python benchmarks/scopes.py --prob-threshold 0.002 --steps 200

One demo run (`recipes/demo/stapo.yaml`: GA 1, `steps_per_generation` 4, so 4 optimizer updates per rollout batch)
with the default scope `optimizer_step` and policy `rollout`. At every update, beside the mask the run trains with,
two counterfactual masks are built on the same rows without touching the run:

- `current`: p and H recomputed under the weights at the start of the update (what `s2t_policy: current` uses);
- `generation_batch`: tau_h over the whole rollout batch (all 4 updates' candidates, rollout policy).

The table gives tau_h per update for the three, the candidates and silenced counts, and how many silencing decisions
(tokens silenced by one mask and kept by the other) differ from the run's own mask. tau_p defaults to 0.05 (as the
issue's measurement) so that every update has candidates: at the paper's 0.002 the demo model has about one
candidate per rollout batch. Writes `benchmarks/results/<date>-scopes.md`.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import tempfile
from pathlib import Path


os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402 (after the environment variables above)

from stapo_trl.core.s2t import s2t_mask  # noqa: E402


REPO = Path(__file__).resolve().parent.parent
STAPO_RECIPE = str(REPO / "recipes" / "demo" / "stapo.yaml")


def _mask(trainer, logps, entropies, advantages, loss_mask):
    """The trainer's S2T rule (tau_p, q, mode) on one process, without logging."""
    return s2t_mask(
        logps,
        entropies,
        advantages,
        loss_mask,
        prob_threshold=trainer.args.s2t_prob_threshold,
        entropy_quantile=trainer.args.s2t_entropy_quantile,
        mode=trainer.args.s2t_mode,
    )


def measure(steps: int, prob_threshold: float, seed: int) -> list[dict]:
    """Train `steps` updates of the demo and return one row per update (see the module docstring)."""
    from harness import build_trainer

    trainer, _ = build_trainer(
        STAPO_RECIPE,
        ["--max_steps", str(steps), "--seed", str(seed), "--s2t_prob_threshold", str(prob_threshold)],
        workdir=tempfile.mkdtemp(prefix="scopes-"),
    )
    rows: list[dict] = []
    rollout: list[dict] = []  # the updates of the current rollout batch: (micro-batches, row index)
    original = trainer._apply_s2t_to_micro_batches

    def cat(batches, key):
        return torch.cat([b[key] for b in batches])

    def record(micro_batches):
        result = original(micro_batches)  # the run's own mask (optimizer_step, rollout policy)
        loss_mask = cat(micro_batches, "s2t_loss_mask")
        advantages = cat(micro_batches, "advantages")
        with torch.no_grad():
            current = [trainer._policy_logps_and_entropies(b) for b in micro_batches]
        current = _mask(
            trainer, torch.cat([c[0] for c in current]), torch.cat([c[1] for c in current]), advantages, loss_mask
        )
        row = dict(
            update=len(rows),
            candidates=result.num_candidates,
            silenced=result.num_silenced,
            tau_optimizer_step=result.entropy_threshold,
            tau_current=current.entropy_threshold,
            silenced_current=current.num_silenced,
            differ_current=int((current.silenced != result.silenced).sum()),
        )
        rows.append(row)
        rollout.append({"batches": list(micro_batches), "silenced": result.silenced, "row": row})
        if len(rollout) == trainer.args.steps_per_generation // trainer.args.gradient_accumulation_steps:
            batches = [b for update in rollout for b in update["batches"]]
            whole = _mask(
                trainer,
                cat(batches, "s2t_per_token_logps"),
                cat(batches, "s2t_entropies"),
                cat(batches, "advantages"),
                cat(batches, "s2t_loss_mask"),
            )
            per_update = whole.silenced.split([u["silenced"].size(0) for u in rollout])
            for update, silenced in zip(rollout, per_update, strict=True):
                update["row"]["tau_generation_batch"] = whole.entropy_threshold
                update["row"]["silenced_generation_batch"] = int(silenced.sum())
                update["row"]["differ_generation_batch"] = int((silenced != update["silenced"]).sum())
            rollout.clear()
        return result

    trainer._apply_s2t_to_micro_batches = record
    trainer.train()
    return rows


def table(rows: list[dict], prob_threshold: float, steps: int, seed: int) -> str:
    def fmt(value):
        return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}"

    lines = [
        f"# S2T scopes and policies on the demo ({datetime.date.today()})",
        "",
        f"`benchmarks/scopes.py --steps {steps} --prob-threshold {prob_threshold} --seed {seed}`: "
        "`recipes/demo/stapo.yaml` (GA 1, steps_per_generation 4: 4 updates per rollout batch of 64 completions, 16 per "
        "update), tau_p overridden as shown, q 0.75. The run trains with `optimizer_step` / `rollout`; the other two "
        "masks are counterfactuals on the same rows and weights. tau_h in nats ('-': no candidate).",
        "",
        "| update | candidates | tau_h optimizer_step (rollout p, H) | tau_h optimizer_step (current p, H) | "
        "tau_h generation_batch | silenced: run / current / generation_batch | decisions differing from the run: "
        "current / generation_batch |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['update']} | {r['candidates']} | {fmt(r['tau_optimizer_step'])} | {fmt(r['tau_current'])} | "
            f"{fmt(r.get('tau_generation_batch'))} | {r['silenced']} / {r['silenced_current']} / "
            f"{r.get('silenced_generation_batch', '-')} | {r['differ_current']} / {r.get('differ_generation_batch', '-')} |"
        )
    complete = [r for r in rows if "differ_generation_batch" in r]
    taus = [r["tau_optimizer_step"] for r in rows if not math.isnan(r["tau_optimizer_step"])]
    total_silenced = sum(r["silenced"] for r in complete)
    lines += [
        "",
        f"Over {len(complete)} updates ({len(complete) // 4} rollout batches): {sum(r['candidates'] for r in complete)} "
        f"candidates, {total_silenced} silenced by the run's per-update mask; "
        f"{sum(r['differ_generation_batch'] for r in complete)} decisions differ with tau_h over the rollout batch "
        f"(`generation_batch`), {sum(r['differ_current'] for r in complete)} with p and H under the current weights. "
        + (f"Per-update tau_h ranges {min(taus):.2f}-{max(taus):.2f} nats." if taus else ""),
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=48, help="optimizer updates (4 per rollout batch)")
    parser.add_argument("--prob-threshold", type=float, default=0.05, help="tau_p for the run (paper: 0.002)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="Markdown file (default: results/<date>-scopes.md)")
    args = parser.parse_args(argv)
    rows = measure(args.steps, args.prob_threshold, args.seed)
    text = table(rows, args.prob_threshold, args.steps, args.seed)
    from harness import write_result

    write_result(text, "scopes", args.out)


if __name__ == "__main__":
    main()
