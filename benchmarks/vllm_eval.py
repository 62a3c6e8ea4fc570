#!/usr/bin/env python
"""`stapo-eval --backend vllm` against `--backend hf` on the CPU: answer agreement, avg@k, tokens per second.

Runs in the vLLM environment (`make install-vllm`):

    .venv-vllm/bin/python benchmarks/vllm_eval.py                       # builtin:tiny-math-h64, 300 problems, ~3 min
    .venv-vllm/bin/python benchmarks/vllm_eval.py --samples 4 --limit 100  # quicker

Both backends run through `stapo_trl.evaluation.generation` (`HFGenerator`, `VLLMGenerator`, `evaluate_problems`: the same prompts,
grading and metrics as `stapo-eval`) on the built-in tiny-math test split, in float32:

1. greedy decoding (temperature 0, one sample): the extracted answers must agree on >= 95 % of problems; the
   problems where they differ are listed with both completions;
2. sampling at the paper's T = 1.0 / top-p 1.0, `--samples` per problem: avg@k of each backend with its standard
   error over problems, and the z-score of their difference (|z| < 2: within sampling error);
3. throughput: generated tokens (eos included) / generation seconds, after one untimed warm-up call per backend;
   model loading is timed separately.

Writes `benchmarks/results/<date>-vllm-eval.{md,json}` (or `--output-prefix`). The engine core of vLLM is a
spawned process, so everything runs under `if __name__ == "__main__":`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path


def _standard_error(rows: list[list[bool]]) -> tuple[float, float]:
    """Mean over problems of the per-problem accuracy, and its standard error (sample std / sqrt(P))."""
    per_problem = [sum(row) / len(row) for row in rows]
    mean = statistics.fmean(per_problem)
    se = statistics.stdev(per_problem) / math.sqrt(len(per_problem)) if len(per_problem) > 1 else float("nan")
    return mean, se


def _run(generator, tokenizer, problems, decoding, n, max_new_tokens, seed):
    from stapo_trl.evaluation.generation import evaluate_problems

    table, records = evaluate_problems(
        generator.generate,
        tokenizer,
        problems,
        n=n,
        decoding=decoding,
        max_new_tokens=max_new_tokens,
        seed=seed,
        save_completions=True,
    )
    tokens = sum(r["num_tokens"] for r in records)
    rows = [[r["correct"] for r in records[i * n : (i + 1) * n]] for i in range(len(problems))]
    mean, se = _standard_error(rows)
    return {
        "avg": mean,
        "se": se,
        "tokens": tokens,
        "seconds": table["generation_time_s"],
        "tokens_per_s": tokens / table["generation_time_s"],
        "records": records,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:tiny-math-h64", help="a model vLLM's CPU attention accepts")
    parser.add_argument("--samples", type=int, default=8, help="samples per problem of the sampled run (k of avg@k)")
    parser.add_argument("--limit", type=int, default=None, help="first K problems of the 300")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--hf-batch-size", type=int, default=256, help="HF generate: sequences per call")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-prefix", default=None, help="default: benchmarks/results/<date>-vllm-eval")
    args = parser.parse_args()

    import torch
    import transformers
    import vllm

    from stapo_trl.evaluation.generation import DECODINGS, HFGenerator, VLLMGenerator
    from stapo_trl.evaluation.tasks import load_benchmark
    from stapo_trl.grading import extract_boxed_answer
    from stapo_trl.models import resolve_model_path

    model_path = resolve_model_path(args.model)
    problems = load_benchmark("tiny-math", limit=args.limit)
    greedy, sampled = DECODINGS["greedy"], DECODINGS["t1.0-p1.0"]
    load_avg_start = os.getloadavg()
    results = {}
    for backend in ("hf", "vllm"):
        start = time.perf_counter()
        if backend == "hf":
            generator = HFGenerator(model_path, dtype="float32", device="cpu", batch_size=args.hf_batch_size)
        else:
            generator = VLLMGenerator(model_path, dtype="float32", seed=args.seed, max_model_len=256)
        load_s = time.perf_counter() - start
        tokenizer = generator.tokenizer
        _run(generator, tokenizer, problems[:4], sampled, 2, args.max_new_tokens, args.seed)  # warm-up, untimed
        results[backend] = {
            "load_s": load_s,
            "greedy": _run(generator, tokenizer, problems, greedy, 1, args.max_new_tokens, args.seed),
            "sampled": _run(generator, tokenizer, problems, sampled, args.samples, args.max_new_tokens, args.seed),
        }
        del generator
    load_avg_end = os.getloadavg()

    hf_greedy, vllm_greedy = results["hf"]["greedy"]["records"], results["vllm"]["greedy"]["records"]
    disagreements = [
        {"problem": p.problem, "gold": p.gold, "hf": h["completion"], "vllm": v["completion"]}
        for p, h, v in zip(problems, hf_greedy, vllm_greedy, strict=True)
        if extract_boxed_answer(h["completion"]) != extract_boxed_answer(v["completion"])
    ]
    same_text = sum(h["completion"] == v["completion"] for h, v in zip(hf_greedy, vllm_greedy, strict=True))
    agreement = 1 - len(disagreements) / len(problems)
    hf_s, vllm_s = results["hf"]["sampled"], results["vllm"]["sampled"]
    z = (vllm_s["avg"] - hf_s["avg"]) / math.sqrt(hf_s["se"] ** 2 + vllm_s["se"] ** 2)

    date = datetime.now(UTC).strftime("%Y-%m-%d")
    prefix = Path(args.output_prefix or Path(__file__).parent / "results" / f"{date}-vllm-eval")
    command = f".venv-vllm/bin/python benchmarks/vllm_eval.py --model {args.model} --samples {args.samples}" + (
        f" --limit {args.limit}" if args.limit else ""
    )
    lines = [
        f"# stapo-eval: vLLM (CPU) against HF generate, {date}",
        "",
        f"Command: `{command}`. Model `{args.model}` (float32), {len(problems)} tiny-math test problems, "
        f"max {args.max_new_tokens} new tokens. Machine: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, load average {load_avg_start[0]:.1f} -> {load_avg_end[0]:.1f} (shared). "
        f"torch {torch.__version__}, transformers {transformers.__version__}, vllm {vllm.__version__}, "
        f"torch threads {torch.get_num_threads()}.",
        "",
        f"| backend | load (s) | greedy acc. | greedy tok/s | avg@{args.samples} (T=1.0) +- s.e. | sampled tok/s | sampled tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    for backend, r in results.items():
        lines.append(
            f"| {backend} | {r['load_s']:.1f} | {100 * r['greedy']['avg']:.1f} % | {r['greedy']['tokens_per_s']:.0f} "
            f"| {100 * r['sampled']['avg']:.1f} +- {100 * r['sampled']['se']:.1f} % "
            f"| {r['sampled']['tokens_per_s']:.0f} | {r['sampled']['tokens']} |"
        )
    lines += [
        "",
        f"Greedy agreement (same extracted answer): {100 * agreement:.1f} % ({len(problems) - len(disagreements)}"
        f"/{len(problems)}); identical completion text: {same_text}/{len(problems)}. "
        f"Sampled avg@{args.samples}: vLLM - HF = {100 * (vllm_s['avg'] - hf_s['avg']):+.1f} points, z = {z:+.2f} "
        f"({'within' if abs(z) < 2 else 'OUTSIDE'} sampling error, |z| < 2).",
    ]
    for d in disagreements:
        lines.append(f"- `{d['problem']}` (gold {d['gold']}): hf `{d['hf']!r}`, vllm `{d['vllm']!r}`")
    report = "\n".join(lines) + "\n"
    print(report)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    prefix.with_suffix(".md").write_text(report, encoding="utf-8")
    summary = {
        backend: {
            "load_s": r["load_s"],
            **{
                f"{kind}_{key}": r[kind][key]
                for kind in ("greedy", "sampled")
                for key in ("avg", "se", "tokens", "seconds", "tokens_per_s")
            },
        }
        for backend, r in results.items()
    }
    payload = {
        "command": command,
        "num_problems": len(problems),
        "samples": args.samples,
        "greedy_agreement": agreement,
        "greedy_identical_text": same_text,
        "sampled_z": z,
        "disagreements": disagreements,
        "results": summary,
        "load_average": [load_avg_start, load_avg_end],
    }
    prefix.with_suffix(".json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
