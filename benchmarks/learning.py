"""Section 3 (`learning`): GRPO vs STAPO on the demo task over seeds, at the demo and a destabilising lr."""

from __future__ import annotations

import math
import os
import statistics
import time

from harness import GRPO_RECIPE, STAPO_RECIPE, build_trainer


# ---------------------------------------------------------------------------------------------------------------
# Section 3: learning on the demo task, GRPO vs STAPO
# ---------------------------------------------------------------------------------------------------------------


def _evaluate(trainer, run, args, seed: int) -> float:
    from stapo_trl.evaluation.generation import evaluate_avg_at_k

    problems = run.test_dataset.select(range(min(args.eval_problems, len(run.test_dataset))))
    result = evaluate_avg_at_k(
        trainer.model,
        trainer.processing_class,
        problems["prompt"],
        problems["solution"],
        k=args.eval_samples,
        temperature=1.0,
        top_p=1.0,
        max_new_tokens=trainer.args.max_completion_length,
        seed=seed,
    )
    return result[f"avg@{args.eval_samples}"]


def run_learning(args, workdir: str) -> dict:
    settings = [(args.demo_lr, args.learn_steps), (args.high_lr, args.high_lr_steps)]
    runs = []
    before = None
    for lr, steps in settings:
        for seed in args.seeds:
            for label, recipe in (("GRPO", GRPO_RECIPE), ("STAPO", STAPO_RECIPE)):
                overrides = ["--max_steps", str(steps), "--learning_rate", str(lr), "--seed", str(seed)]
                trainer, run = build_trainer(recipe, overrides, workdir=workdir)
                if before is None:
                    before = _evaluate(trainer, run, args, seed=0)
                start = time.perf_counter()
                trainer.train()
                wall = time.perf_counter() - start
                logs = [h for h in trainer.state.log_history if "entropy" in h and "step" in h]
                second_half = [h["entropy"] for h in logs if h["step"] > steps / 2]
                silenced = [h["s2t/silenced_ratio"] for h in logs if h.get("s2t/silenced_ratio") is not None]
                accuracy = _evaluate(trainer, run, args, seed=seed)
                runs.append(
                    dict(
                        label=label,
                        lr=lr,
                        steps=steps,
                        seed=seed,
                        accuracy_after=accuracy,
                        entropy_std_second_half=statistics.stdev(second_half)
                        if len(second_half) > 1
                        else float("nan"),
                        entropy_final=logs[-1]["entropy"] if logs else float("nan"),
                        reward_last_quarter=statistics.mean(
                            h["reward"] for h in logs if "reward" in h and h["step"] > 0.75 * steps
                        )
                        if any("reward" in h and h["step"] > 0.75 * steps for h in logs)
                        else float("nan"),
                        silenced_ratio_mean=statistics.mean(silenced) if silenced else None,
                        silenced_batches=sum(s > 0 for s in silenced) if silenced else None,
                        logged_batches=len(silenced) if silenced else None,
                        train_seconds=wall,
                    )
                )
                r = runs[-1]
                print(
                    f"  learning lr {lr:g} seed {seed} {label:<5}: avg@{args.eval_samples} {100 * accuracy:5.1f} %  "
                    f"entropy std {r['entropy_std_second_half']:.3f}  final entropy {r['entropy_final']:.3f}  "
                    f"({wall:.0f} s, load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
                del trainer
    return dict(runs=runs, accuracy_before=before, eval_problems=args.eval_problems, eval_samples=args.eval_samples)


def _mean_std(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return "-"
    mean = statistics.mean(values) * scale
    std = statistics.stdev(values) * scale if len(values) > 1 else 0.0
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def learning_table(result: dict) -> str:
    k = result["eval_samples"]
    lines = [
        f"| lr | steps | trainer | held-out avg@{k} after, % (mean ± std) | per seed | entropy std, 2nd half "
        "(nats) | final entropy (nats) | reward, last quarter | silenced ratio (mean) | batches with silencing | "
        "runs below half the start accuracy |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple, list[dict]] = {}
    for r in result["runs"]:
        groups.setdefault((r["lr"], r["steps"], r["label"]), []).append(r)
    for (lr, steps, label), rs in groups.items():
        silenced = [r["silenced_ratio_mean"] for r in rs if r["silenced_ratio_mean"] is not None]
        batches = (
            f"{sum(r['silenced_batches'] for r in rs)} / {sum(r['logged_batches'] for r in rs)}"
            if rs[0]["logged_batches"]
            else "-"
        )
        per_seed = ", ".join(f"{100 * r['accuracy_after']:.1f}" for r in rs)
        silenced_mean = f"{statistics.mean(silenced):.1e}" if silenced else "-"
        lines.append(
            f"| {lr:g} | {steps} | {label} | {_mean_std([r['accuracy_after'] for r in rs], 100)} | {per_seed} | "
            f"{_mean_std([r['entropy_std_second_half'] for r in rs], digits=3)} | "
            f"{_mean_std([r['entropy_final'] for r in rs], digits=3)} | "
            f"{_mean_std([r['reward_last_quarter'] for r in rs], digits=3)} | "
            f"{silenced_mean} | {batches} | "
            f"{sum(r['accuracy_after'] < 0.5 * result['accuracy_before'] for r in rs)} / {len(rs)} |"
        )
    before = result["accuracy_before"]
    return "\n".join(lines) + f"\n\nHeld-out avg@{k} of the starting model (same problems): {100 * before:.1f} %."


def section_text(args, r) -> str:
    """The Markdown section of the learning results."""
    return (
        "## 3. Learning on the demo task, GRPO vs STAPO\n\n"
        "Demo recipes with `--max_steps` and `--learning_rate` overridden; "
        f"seeds {', '.join(map(str, args.seeds))}. "
        f"Shrunk from `make demo` (500 steps, avg@4 on 300 problems) to fit the time budget: {args.learn_steps} "
        f"steps at lr {args.demo_lr:g}, {args.high_lr_steps} steps at lr {args.high_lr:g} (measured on this "
        f"tiny model: it collapses within 10-30 steps at 6e-4 and 1e-3), held-out avg@{r['eval_samples']} on the "
        f"first {r['eval_problems']} test problems (T = 1.0). Entropy: TRL's logged `entropy` (mean over loss "
        "tokens, one value per logging step of 4 optimizer steps = one generation batch), std over the "
        "logging steps of the second half.\n\n" + learning_table(r)
    )
