#!/usr/bin/env python
r"""The paper's token statistics on a real tokenizer: which tokens S2T silences, and how often, at the paper's scale.

    python benchmarks/census.py --recipe recipes/SmolLM2-135M/stapo.yaml \
        --checkpoints builtin:smollm2-135m-math outputs/smollm2-stapo/checkpoint-30 outputs/smollm2-stapo \
        --tokens 100000

For each checkpoint, rollouts are sampled as training samples them: a trainer is built from the recipe (the same
prompts, chat template, group size, temperature, reward and advantages), its `_generate_and_score_completions` scores
rollout batches, and one no-grad forward of the checkpoint gives every sampled token's probability p and entropy H
(nats) at T = 1, the values the loss's own forward would give. Then the exact `s2t_mask` (τ_p and q of the recipe,
the paper's 0.002 and 0.75) is applied to three kinds of mini-batch:

- **the laptop's update**: consecutive groups of `per_device_train_batch_size x gradient_accumulation_steps`
  completions, the update a CPU run takes τ_h over (a lone candidate there is never silenced: τ_h is its own entropy
  and the rule is strict);
- **the pool**: every sampled token of the checkpoint in one virtual mini-batch (the candidates' entropy quantile is
  then taken over all of them);
- **virtual paper-size mini-batches**: `--paper-tokens` tokens each (default 1,048,576: the paper's 64 prompts x 8
  rollouts at a mean response of 2,048 tokens), drawn from the pool by resampling whole completions with
  replacement, `--virtual-batches` times. A completion drawn twice counts twice, so these show the spread of the counts
  one paper-size mini-batch would see if its tokens were distributed as this checkpoint's, not new samples.

Writes `<out>.json` (counts, rates, τ_h, the records of every silenced and kept-candidate token and a sample of the
rest, with contexts), `<out>.md` (tables, the most frequent silenced and kept-candidate tokens, their categories) and
the probability-entropy figure `<figure>` (one panel per checkpoint; `stapo_trl.runfiles.diagnostic_plots`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import random
import re
import shlex
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import script_env  # noqa: I001 (first: the environment and sys.path)
import torch  # noqa: E402
from harness import build_trainer, machine_info, versions  # noqa: E402

from stapo_trl import s2t_mask  # noqa: E402
from stapo_trl.diagnostics.token_records import spurious_token_records  # noqa: E402
from stapo_trl.runfiles.diagnostic_plots import plot_prob_entropy_scatter  # noqa: E402
from stapo_trl.runfiles.token_labels import readable_token, tokenizer_token_bytes  # noqa: E402


RESULTS_DIR = script_env.REPO / "benchmarks" / "results"
PAPER_TOKENS = 512 * 2048  # 64 prompts x 8 rollouts x a mean response of 2,048 tokens (max 15,360 in the paper)
# The paper's three categories of spurious tokens (its Sec. 5 analysis), as far as this task's tokens allow.
FORMAT_CHARS = set("\\{}$,;.:=+ \n\t()[]")
EQUATION = re.compile(r"(\d+)\+(\d+)(?:\+(\d+))?=(\d+)")


# ---------------------------------------------------------------------------------------------------------------
# Sampling, as training samples
# ---------------------------------------------------------------------------------------------------------------


def policy_logps_and_entropies(trainer, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """One no-grad forward of the trainer's policy over a scored batch: (B, T) log-probs and entropies (nats) of the
    completion tokens, from TRL's own forward at the loss's temperature (what the S2T mask is built from)."""
    from trl import GRPOTrainer
    from trl.models.utils import disable_gradient_checkpointing

    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)  # (B, P+T)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)  # (B, P+T)
    with torch.no_grad(), disable_gradient_checkpointing(trainer.model, trainer.args.gradient_checkpointing_kwargs):
        logps, entropies, _ = GRPOTrainer._get_per_token_logps_and_entropies(
            trainer,
            trainer.model,
            input_ids,
            attention_mask,
            batch["completion_ids"].size(1),
            batch_size=trainer.args.per_device_train_batch_size,
            compute_entropy=True,
        )
    return logps, entropies


def sample_rollouts(trainer, target_tokens: int, seed: int) -> dict[str, Any]:
    """Score rollout batches of the trainer's train prompts until `target_tokens` completion tokens are sampled.

    Returns:
        `dict`: per completion (lists): `completion_ids` (list[int]), `logps` and `entropies` (list[float], nats, at
        the loss's temperature), `advantage` (float), `reward` (float); plus `seconds`.
    """
    args = trainer.args
    rows_per_batch = args.per_device_train_batch_size * args.steps_per_generation  # one rollout batch (1 process)
    prompts_per_batch = rows_per_batch // args.num_generations
    order = list(range(len(trainer.train_dataset)))
    random.Random(seed).shuffle(order)
    out: dict[str, list] = {"completion_ids": [], "logps": [], "entropies": [], "advantage": [], "reward": []}
    tokens, start, cursor = 0, time.perf_counter(), 0
    trainer.model.train()  # as in training (no dropout in these models; the "train" metrics mode)
    while tokens < target_tokens:
        picked = [order[(cursor + i) % len(order)] for i in range(prompts_per_batch)]
        cursor += prompts_per_batch
        rows = [trainer.train_dataset[i] for i in picked for _ in range(args.num_generations)]  # RepeatSampler order
        batch = trainer._generate_and_score_completions(rows)
        logps, entropies = policy_logps_and_entropies(trainer, batch)  # (B, T) each, no grad
        mask = batch["completion_mask"].bool()
        if "tool_mask" in batch:
            mask &= batch["tool_mask"].bool()
        for row in range(mask.size(0)):
            length = int(mask[row].sum())
            out["completion_ids"].append(batch["completion_ids"][row, :length].tolist())
            out["logps"].append(logps[row, :length].tolist())
            out["entropies"].append(entropies[row, :length].tolist())
            out["advantage"].append(float(batch["advantages"][row]))
            tokens += length
        print(f"  {len(out['advantage'])} completions, {tokens} tokens ({time.perf_counter() - start:.0f} s)")
    out["seconds"] = time.perf_counter() - start
    return out


def as_batch(sample: dict[str, Any], rows: list[int]) -> tuple[torch.Tensor, ...]:
    """(logps, entropies, advantages, loss_mask, completion_ids) of `rows`, right-padded: (B, T), (B,) for A."""
    length = max(1, max(len(sample["completion_ids"][r]) for r in rows))
    logps = torch.zeros(len(rows), length, dtype=torch.float32)
    entropies = torch.zeros(len(rows), length, dtype=torch.float32)
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    loss_mask = torch.zeros(len(rows), length, dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(sample["completion_ids"][r])
        logps[i, :n] = torch.tensor(sample["logps"][r])
        entropies[i, :n] = torch.tensor(sample["entropies"][r])
        ids[i, :n] = torch.tensor(sample["completion_ids"][r])
        loss_mask[i, :n] = 1
    advantages = torch.tensor([sample["advantage"][r] for r in rows])
    return logps, entropies, advantages, loss_mask, ids


# ---------------------------------------------------------------------------------------------------------------
# The mask over three kinds of mini-batch
# ---------------------------------------------------------------------------------------------------------------


def census(
    sample: dict[str, Any], update_rows: int, tau_p: float, q: float, paper_tokens: int, virtual: int, seed: int
):
    """Counts of the exact S2T mask per laptop update, over the pool, and over virtual paper-size mini-batches."""
    num = len(sample["advantage"])
    mask = lambda rows: s2t_mask(*as_batch(sample, rows)[:4], prob_threshold=tau_p, entropy_quantile=q)  # noqa: E731

    updates = [mask(list(range(s, min(s + update_rows, num)))) for s in range(0, num, update_rows)]
    with_candidates = [u for u in updates if u.num_candidates > 0]
    pool_rows = list(range(num))
    pool = mask(pool_rows)
    rng = random.Random(seed)
    lengths = [len(ids) for ids in sample["completion_ids"]]
    virtual_rows = []
    for _ in range(virtual):
        rows, tokens = [], 0
        while tokens < paper_tokens:
            r = rng.randrange(num)
            rows.append(r)
            tokens += lengths[r]
        virtual_rows.append(rows)
    virtuals = [mask(rows) for rows in virtual_rows]

    def summary(results) -> dict[str, Any]:
        loss = sum(r.num_loss_tokens for r in results)
        return {
            "num_masks": len(results),
            "loss_tokens": loss,
            "candidates": sum(r.num_candidates for r in results),
            "silenced": sum(r.num_silenced for r in results),
            "candidate_rate": sum(r.num_candidates for r in results) / max(loss, 1),
            "silenced_rate": sum(r.num_silenced for r in results) / max(loss, 1),
        }

    return {
        "updates": summary(updates)
        | {
            "rows_per_update": update_rows,
            "updates_with_candidates": len(with_candidates),
            "updates_with_one_candidate": sum(u.num_candidates == 1 for u in updates),
            "updates_that_silenced": sum(u.num_silenced > 0 for u in updates),
        },
        "pool": summary([pool]) | {"tau_h": pool.entropy_threshold},
        "virtual": summary(virtuals)
        | {
            "tokens_each": paper_tokens,
            "silenced_each": [v.num_silenced for v in virtuals],
            "candidates_each": [v.num_candidates for v in virtuals],
            "tau_h_each": [v.entropy_threshold for v in virtuals],
        },
    }, (pool_rows, pool)


def pool_records(sample, pool_rows, pool, tokenizer, step: int, tau_p: float) -> list[dict[str, Any]]:
    """`spurious_tokens.jsonl`-style records of the pool: every silenced token and kept candidate, a sample of the
    other positive-advantage tokens ([`~stapo_trl.diagnostics.token_records.spurious_token_records`])."""
    logps, entropies, advantages, loss_mask, ids = as_batch(sample, pool_rows)
    return spurious_token_records(
        pool, logps, entropies, advantages, loss_mask, ids, tokenizer, step=step, prob_threshold=tau_p,
        max_silenced=10**6, max_kept_candidates=10**6, max_reference=3000, context_tokens=10,
    )  # fmt: skip


def category(record: dict[str, Any]) -> str:
    """The paper's categories, as this task's tokens allow: `math error` (a digit inside a wrong `a+b=c` step),
    `formatting` (whitespace, punctuation, LaTeX and box syntax, end of sequence), `uncommon syntax` (anything else:
    words, odd fragments); other digits are `digit, correct step` (inside a right `a+b=c`) or `digit, elsewhere`."""
    token = record["token"]
    stripped = token.strip()
    if stripped.isdigit():
        context = record["context"].replace("⟦", "").replace("⟧", "")
        marked = record["context"].find("⟦")
        for match in EQUATION.finditer(context):
            if match.start() <= marked <= match.end():
                a, b, carry, c = (int(x) if x else 0 for x in match.groups())
                return "digit, correct step" if a + b + carry == c else "math error"
        return "digit, elsewhere"
    if (
        not stripped
        or set(stripped) <= FORMAT_CHARS
        or "boxed" in stripped
        or token.startswith("<|")
        or token == "<eos>"
    ):
        return "formatting"
    return "uncommon syntax"


# ---------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------


def _rate(x: float) -> str:
    return f"{x:.2e}" if x else "0"


def top_tokens(records, kind: str, token_bytes: dict[int, bytes], k: int = 12) -> list[tuple[str, int, str, str]]:
    """(readable token, count, category, one context) of the `k` most frequent tokens of a record kind; byte-level
    fragments are labelled by their bytes ([`~stapo_trl.runfiles.token_labels.readable_token`])."""
    chosen = [r for r in records if r["kind"] == kind]
    counts = Counter(r["token_id"] for r in chosen)
    out = []
    for token_id, n in counts.most_common(k):
        example = next(r for r in chosen if r["token_id"] == token_id)
        label = readable_token(example["token"], token_bytes.get(token_id), token_id)
        out.append((label, n, category(example), example["context"]))
    return out


def write_report(
    path: Path, args, results: list[dict[str, Any]], figure: Path | None, command: str, token_bytes: dict[int, bytes]
) -> None:
    lines = [
        f"# Token census: the S2T mask on a real tokenizer ({datetime.date.today()})",
        "",
        f"Command: `{command}`",
        "",
        "Rollouts sampled as training samples them (the recipe's prompts, group size, T, reward and advantages), p and "
        "H from one no-grad forward of each checkpoint; the exact `s2t_mask` at the recipe's τ_p and q. Mini-batches: "
        "the laptop's update (consecutive completions as one CPU update holds them), the pool (all sampled tokens of "
        f"the checkpoint), and {args.virtual_batches} virtual paper-size mini-batches of {args.paper_tokens:,} tokens "
        "(whole completions resampled from the pool with replacement: the spread one paper mini-batch would see, not "
        "new samples). The paper reports silenced ratios mostly below 1e-4.",
        "",
        "| checkpoint | completions | tokens | reward | candidate rate | silenced: laptop updates | silenced: pool | "
        "silenced: paper-size (mean, min-max per batch) | τ_h pool (nats) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        c, u, p, v = r["census"], r["census"]["updates"], r["census"]["pool"], r["census"]["virtual"]
        each = v["silenced_each"]
        tau = "-" if p["tau_h"] != p["tau_h"] else f"{p['tau_h']:.3f}"
        lines.append(
            f"| {r['checkpoint']} | {r['completions']} | {r['tokens']:,} | {r['reward_mean']:.2f} | "
            f"{_rate(p['candidate_rate'])} ({p['candidates']}) | {_rate(u['silenced_rate'])} ({u['silenced']}; "
            f"{u['updates_with_candidates']} of {u['num_masks']} updates had a candidate, "
            f"{u['updates_with_one_candidate']} exactly one) | {_rate(p['silenced_rate'])} ({p['silenced']}) | "
            f"{_rate(v['silenced_rate'])} ({sum(each) / len(each):.1f}, {min(each)}-{max(each)} per batch) | {tau} |"
        )
        del c
    for r in results:
        lines += ["", f"## {r['checkpoint']}", ""]
        categories = Counter(category(x) for x in r["records"] if x["kind"] == "silenced")
        lines.append(
            "Silenced tokens by category (pool): "
            + (", ".join(f"{name} {n}" for name, n in categories.most_common()) or "none")
            + "."
        )
        for kind, title in (
            ("silenced", "Most frequent silenced tokens"),
            ("kept_candidate", "Most frequent kept candidates"),
        ):
            rows = top_tokens(r["records"], kind, token_bytes)
            lines += ["", f"{title} (pool):", "", "| token | count | category | a context |", "|---|---|---|---|"]
            lines += [
                f"| `{tok}` | {n} | {cat} | `{json.dumps(ctx, ensure_ascii=False)[1:-1]}` |"
                for tok, n, cat, ctx in rows
            ] or ["| - | 0 | - | - |"]
    if figure is not None:
        lines += [
            "",
            f"Figure: `{figure.relative_to(script_env.REPO) if figure.is_relative_to(script_env.REPO) else figure}`.",
        ]
    lines += ["", f"Machine: {json.dumps(machine_info())}", f"Versions: {json.dumps(versions())}", ""]
    path.write_text("\n".join(lines))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--recipe", required=True, help="the training recipe the rollouts follow")
    parser.add_argument("--checkpoints", nargs="+", required=True, help="model folders or builtin: names")
    parser.add_argument("--labels", nargs="*", default=None, help="one label per checkpoint (default: its path)")
    parser.add_argument("--tokens", type=int, default=100_000, help="completion tokens sampled per checkpoint")
    parser.add_argument("--paper-tokens", type=int, default=PAPER_TOKENS)
    parser.add_argument("--virtual-batches", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="report path (default benchmarks/results/<date>-census.md)")
    parser.add_argument("--figure", default=None, help="probability-entropy figure (default: beside the report)")
    args = parser.parse_args(argv)
    if args.labels and len(args.labels) != len(args.checkpoints):
        parser.error(f"--labels: {len(args.labels)} labels for {len(args.checkpoints)} checkpoints")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    out = Path(args.out) if args.out else RESULTS_DIR / f"{datetime.date.today()}-census.md"
    figure = Path(args.figure) if args.figure else out.with_suffix(".png")
    command = "python benchmarks/census.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    labels = args.labels or args.checkpoints
    results = []
    workdir = tempfile.mkdtemp(prefix="census-")
    for step, (checkpoint, label) in enumerate(zip(args.checkpoints, labels, strict=True)):
        print(f"{label}: sampling {args.tokens} tokens ...")
        trainer, _ = build_trainer(args.recipe, ["--model_name_or_path", checkpoint], workdir=workdir)
        torch.manual_seed(args.seed)
        sample = sample_rollouts(trainer, args.tokens, args.seed)
        tau_p, q = trainer.args.s2t_prob_threshold, trainer.args.s2t_entropy_quantile
        update_rows = trainer.args.per_device_train_batch_size * trainer.args.gradient_accumulation_steps
        counts, (pool_rows, pool) = census(
            sample, update_rows, tau_p, q, args.paper_tokens, args.virtual_batches, args.seed
        )
        records = pool_records(sample, pool_rows, pool, trainer.processing_class, step, tau_p)
        token_bytes = tokenizer_token_bytes(json.loads(trainer.processing_class.backend_tokenizer.to_str()))
        rewards = trainer._metrics["train"].get("reward", [])
        results.append(
            {
                "checkpoint": label,
                "path": checkpoint,
                "completions": len(sample["advantage"]),
                "tokens": sum(len(ids) for ids in sample["completion_ids"]),
                "reward_mean": sum(rewards) / len(rewards) if rewards else math.nan,
                "sampling_seconds": round(sample["seconds"], 1),
                "tau_p": tau_p,
                "q": q,
                "census": counts,
                "records": records,
            }
        )
        del trainer
        out.with_suffix(".json").write_text(json.dumps({"command": command, "results": results}, indent=1))
    drawn = plot_prob_entropy_scatter({r["checkpoint"]: r["records"] for r in results}, figure)
    write_report(out, args, results, drawn, command, token_bytes)
    print(out.read_text())


if __name__ == "__main__":
    main()
