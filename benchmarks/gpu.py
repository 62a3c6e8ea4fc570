#!/usr/bin/env python
"""STAPO's cost on one GPU at a real vocabulary: a Qwen3-1.7B-shaped model (151,936 tokens), `stapo_trl.STAPOTrainer`
against plain `trl.GRPOTrainer` and its `s2t_mode="off"` twin, with random weights and trained-like.

    bash scripts/gpu_check.sh                                # on the GPU machine: wheels, versions, this script
    python benchmarks/gpu.py --out outputs/gpu --cpu-smoke   # the same code path at toy size on the CPU
    python benchmarks/gpu.py --report outputs/gpu/gpu.json   # results/<date>-gpu.md (+ .json) from a run's JSON

- Models: the random-weight model samples near-uniformly (p ~ 1/151,936 < tau_p: ~40 % of loss tokens silenced, the
  mask's worst case); the *trained-like* one is the same model with its final norm's weight scaled by s (the embeddings
  are tied: logits x s, temperature 1/s), s chosen so that the expected share of sampled tokens with p < tau_p, over
  the model's own samples, gives ~`--trained-silenced` (1e-4, a trained model's rate) silenced loss tokens.
- Trainers: the three arms with the same `GRPOConfig` fields (checked), seed, threads and the paper's loss (`dapo`,
  epsilon 0.2 / 0.28, beta 0), HF generation, bf16, SDPA, activation checkpointing; a reward that hashes each
  completion and its index to 0 or 1 (reward spread in nearly every group). Layouts: TRL's default
  (`steps_per_generation` = GA = 1), the paper's (`steps_per_generation` = 4 x GA) and GA = `steps_per_generation` = 4
  (the core's one no-grad forward per rollout batch). Per repetition, model and layout the arms run in a rotated order, each a fresh trainer on the one
  model (weights restored after each run). A *unit* is one rollout batch; each run's first is a discarded warm-up.
- Step time: `on_step_begin` to the step's `on_log`, CUDA synchronised; *train-side* time is that minus `generate`.
  Ratios pair units of the same index and repetition; medians over pairs. Peak GPU memory over each `train()`.
- Mask share: time in `_compute_s2t_mask` (the rule, the product's diagnostics, the token records' selection) over
  the step time; token records share: `SpuriousTokenLogger.record` and `write_pending` (the one transfer, the decode,
  the file). Forwards per optimizer step: the model's calls with TRL's `fused_lm_head`, with and without grad.
`--max-seconds` stops starting runs that would end past the budget; what ran is written.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
import zlib
from importlib import metadata
from pathlib import Path
from typing import Any

import script_env  # noqa: F401, I001 (first: the environment and sys.path)
import torch
from harness import RESULTS_DIR, fmt_bytes, machine_info, versions
from transformers import TrainerCallback


# Qwen3-1.7B's config.json (28 layers, 16 query / 8 KV heads of 128, tied embeddings), built with random weights.
QWEN3_1_7B = dict(
    vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)  # fmt: skip
# The same code path at toy size on the CPU: the full vocabulary, 2 small layers.
CPU_SMOKE_SHAPE = dict(QWEN3_1_7B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, head_dim=16)
CPU_SMOKE_SHAPE.update(num_attention_heads=4, num_key_value_heads=2)
PAD_TOKEN, CHAT_START_TOKEN, EOS_TOKEN = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
PAD_ID = 151643  # Qwen's ids for its first special tokens
# STAPOTrainer; plain trl.GRPOTrainer; STAPOTrainer with s2t_mode "off". Rotated per repetition from this order.
ARMS = ("STAPO", "GRPO", "off")
GEOMETRIES = {"spg=GA=1": (1, 1), "spg=4xGA": (4, 1), "GA=spg=4": (4, 4)}  # name -> (steps_per_generation, GA)
MODELS = ("random", "trained-like")
PAIRS = (("STAPO", "GRPO"), ("STAPO", "off"), ("off", "GRPO"))
TAU_P, Q = 0.002, 0.75  # the paper's S2T values, which the STAPO arm runs
LOGGED = dict(candidate_ratio="s2t/candidate_ratio", silenced_ratio="s2t/silenced_ratio", entropy="entropy",
              reward_std="reward_std", completion_length="completions/mean_length")  # fmt: skip


def build_tokenizer():
    """A byte-level tokenizer of exactly Qwen3's 151,936 entries, so every id the model samples decodes.

    Ids 0-255 are the byte-level alphabet (text is encoded byte by byte: no merges), ids 256 to `PAD_ID` - 1 the words
    ` t256`, ` t257`, ... (byte-level spelled, as Qwen's vocabulary spells a leading space), then Qwen's special tokens
    `<|endoftext|>` (pad), `<|im_start|>`, `<|im_end|>` (eos) at 151643-151645, then more words up to 151,935.

    Returns:
        [`~transformers.PreTrainedTokenizerFast`] with `len(tokenizer) == 151936`.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: i for i, char in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    specials = [PAD_TOKEN, CHAT_START_TOKEN, EOS_TOKEN]
    for i in range(len(vocab), QWEN3_1_7B["vocab_size"]):
        vocab[specials[i - PAD_ID] if PAD_ID <= i < PAD_ID + len(specials) else f"Ġt{i}"] = i
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(specials)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=PAD_TOKEN, eos_token=EOS_TOKEN)


def build_model(shape: dict, tokenizer, dtype: torch.dtype, device: str):
    """A random-weight `Qwen3ForCausalLM` of `shape`, built on `device` in `dtype` with SDPA attention (seed 0)."""
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config

    config = Qwen3Config(
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None, **shape
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa").to(device)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None
    )
    return model


def build_prompts(num_prompts: int, prompt_tokens: int, seed: int = 0):
    """A `datasets.Dataset` of `num_prompts` prompts of exactly `prompt_tokens` tokens (lowercase letters and spaces,
    one byte-level token each): equal lengths, so no prompt padding."""
    import random

    from datasets import Dataset

    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz    "
    return Dataset.from_dict({"prompt": ["".join(rng.choices(letters, k=prompt_tokens)) for _ in range(num_prompts)]})


def hashed_binary_reward(completions, **kwargs) -> list[float]:
    """1.0 or 0.0 by the CRC-32 of the completion's index in the batch and its text: deterministic (the same rollout
    scores the same in every arm), about half and half, so nearly every group has reward spread and non-zero
    advantages, also where its completions are equal (the trained-like model samples near-deterministically)."""
    return [float(zlib.crc32(f"{i}:{c}".encode()) & 1) for i, c in enumerate(completions)]


def candidate_mass(logits: torch.Tensor, scale: float) -> tuple[float, float]:
    """(expected share of sampled tokens with p < tau_p, mean entropy in nats) of (N, V) logits multiplied by `scale`."""
    logp = torch.log_softmax(logits.float() * scale, dim=-1)
    p = logp.exp()
    return float((p * (p < TAU_P)).sum(-1).mean()), float(-(p * logp).sum(-1).mean())


def sharpen(model, tokenizer, prompts: list[str], target_silenced: float, new_tokens: int) -> dict:
    """Scale the final norm's weight of `model` (in place) so that ~`target_silenced` of loss tokens are silenced:
    about half the tokens have a positive advantage and q of the candidates are silenced, so the expected candidate
    share is `target_silenced / (0.5 q)`. Two rounds: sample completions at the current scale, then bisect (in log
    space) the scale whose candidate share on those positions' logits is the target. Returns the scale, the share
    and the mean entropy (nats) at it."""
    norm, target = model.model.norm.weight, target_silenced / (0.5 * Q)
    base, scale = norm.detach().clone(), 1.0
    inputs = tokenizer(prompts, return_tensors="pt").to(model.device)
    for _ in range(2):
        with torch.no_grad():
            norm.copy_(base * scale)
            ids = model.generate(**inputs, do_sample=True, max_new_tokens=new_tokens, top_k=0, temperature=1.0)
            logits = model(ids).logits[:, inputs["input_ids"].size(1) - 1 : -1].flatten(0, 1) / scale  # (N, V), s = 1
        lo, hi = 0.0, 12.0  # log(scale)
        for _ in range(24):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if candidate_mass(logits, float(torch.tensor(mid).exp()))[0] > target else (lo, mid)
        scale = float(torch.tensor(hi).exp())
    with torch.no_grad():
        norm.copy_(base * scale)
    share, entropy = candidate_mass(logits, scale)
    return dict(norm_scale=scale, candidate_share=share, mean_entropy=entropy, target_silenced=target_silenced)


class Meter:
    """What one trainer run does, by optimizer step: step, generation and mask times, scoring forwards. Installed once
    on the shared model; `start(trainer)` begins a run. Times are CUDA synchronised on both sides on a GPU."""

    def __init__(self, model):
        self.cuda, self.trainer = next(model.parameters()).is_cuda, None
        model.register_forward_pre_hook(self._forward, with_kwargs=True)
        self.time_method(model, "generate", "generate_seconds")

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def start(self, trainer) -> None:
        self.trainer, self.by_step = trainer, {}

    def add(self, key: str, value: float, step: int | None = None, offset: int = 0) -> None:
        if self.trainer is None:
            return
        step = self.trainer.state.global_step + offset if step is None else step
        row = self.by_step.setdefault(step, {})
        row[key] = row.get(key, 0) + value

    def _forward(self, module, args, kwargs):
        if kwargs.get("fused_lm_head"):  # TRL's scoring and training forwards, not generation's
            kind = "grad" if torch.is_grad_enabled() else "nograd"
            self.add(f"{kind}_forwards", 1)
            self.add(f"{kind}_rows", kwargs["input_ids"].size(0))

    def time_method(self, owner, name: str, key: str, offset: int = 0) -> None:
        """Replace `owner.name` by a call timed into step `global_step + offset` (the owner's calls go through it)."""
        bound = getattr(owner, name)

        def timed(*args, **kwargs):
            start = self.now()
            try:
                return bound(*args, **kwargs)
            finally:
                self.add(key, self.now() - start, offset=offset)

        setattr(owner, name, timed)


class StepTimer(TrainerCallback):
    """Wall time of each optimizer step, from `on_step_begin` until the trainer's `log` of that step returned (every
    callback's `on_log` included), CUDA synchronised, into the meter as `step_seconds`. Needs `logging_steps=1`."""

    def __init__(self, meter: Meter, trainer):
        self.meter, self.begin = meter, None
        log = trainer.log

        def timed_log(*args, **kwargs):
            try:
                return log(*args, **kwargs)
            finally:
                if self.begin is not None:
                    step, start = self.begin
                    self.meter.add("step_seconds", self.meter.now() - start, step=step)
                    self.begin = None

        trainer.log = timed_log

    def on_step_begin(self, args, state, control, **kwargs):
        self.begin = (state.global_step, self.meter.now())


def watch_token_records(trainer, meter: Meter) -> None:
    """Add the product's `SpuriousTokenLogger` before `train()` (so it is the one used) and time its `record` (per
    mask) and `write_pending` (per logging step) as `records_seconds`."""
    from stapo_trl.run_folder.logs import SpuriousTokenLogger

    logger = SpuriousTokenLogger(trainer)
    trainer.add_callback(logger)
    meter.time_method(logger, "record", "records_seconds")
    meter.time_method(logger, "write_pending", "records_seconds", offset=-1)  # in on_step_end: the step is counted


def trainer_fields(args, geometry: str, units: int, output_dir: str) -> dict:
    """The `GRPOConfig` fields of every arm of one layout (the paper's objective, HF generation, no files kept)."""
    spg, grad_accum = GEOMETRIES[geometry]
    return dict(
        output_dir=output_dir, per_device_train_batch_size=args.completions, gradient_accumulation_steps=grad_accum,
        steps_per_generation=spg, num_generations=args.num_generations, max_completion_length=args.completion_tokens,
        max_steps=units * spg // grad_accum, learning_rate=1e-6, lr_scheduler_type="constant", weight_decay=0.1,
        max_grad_norm=1.0, loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.0, temperature=1.0, top_p=1.0,
        mask_truncated_completions=False, seed=args.seed, use_cpu=args.cpu_smoke, bf16=not args.cpu_smoke,
        activation_checkpointing=True, logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
        log_completions=False, dataloader_num_workers=0,
    )  # fmt: skip


def make_trainer(arm: str, fields: dict, model, tokenizer, dataset):
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    from stapo_trl import STAPOConfig, STAPOTrainer

    if arm == "GRPO":
        trainer_class, config = GRPOTrainer, GRPOConfig(**fields)
    else:
        trainer_class = STAPOTrainer
        config = STAPOConfig(**fields, s2t_mode="off" if arm == "off" else "low_entropy")
    trainer = trainer_class(
        model=model,
        reward_funcs=[hashed_binary_reward],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer


def grpo_fields(trainer) -> dict:
    """The trainer's `GRPOConfig` fields (after construction), without the per-run paths and names."""
    from trl import GRPOConfig

    skip = {"output_dir", "logging_dir", "run_name"}
    return {f.name: getattr(trainer.args, f.name) for f in dataclasses.fields(GRPOConfig) if f.name not in skip}


def field_differences(fields_by_arm: dict) -> list[str]:
    """`"<arm> vs <arm>: [fields]"` for every arm whose `GRPOConfig` fields differ from the first arm's (none: [])."""
    (first, reference), *others = fields_by_arm.items() or [(None, {})]
    differ = {arm: sorted(k for k in reference if repr(reference[k]) != repr(f.get(k))) for arm, f in others}
    return [f"{first} vs {arm}: {fields}" for arm, fields in differ.items() if fields]


def reset_model(model, saved: list[torch.Tensor]) -> None:
    """Undo a run on the shared model: `saved` weights, no gradients, and the class's own `forward` (TRL's fused LM
    head and accelerate's autocast wrapper are instance attributes, which the next trainer would wrap again)."""
    with torch.no_grad():
        for param, initial in zip(model.parameters(), saved, strict=True):
            param.copy_(initial, non_blocking=True)
            param.grad = None
    model.__dict__.pop("forward", None)
    model.__dict__.pop("_original_forward", None)
    if model.device.type == "cuda":
        torch.cuda.synchronize()


def run_arm(name: str, arm: str, geometry: str, rep: int, args, shared: dict, meter: Meter) -> tuple[dict, dict]:
    """One `train()` of `arm` on model `name` in `geometry`: warm-up unit(s) + timed units; returns its record and its
    trainer's `GRPOConfig` fields."""
    model, units = shared["model"], args.warmup_units + args.timed_units
    reset_model(model, shared["weights"][name])
    output_dir = tempfile.mkdtemp(prefix=f"{name}-{arm}-{geometry}-", dir=shared["workdir"])
    fields = trainer_fields(args, geometry, units, output_dir)
    trainer = make_trainer(arm, fields, model, shared["tokenizer"], shared["data"])
    fields = grpo_fields(trainer)
    if arm != "GRPO":
        meter.time_method(trainer, "_compute_s2t_mask", "mask_seconds")
        watch_token_records(trainer, meter)
    trainer.add_callback(StepTimer(meter, trainer))
    meter.start(trainer)
    if meter.cuda:
        torch.cuda.reset_peak_memory_stats()
    wall = -time.perf_counter()
    trainer.train()
    history = [h for h in trainer.state.log_history if "loss" in h or "step_time" in h]
    result = dict(
        model=name, arm=arm, geometry=geometry, rep=rep, steps_per_unit=fields["steps_per_generation"] //
        fields["gradient_accumulation_steps"], units=units, wall_seconds=wall + time.perf_counter(),
        activation_checkpointing=bool(getattr(model, "is_activation_checkpointing", False)),
        peak_bytes=torch.cuda.max_memory_allocated() if meter.cuda else None,
        by_step={int(k): v for k, v in sorted(meter.by_step.items())},
        logged={key: [h.get(key) for h in history] for key in LOGGED.values()},
    )  # fmt: skip
    meter.trainer = None
    del trainer
    gc.collect()
    if meter.cuda:
        torch.cuda.empty_cache()
    return result, fields


def unit_rows(run: dict, warmup_units: int) -> list[dict]:
    """The timed units of a run: per unit, step / generation / mask / records seconds and forward counts summed."""
    spu, rows = run["steps_per_unit"], []
    for unit in range(warmup_units, run["units"]):
        steps = [run["by_step"].get(s, run["by_step"].get(str(s), {})) for s in range(unit * spu, (unit + 1) * spu)]
        rows.append({k: sum(s.get(k, 0) for s in steps) for k in {k for s in steps for k in s}} | {"steps": spu})
    return rows


def run(args) -> dict:
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f} s] {message}", flush=True)

    torch.set_num_threads(args.threads)
    device = "cpu" if args.cpu_smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu.py: no CUDA device (use --cpu-smoke for the CPU code path)")
    info = dict(versions=versions(), machine=machine_info())
    info["versions"].update({n: metadata.version(n) for n in ("datasets", "tokenizers")}, cuda=torch.version.cuda)
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = dict(name=props.name, memory_bytes=props.total_memory, capability=f"{props.major}.{props.minor}")
    result: dict[str, Any] = dict(
        date=datetime.date.today().isoformat(), command=shlex.join(["python", "benchmarks/gpu.py", *args.argv]),
        device_command=os.environ.get("GPU_CHECK_COMMAND"), settings={k: v for k, v in vars(args).items() if k != "argv"},
        **info, runs=[], complete=False,
    )  # fmt: skip
    log(f"versions: {result['versions']}; GPU: {result.get('gpu')}")
    shape = CPU_SMOKE_SHAPE if args.cpu_smoke else QWEN3_1_7B
    tokenizer = build_tokenizer()
    model = build_model(shape, tokenizer, torch.float32 if args.cpu_smoke else torch.bfloat16, device)
    units = args.warmup_units + args.timed_units  # the longest run reads 4 x units generation batches
    data = build_prompts(4 * args.completions * units // args.num_generations, args.prompt_tokens)

    def saved() -> list[torch.Tensor]:
        weights = [p.detach().to("cpu", copy=True) for p in model.parameters()]
        return [t.pin_memory() for t in weights] if device == "cuda" else weights

    weights = {"random": saved()}
    prompts = data["prompt"][: args.completions]
    sharpened = sharpen(model, tokenizer, prompts, args.trained_silenced, args.completion_tokens)
    weights["trained-like"] = saved()
    result["model"] = dict(
        shape=shape, num_parameters=sum(p.numel() for p in model.parameters()), dtype=str(model.dtype),
        attention=model.config._attn_implementation, trained_like=sharpened,
    )  # fmt: skip
    log(f"model built: {result['model']['num_parameters'] / 1e9:.3f} B parameters, {model.dtype}; {sharpened}")
    shared = dict(model=model, tokenizer=tokenizer, weights=weights, data=data)
    meter = Meter(model)

    def save() -> None:
        (out / "gpu.json").write_text(json.dumps(result, indent=1, default=str) + "\n")

    save()
    fields_by_arm: dict[tuple, dict] = {}
    combos = [(name, geometry) for name in MODELS for geometry in GEOMETRIES]
    plan = [
        (rep, *combo, arm) for rep in range(args.reps) for combo in combos for arm in ARMS[rep % 3 :] + ARMS[: rep % 3]
    ]
    run_seconds: list[float] = []
    with tempfile.TemporaryDirectory(prefix="stapo-gpu-") as shared["workdir"]:
        for rep, name, geometry, arm in plan:
            estimate = max(run_seconds[-len(ARMS) * len(combos) :], default=0.0)
            if time.perf_counter() - started + estimate + args.reserve_seconds > args.max_seconds:
                log(f"budget: no more runs (--max-seconds {args.max_seconds})")
                break
            run_start = time.perf_counter()
            record, fields = run_arm(name, arm, geometry, rep, args, shared, meter)
            run_seconds.append(time.perf_counter() - run_start)
            fields_by_arm.setdefault((arm, name, geometry), fields)
            result["runs"].append(record)
            save()
            per_step = [u.get("step_seconds", 0) / u["steps"] for u in unit_rows(record, args.warmup_units)]
            log(f"rep {rep} {name} {geometry} {arm:<5}: {statistics.median(per_step or [float('nan')]):.3f} s/step, "
                f"peak {fmt_bytes(record['peak_bytes'])}, run {run_seconds[-1]:.1f} s")  # fmt: skip
        else:
            result["complete"] = True
    result["field_differences"] = [
        line for c in combos for line in field_differences({k: v for k, v in fields_by_arm.items() if k[1:] == c})
    ]
    if result["field_differences"]:
        log(f"WARNING: the arms' settings differ: {result['field_differences']}")
    result["elapsed_seconds"] = time.perf_counter() - started
    save()
    (out / "gpu.md").write_text(report_text(result))
    log(f"written: {out / 'gpu.json'}, {out / 'gpu.md'}")
    return result


def _fmt_ratios(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}], n={len(values)}"


def _median_logged(runs: list[dict], key: str, warmup_units: int) -> float | None:
    values = []
    for run in runs:
        skip = warmup_units * run["steps_per_unit"]
        values += [v for v in run["logged"].get(key, [])[skip:] if isinstance(v, int | float) and v == v]
    return statistics.median(values) if values else None


def summarize(result: dict) -> dict:
    """Per (model, layout): per-arm medians and shares, and the paired ratios (units of one index and repetition)."""
    warmup, completions = result["settings"]["warmup_units"], result["settings"]["completions"]
    summary = {}
    for name in MODELS:
        for geometry, (_, grad_accum) in GEOMETRIES.items():
            runs = [r for r in result["runs"] if r.get("model", "random") == name and r["geometry"] == geometry]
            units = {(r["arm"], r["rep"]): unit_rows(r, warmup) for r in runs}
            per_arm = {}
            for arm in ARMS:
                mine = [r for r in runs if r["arm"] == arm]
                rows = [u for r in mine for u in units[(arm, r["rep"])]]
                if not rows:
                    continue
                steps, total = sum(u["steps"] for u in rows), sum(u.get("step_seconds", 0) for u in rows)

                def share(key: str, rows=rows, total=total) -> float | None:
                    return sum(u.get(key, 0) for u in rows) / total if total else None

                def per_step(key: str, rows=rows, steps=steps, per: int = 1) -> float:
                    return sum(u.get(key, 0) for u in rows) / (steps * per)

                per_arm[arm] = dict(
                    runs=len(mine),
                    step_seconds=statistics.median(u.get("step_seconds", 0) / u["steps"] for u in rows),
                    train_side_seconds=statistics.median(
                        (u.get("step_seconds", 0) - u.get("generate_seconds", 0)) / u["steps"] for u in rows
                    ),
                    generate_share=share("generate_seconds"),
                    mask_share=share("mask_seconds"),
                    records_share=share("records_seconds"),
                    grad_forwards=per_step("grad_forwards"),
                    nograd_forwards=per_step("nograd_forwards"),
                    grad_passes=per_step("grad_rows", per=completions * grad_accum),
                    nograd_passes=per_step("nograd_rows", per=completions * grad_accum),
                    peak_bytes=statistics.median(r["peak_bytes"] for r in mine) if mine[0]["peak_bytes"] else None,
                    **{field: _median_logged(mine, key, warmup) for field, key in LOGGED.items()},
                )
            ratios = {}
            for arm, base in PAIRS:
                step, train, peak = [], [], []
                for rep in sorted({r["rep"] for r in runs}):
                    a, b = units.get((arm, rep)), units.get((base, rep))
                    if not a or not b:
                        continue
                    for ua, ub in zip(a, b):
                        step.append(ua.get("step_seconds", 0) / ub.get("step_seconds", 1))
                        train_a = ua.get("step_seconds", 0) - ua.get("generate_seconds", 0)
                        train.append(train_a / max(ub.get("step_seconds", 0) - ub.get("generate_seconds", 0), 1e-9))
                    peaks = {r["arm"]: r["peak_bytes"] for r in runs if r["rep"] == rep}
                    if peaks[arm] and peaks[base]:
                        peak.append(peaks[arm] / peaks[base])
                ratios[f"{arm}/{base}"] = dict(step=step, train_side=train, peak=peak)
            if per_arm:
                summary[f"{name} {geometry}"] = dict(per_arm=per_arm, ratios=ratios)
    return summary


def _pct(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f} %"


def _num(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def report_text(result: dict) -> str:
    """The results page: settings, the ratio table, the per-arm table, versions."""
    s, v, m = result["settings"], result["versions"], result["model"]
    gpu, sharp = result.get("gpu") or {}, m["trained_like"]
    device = gpu.get("name") or "CPU (smoke test: toy shape, float32; times mean nothing)"
    summary = summarize(result)
    lines = [
        f"# STAPO on one GPU at vocabulary {m['shape']['vocab_size']:,}: cost and memory ({result['date']})",
        "",
        f"- Command: `{result.get('device_command') or result['command']}` (runs `{result['command']}`; "
        f"{result.get('elapsed_seconds', 0) / 60:.1f} min{'' if result.get('complete') else ', stopped by its budget'})",
        f"- Device: {device}"
        + (f", {fmt_bytes(gpu['memory_bytes'])}, compute capability {gpu['capability']}" if gpu else "")
        + f"; {result['machine']['cores']} CPU cores, torch threads {s['threads']}",
        f"- Versions: torch {v['torch']} (CUDA {v.get('cuda')}), transformers {v['transformers']}, trl {v['trl']}, "
        f"accelerate {v['accelerate']}, datasets {v.get('datasets')}, tokenizers {v.get('tokenizers')}, "
        f"stapo_trl {v['stapo_trl']} ({v.get('git', 'no git')}), Python {result['machine']['python']}",
        f"- Model: Qwen3-1.7B-shaped `Qwen3ForCausalLM` ({m['num_parameters'] / 1e9:.3f} B parameters, hidden "
        f"{m['shape']['hidden_size']}, {m['shape']['num_hidden_layers']} layers, tied embeddings), {m['dtype']}, SDPA, "
        "activation checkpointing, HF `generate`. *random*: random weights (p ~ 1/151,936 < tau_p for nearly every "
        f"token: the mask's worst case); *trained-like*: the final norm's weight x {sharp['norm_scale']:.3g} (logits x "
        f"{sharp['norm_scale']:.3g}), for ~{sharp['target_silenced']:g} silenced: expected candidate share "
        f"{sharp['candidate_share']:.2e} of sampled tokens, mean entropy {sharp['mean_entropy']:.3f} nats",
        f"- Per micro-step: {s['completions']} completions ({s['completions'] // s['num_generations']} prompts x "
        f"{s['num_generations']}) of {s['completion_tokens']} new tokens after {s['prompt_tokens']}-token prompts; "
        f"`dapo`, epsilon 0.2 / 0.28, beta 0, lr 1e-6, seed {s['seed']}; reward: CRC-32 parity of index and text. Layouts "
        "`spg=GA=1` (TRL's default), `spg=4xGA` (GA 1: the paper's 4 updates per rollout batch), `GA=spg=4` (one "
        "update per rollout batch of 4 micro-steps: the core's own no-grad forward)",
        f"- Runs: per repetition, model and layout the three arms in a rotated order; each run {s['warmup_units']} "
        f"warm-up + {s['timed_units']} timed rollout batch(es); {s['reps']} repetitions planned, "
        f"{len({r['rep'] for r in result['runs']})} run",
        "",
        "## Ratios (median over paired units [min-max], n pairs)",
        "",
        "| model, layout | ratio | step time | train-side time (step minus `generate`) | peak GPU memory (per run) |",
        "|---|---|---|---|---|",
    ]
    for key, g in summary.items():
        for name, r in g["ratios"].items():
            lines.append(
                f"| {key} | {name} | {_fmt_ratios(r['step'])} | {_fmt_ratios(r['train_side'])} | "
                f"{_fmt_ratios(r['peak'])} |"
            )
    lines += [
        "",
        "## Per arm (medians over timed units)",
        "",
        "| model, layout | arm | s / step | train-side s / step | `generate` share | mask share | token records share "
        "| grad forwards / step (passes) | no-grad forwards / step (passes) | peak GPU memory | candidates / loss tokens "
        "| silenced / loss tokens | entropy (nats) | reward std | completion tokens |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, g in summary.items():
        for arm, a in g["per_arm"].items():
            stapo = arm != "GRPO"
            lines.append(
                f"| {key} | {arm} | {a['step_seconds']:.3f} | {a['train_side_seconds']:.3f} | "
                f"{_pct(a['generate_share'])} | {_pct(a['mask_share']) if stapo else '-'} | "
                f"{_pct(a['records_share']) if stapo else '-'} | {a['grad_forwards']:.2f} ({a['grad_passes']:.2f}) | "
                f"{a['nograd_forwards']:.2f} ({a['nograd_passes']:.2f}) | {fmt_bytes(a['peak_bytes'])} | "
                f"{_pct(a['candidate_ratio'], 4)} | {_pct(a['silenced_ratio'], 4)} | {_num(a['entropy'], '.3f')} | "
                f"{_num(a['reward_std'], '.3f')} | {_num(a['completion_length'], '.1f')} |"
            )
    lines += [
        "",
        "*mask share*: time in `_compute_s2t_mask` (the rule, the product's diagnostics, the token records' selection), "
        "CUDA synchronised, over the timed units' step time; *token records share*: `SpuriousTokenLogger.record` and "
        "`write_pending`. Forwards: the model's calls with TRL's fused LM head per optimizer step (generation's are not "
        "counted); in brackets the rows they scored over the completions of one optimizer step.",
    ]
    return "\n".join(lines) + "\n"


def write_report(json_path: str, output: str | None) -> Path:
    """`results/<run date>-gpu.md` and the run's JSON next to it (`--report`)."""
    result = json.loads(Path(json_path).read_text())
    path = Path(output) if output else RESULTS_DIR / f"{result['date']}-gpu.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report_text(result))
    if Path(json_path).resolve() != path.with_suffix(".json").resolve():
        path.with_suffix(".json").write_text(Path(json_path).read_text())
    print(path.read_text())
    print(f"Written: {path} and {path.with_suffix('.json')}")
    return path


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="benchmarks/gpu.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="outputs/gpu", help="folder for gpu.json and gpu.md")
    parser.add_argument("--report", metavar="JSON", help="only write results/<date>-gpu.md from a run's gpu.json")
    parser.add_argument("--output", help="with --report: the Markdown file (default results/<run date>-gpu.md)")
    parser.add_argument("--cpu-smoke", action="store_true", help="toy shape, float32, on the CPU (a test of the path)")
    parser.add_argument("--completions", type=int, help="completions per micro-step (default 32; smoke 8)")
    parser.add_argument("--num-generations", type=int, default=8, help="completions per prompt (the paper's 8)")
    parser.add_argument("--completion-tokens", type=int, help="max_completion_length (default 64; smoke 8)")
    parser.add_argument("--prompt-tokens", type=int, help="tokens per prompt (default 32; smoke 8)")
    parser.add_argument("--reps", type=int, help="interleaved repetitions (default 2; smoke 1)")
    parser.add_argument("--warmup-units", type=int, default=1, help="rollout batches discarded per run")
    parser.add_argument("--timed-units", type=int, help="rollout batches timed per run (default 2; smoke 1)")
    parser.add_argument("--threads", type=int, help="torch threads, every arm (default 8; smoke 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trained-silenced", type=float, default=1e-4, help="the trained-like model's target rate")
    parser.add_argument("--max-seconds", type=float, help="no run starts that would end past this (default 300)")
    parser.add_argument("--reserve-seconds", type=float, help="kept for the files (default 10; smoke 2)")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    for name, full, small in (
        ("completions", 32, 8), ("completion_tokens", 64, 8), ("prompt_tokens", 32, 8), ("reps", 2, 1),
        ("timed_units", 2, 1), ("threads", 8, 1), ("max_seconds", 300.0, 1e9), ("reserve_seconds", 10.0, 2.0),
    ):  # fmt: skip
        if getattr(args, name) is None:
            setattr(args, name, small if args.cpu_smoke else full)
    if args.completions % args.num_generations:
        parser.error(
            f"--completions {args.completions} must be a multiple of --num-generations {args.num_generations}"
        )
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.report:
        write_report(args.report, args.output)
        return
    import warnings

    import datasets
    import transformers

    warnings.filterwarnings("ignore")
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    run(args)


if __name__ == "__main__":
    main()
