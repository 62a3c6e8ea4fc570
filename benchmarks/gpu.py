"""Section 4 (`gpu`): a Qwen3-0.6B-shaped model (random weights) with and without STAPO on a GPU."""

from __future__ import annotations

import os
import random
import statistics
import time

import torch
from harness import GRPO_RECIPE, STAPO_RECIPE, build_trainer, fmt_bytes


# ---------------------------------------------------------------------------------------------------------------
# Section 4: a Hub-sized model on a GPU
# ---------------------------------------------------------------------------------------------------------------

# Qwen3-0.6B's shape (its config.json), built with random weights: nothing is downloaded.
QWEN3_0_6B = dict(
    vocab_size=151936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
# The same code path at toy size, to check it on a CPU (`--gpu-on-cpu`): the 0.6B vocabulary, 2 small layers.
QWEN3_CPU_SMOKE = dict(
    QWEN3_0_6B,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)


def random_binary_reward(completions, **kwargs) -> list[float]:
    """0/1 at random (seeded): random-weight models solve nothing, and zero-variance rewards give zero advantages."""
    rng = random.Random(len(completions) * 7919 + sum(len(str(c)) for c in completions))
    return [float(rng.random() < 0.5) for _ in completions]


def run_gpu(args, workdir: str, on_cpu: bool = False) -> dict:
    """Tokens per second and peak GPU memory of GRPO / STAPO on a Qwen3-0.6B-shaped random model."""
    from transformers import AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    from stapo_trl.models import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("builtin:tiny-math"))  # ids past it decode to ""
    shape = QWEN3_CPU_SMOKE if on_cpu else QWEN3_0_6B
    config = Qwen3Config(
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None, **shape
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(torch.float32 if on_cpu else torch.bfloat16)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None
    )
    model_dir = os.path.join(workdir, "qwen3-shaped")
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    num_parameters = sum(p.numel() for p in model.parameters())
    del model

    completion_length = 16 if on_cpu else args.gpu_completion_length
    steps = 2 if on_cpu else args.gpu_steps
    common = ["--model_name_or_path", model_dir, "--max_steps", str(steps), "--logging_steps", "1"]
    common += ["--max_completion_length", str(completion_length), "--seed", str(args.seed)]
    if on_cpu:
        common += ["--per_device_train_batch_size", "8", "--steps_per_generation", "2"]
    else:
        common += ["--use_cpu", "false", "--bf16", "true", "--dtype", "bfloat16"]
    arms = [
        ("GRPO", GRPO_RECIPE, []),
        ("STAPO", STAPO_RECIPE, []),
    ]
    results: dict[str, list[dict]] = {label: [] for label, _, _ in arms}
    for rep in range(1 if on_cpu else args.gpu_reps):
        for label, recipe, extra in arms:
            trainer, _ = build_trainer(recipe, common + extra, reward_funcs=[random_binary_reward], workdir=workdir)
            tokens = {"completion": 0}
            generate = trainer._generate_and_score_completions

            def counting(inputs, _generate=generate, _tokens=tokens):
                output = _generate(inputs)
                _tokens["completion"] += int(output["completion_mask"].sum())
                return output

            trainer._generate_and_score_completions = counting
            if torch.cuda.is_available() and not on_cpu:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            trainer.train()
            if torch.cuda.is_available() and not on_cpu:
                torch.cuda.synchronize()
            wall = time.perf_counter() - start
            peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() and not on_cpu else None
            step_times = [h["step_time"] for h in trainer.state.log_history if "step_time" in h]
            results[label].append(
                dict(wall=wall, completion_tokens=tokens["completion"], peak_bytes=peak, step_time_sum=sum(step_times))
            )
            print(
                f"  gpu {label:<24} rep {rep + 1}: {tokens['completion'] / wall:.0f} completion tok/s, peak "
                f"{fmt_bytes(peak)}",
                flush=True,
            )
            del trainer
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return dict(
        results=results,
        shape=shape,
        num_parameters=num_parameters,
        steps=steps,
        completion_length=completion_length,
        device=("cpu (smoke test)" if on_cpu else torch.cuda.get_device_name(0)),
    )


def gpu_table(result: dict | None) -> str:
    header = (
        "| model | trainer | completion tokens / s (median) | ratio | peak GPU memory | ratio |\n"
        "|---|---|---|---|---|---|"
    )
    if result is None:
        return header + "\n| Qwen3-0.6B-shaped, random weights | GRPO / STAPO | not run (no GPU) | - | - | - |"
    lines = [header]
    base = result["results"]["GRPO"]
    base_tps = statistics.median(r["completion_tokens"] / r["wall"] for r in base)
    base_peak = base[0]["peak_bytes"]
    for label, rs in result["results"].items():
        tps = statistics.median(r["completion_tokens"] / r["wall"] for r in rs)
        peak = max((r["peak_bytes"] for r in rs if r["peak_bytes"] is not None), default=None)
        lines.append(
            f"| Qwen3-0.6B-shaped ({result['num_parameters'] / 1e6:.0f}M params) on {result['device']} | {label} | "
            f"{tps:.0f} | {tps / base_tps:.3f} | {fmt_bytes(peak)} | "
            f"{'-' if peak is None or not base_peak else f'{peak / base_peak:.3f}'} |"
        )
    return "\n".join(lines)


def section_text(args, r) -> str:
    """The Markdown section of the GPU results (`r` is `None` when it did not run)."""
    gpu = r
    on_cpu = gpu is not None and gpu["device"].startswith("cpu")
    precision = "float32, 2 small layers (a CPU smoke test of the code path)" if on_cpu else "bf16"
    note = (
        f"Qwen3-0.6B-shaped model, random weights (no download), {precision}, "
        f"{gpu['steps']} optimizer steps, "
        f"{gpu['completion_length']} new tokens, random 0/1 reward, demo batch geometry; "
        "tokens/s = completion tokens generated / `train()` wall time; peak = `torch.cuda.max_memory_allocated`."
        if gpu
        else "Code path: `run_gpu` (Qwen3-0.6B shape from `transformers.Qwen3Config`, random weights, bf16, "
        "GRPO and STAPO); it runs only when `torch.cuda.is_available()`."
    )
    return "## 4. GPU\n\n" + note + "\n\n" + gpu_table(gpu)
