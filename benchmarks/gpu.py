#!/usr/bin/env python
"""STAPO's cost and memory on one GPU at a real vocabulary: a Qwen3-1.7B-shaped model (random weights, 151,936
tokens), `stapo_trl.STAPOTrainer` against plain `trl.GRPOTrainer` and against its `s2t_mode="off"` twin.

    bash scripts/gpu_check.sh                                # on the GPU machine: wheels, versions, this script
    python benchmarks/gpu.py --out outputs/gpu --cpu-smoke   # the same code path at toy size on the CPU (~1 min)
    python benchmarks/gpu.py --report outputs/gpu/gpu.json   # results/<date>-gpu.md (+ .json) from a run's JSON

What one run measures (`--out DIR` gets `gpu.json`, rewritten after every trainer run, and `gpu.md`):
- Trainers: the three arms with the same `GRPOConfig` fields (checked field by field), seed, thread count and loss
  (`dapo`, epsilon 0.2 / 0.28, beta 0), HF generation (no vLLM), bf16 weights, SDPA attention, activation
  checkpointing; a reward that hashes the completion text to 0 or 1, so groups have reward spread and non-zero
  advantages. Two geometries: TRL's default (`steps_per_generation` = GA = 1) and the paper's (`steps_per_generation`
  = 4 x GA). Runs are interleaved: per repetition and geometry, the three arms in a rotated order (A B C, B C A, ...),
  each a fresh trainer on the one model, built once (its weights restored and TRL's / accelerate's forward patches
  removed after each run). A *unit* is one rollout batch (`steps_per_generation` / GA optimizer steps); each run's
  first unit is a discarded warm-up. Per-step time: wall time from `on_step_begin` to the step's `on_log`, CUDA
  synchronised (generation, the loss, the optimizer step, logging and the run files included), summed per unit and
  divided by its steps; *train-side* time is that minus the time inside `model.generate`. Ratios are taken between
  units of the same index in the same repetition (pairs), median over pairs.
- Peak GPU memory: `torch.cuda.max_memory_allocated` over each `train()`, reset before it (the shared model's weights
  are in every arm's peak).
- Mask share: time inside `_compute_s2t_mask` (the core's `s2t_mask`, the product's diagnostics and token records),
  CUDA synchronised on both sides, as a share of the timed units' step time; token records (`SpuriousTokenLogger.
  record`) alone too.
- Full-sequence forwards per optimizer step: calls of the model's forward with TRL's `fused_lm_head` (the scoring
  and training forwards; generation's incremental forwards are counted apart), and the rows they score divided by the
  completions of one optimizer step.
- Token records: what `SpuriousTokenLogger` holds in this process (pending records at their largest, the label
  counters and the tokenizer's byte table at the end, as Python object bytes; JSON bytes of the pending records) and
  writes (`spurious_tokens.jsonl`).
- `s2t_mask` alone on synthetic tensors of 1, 16 and 64 Mi tokens on the GPU (median of 5 calls after one warm-up),
  in the dtypes the trainer gave it (recorded in the first repetition), at 0.1 % and 50 % candidates: a random-weight
  model samples nearly uniformly (p ~ 1/151,936 < tau_p), so every positive-advantage token is a candidate, the mask's
  worst case.
`--max-seconds` stops starting runs (and repetitions) that would end past the budget; what ran is written.
"""

from __future__ import annotations

import argparse
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
from pathlib import Path
from typing import Any

import script_env  # noqa: F401, I001 (first: the environment and sys.path)
import torch
from harness import RESULTS_DIR, fmt_bytes, machine_info, versions
from mask import make_mask_inputs
from transformers import TrainerCallback


# Qwen3-1.7B's config.json (28 layers, 16 query / 8 KV heads of 128, tied embeddings), built with random weights.
QWEN3_1_7B = dict(
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=6144,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
# The same code path at toy size on the CPU: the full vocabulary, 2 small layers.
CPU_SMOKE_SHAPE = dict(QWEN3_1_7B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, head_dim=16)
CPU_SMOKE_SHAPE.update(num_attention_heads=4, num_key_value_heads=2)
PAD_TOKEN, CHAT_START_TOKEN, EOS_TOKEN = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
PAD_ID = 151643  # Qwen's ids for its first special tokens
# STAPOTrainer; plain trl.GRPOTrainer; STAPOTrainer with s2t_mode "off". Rotated per repetition from this order, so
# a budget that stops the first repetition early keeps STAPO and GRPOTrainer.
ARMS = ("STAPO", "GRPO", "off")
GEOMETRIES = {"spg=GA=1": 1, "spg=4xGA": 4}  # name -> steps_per_generation (gradient_accumulation_steps = 1)
PAIRS = (("STAPO", "GRPO"), ("STAPO", "off"), ("off", "GRPO"))
MASK_FRACTIONS = (0.001, 0.5)  # 0.1 % candidates (a trained model, the paper's order); 50 % (this random model)


# ---------------------------------------------------------------------------------------------------------------
# The model, its tokenizer, the prompts and the reward
# ---------------------------------------------------------------------------------------------------------------


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
    """1.0 or 0.0 by the CRC-32 of the completion text: deterministic (equal completions score equally in every arm)
    and about half and half on a random model, so nearly every group has reward spread and non-zero advantages."""
    return [float(zlib.crc32(str(c).encode()) & 1) for c in completions]


# ---------------------------------------------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------------------------------------------


def deep_bytes(obj: Any, seen: set[int] | None = None) -> int:
    """`sys.getsizeof` of `obj` and of everything it holds (dicts, lists, tuples, sets), each object counted once."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_bytes(k, seen) + deep_bytes(v, seen) for k, v in obj.items())
    elif isinstance(obj, list | tuple | set | frozenset):
        size += sum(deep_bytes(item, seen) for item in obj)
    return size


class Meter:
    """What one trainer run does, by optimizer step: step wall times, generation and mask times, scoring forwards.

    Installed once on the shared model (a forward pre-hook and a timed `generate`); `start(trainer)` begins a run.
    Times are CUDA synchronised on both sides when the model is on a GPU.
    """

    def __init__(self, model):
        self.cuda = next(model.parameters()).is_cuda
        self.trainer = None
        self.in_generate = False
        model.register_forward_pre_hook(self._forward, with_kwargs=True)
        generate = model.generate

        def timed_generate(*args, **kwargs):
            start = self.now()
            self.in_generate = True
            try:
                return generate(*args, **kwargs)
            finally:
                self.in_generate = False
                self.add("generate_seconds", self.now() - start)

        model.generate = timed_generate

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def start(self, trainer) -> None:
        self.trainer, self.by_step = trainer, {}

    def add(self, key: str, value: float, step: int | None = None) -> None:
        if self.trainer is None:
            return
        step = self.trainer.state.global_step if step is None else step
        row = self.by_step.setdefault(step, {})
        row[key] = row.get(key, 0) + value

    def _forward(self, module, args, kwargs):
        if kwargs.get("fused_lm_head"):
            kind = "grad" if torch.is_grad_enabled() else "nograd"
            self.add(f"{kind}_forwards", 1)
            self.add(f"{kind}_rows", kwargs["input_ids"].size(0))
        elif self.in_generate:
            self.add("generation_forwards", 1)

    def time_method(self, owner, name: str, key: str) -> None:
        """Replace `owner.name` by a timed call of it (an instance attribute: the owner's own calls go through it)."""
        bound = getattr(owner, name)

        def timed(*args, **kwargs):
            start = self.now()
            try:
                return bound(*args, **kwargs)
            finally:
                self.add(key, self.now() - start)

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


def watch_token_records(trainer, meter: Meter, record: dict) -> None:
    """Add the product's `SpuriousTokenLogger` before `train()` (so it is the one used), time its `record` and keep
    the largest size of its pending records in `record`."""
    from stapo_trl.runfiles.callbacks import SpuriousTokenLogger

    logger = SpuriousTokenLogger(trainer)
    trainer.add_callback(logger)
    record.update(pending_max_bytes=0, pending_max_json_bytes=0, pending_max_records=0)
    original = logger.record

    def measured(*args, **kwargs):
        start = meter.now()
        try:
            return original(*args, **kwargs)
        finally:
            meter.add("records_seconds", meter.now() - start)
            bookkeeping = time.perf_counter()  # this measurement's own time leaves the step time (`unit_rows`)
            pending = logger._pending
            record["pending_max_records"] = max(record["pending_max_records"], len(pending))
            record["pending_max_bytes"] = max(record["pending_max_bytes"], deep_bytes(pending))
            json_bytes = sum(len(json.dumps(r, ensure_ascii=False).encode()) + 1 for r in pending)
            record["pending_max_json_bytes"] = max(record["pending_max_json_bytes"], json_bytes)
            meter.add("meter_seconds", time.perf_counter() - bookkeeping)

    logger.record = measured
    record["logger"] = logger


def token_record_sizes(record: dict, output_dir: str, shared: dict) -> dict:
    """The sizes the logger holds at the end of a run (its label counters and the tokenizer's byte table, the same
    table in every run: measured once) and the bytes of the file it wrote, next to `watch_token_records`' sizes."""
    logger = record.pop("logger")
    path = Path(output_dir) / "spurious_tokens.jsonl"
    if "token_table" not in shared and logger._token_bytes is not None:
        shared["token_table"] = (deep_bytes(logger._token_bytes), len(logger._token_bytes))
    table_bytes, table_entries = shared.get("token_table", (0, 0))
    return dict(
        record,
        counters_bytes=deep_bytes(logger.silenced_counts) + deep_bytes(logger.kept_candidate_counts),
        token_bytes_table_bytes=table_bytes,
        token_bytes_table_entries=table_entries,
        file_bytes=path.stat().st_size if path.exists() else 0,
    )


# ---------------------------------------------------------------------------------------------------------------
# The trainer runs
# ---------------------------------------------------------------------------------------------------------------


def trainer_fields(args, spg: int, units: int, output_dir: str) -> dict:
    """The `GRPOConfig` fields of every arm of one geometry (the paper's objective, HF generation, no files kept)."""
    return dict(
        output_dir=output_dir,
        per_device_train_batch_size=args.completions,
        gradient_accumulation_steps=1,
        steps_per_generation=spg,
        num_generations=args.num_generations,
        max_completion_length=args.completion_tokens,
        max_steps=units * spg,
        learning_rate=1e-6,
        lr_scheduler_type="constant",
        weight_decay=0.1,
        max_grad_norm=1.0,
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=0.28,
        beta=0.0,
        temperature=1.0,
        top_p=1.0,
        mask_truncated_completions=False,
        seed=args.seed,
        use_cpu=args.cpu_smoke,
        bf16=not args.cpu_smoke,
        activation_checkpointing=True,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
    )


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
    import dataclasses

    from trl import GRPOConfig

    skip = {"output_dir", "logging_dir", "run_name"}
    return {f.name: getattr(trainer.args, f.name) for f in dataclasses.fields(GRPOConfig) if f.name not in skip}


def field_differences(fields_by_arm: dict[str, dict]) -> list[str]:
    """`"<arm> vs <arm>: [fields]"` for every arm whose `GRPOConfig` fields differ from the first arm's (none: [])."""
    (first, reference), *others = fields_by_arm.items()
    differences = []
    for arm, fields in others:
        differ = sorted(k for k in reference if repr(reference[k]) != repr(fields.get(k)))
        if differ:
            differences.append(f"{first} vs {arm}: {differ}")
    return differences


def reset_model(model, saved: list[torch.Tensor]) -> None:
    """Undo a run on the shared model: its initial weights, no gradients, and the class's own `forward` (TRL's fused LM
    head and accelerate's autocast wrapper are instance attributes, which the next trainer would wrap again)."""
    with torch.no_grad():
        for param, initial in zip(model.parameters(), saved, strict=True):
            param.copy_(initial, non_blocking=True)
            param.grad = None
    model.__dict__.pop("forward", None)
    model.__dict__.pop("_original_forward", None)
    if model.device.type == "cuda":
        torch.cuda.synchronize()


def run_arm(arm: str, geometry: str, rep: int, args, shared: dict, meter: Meter) -> tuple[dict, dict]:
    """One `train()` of `arm` in `geometry`: warm-up unit(s) + timed units; returns its record and its trainer's
    `GRPOConfig` fields."""
    spg = GEOMETRIES[geometry]
    units = args.warmup_units + args.timed_units
    output_dir = tempfile.mkdtemp(prefix=f"{arm}-{geometry}-", dir=shared["workdir"])
    model = shared["model"]
    trainer = make_trainer(
        arm, trainer_fields(args, spg, units, output_dir), model, shared["tokenizer"], shared["data"]
    )
    fields = grpo_fields(trainer)
    records: dict[str, Any] = {}
    if arm != "GRPO":
        meter.time_method(trainer, "_compute_s2t_mask", "mask_seconds")
        watch_token_records(trainer, meter, records)
        dtypes = shared.setdefault("mask_dtypes", {})
        compute = trainer._compute_s2t_mask

        def noting_dtypes(per_token_logps, entropies, advantages, loss_mask, completion_ids):
            dtypes.update(logps=str(per_token_logps.dtype), entropies=str(entropies.dtype))
            dtypes.update(loss_mask=str(loss_mask.dtype), advantages=str(advantages.dtype))
            return compute(per_token_logps, entropies, advantages, loss_mask, completion_ids)

        trainer._compute_s2t_mask = noting_dtypes
    trainer.add_callback(StepTimer(meter, trainer))
    meter.start(trainer)
    cuda = meter.cuda
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start_bytes = torch.cuda.memory_allocated() if cuda else None
    wall = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - wall
    peak_bytes = torch.cuda.max_memory_allocated() if cuda else None
    history = [h for h in trainer.state.log_history if "loss" in h or "step_time" in h]
    logged = {
        key: [h.get(key) for h in history]
        for key in ("s2t/candidate_ratio", "s2t/silenced_ratio", "entropy", "reward_std", "completions/mean_length")
    }
    by_step = meter.by_step
    meter.trainer = None
    result = dict(
        arm=arm,
        geometry=geometry,
        rep=rep,
        steps_per_unit=spg,
        units=units,
        wall_seconds=wall,
        activation_checkpointing=bool(getattr(model, "is_activation_checkpointing", False)),
        start_bytes=start_bytes,
        peak_bytes=peak_bytes,
        by_step={int(k): v for k, v in sorted(by_step.items())},
        logged=logged,
        token_records=token_record_sizes(records, output_dir, shared) if records else None,
    )
    del trainer
    gc.collect()
    reset_model(model, shared["saved"])
    if cuda:
        torch.cuda.empty_cache()
    return result, fields


def unit_rows(run: dict, warmup_units: int) -> list[dict]:
    """The timed units of a run: per unit, step / generation / mask / records seconds and forward counts summed; step
    and mask time without the meter's own bookkeeping (`meter_seconds`)."""
    spu, rows = run["steps_per_unit"], []
    for unit in range(warmup_units, run["units"]):
        steps = [run["by_step"].get(s, run["by_step"].get(str(s), {})) for s in range(unit * spu, (unit + 1) * spu)]
        row = {k: sum(s.get(k, 0) for s in steps) for k in {k for s in steps for k in s}} | {"steps": spu}
        for key in ("step_seconds", "mask_seconds"):  # both hold the meter's bookkeeping of the token records
            row[key] = row.get(key, 0) - row.get("meter_seconds", 0)
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------------------------
# s2t_mask alone
# ---------------------------------------------------------------------------------------------------------------


def bench_mask(sizes: list[int], dtypes: dict, device: str, reps: int = 5) -> list[dict]:
    """`s2t_mask` on synthetic (B, 4096) inputs of each size and candidate fraction, in the trainer's dtypes."""
    from stapo_trl.core.s2t import s2t_mask

    def dtype(name: str, default: torch.dtype) -> torch.dtype:
        return getattr(torch, dtypes.get(name, str(default)).replace("torch.", ""))

    rows = []
    for num_tokens in sizes:
        for fraction in MASK_FRACTIONS:
            logps, entropies, advantages, loss_mask = make_mask_inputs(num_tokens, fraction)
            inputs = (
                logps.to(device, dtype("logps", torch.float32)),
                entropies.to(device, dtype("entropies", torch.float32)),
                advantages.to(device, dtype("advantages", torch.float32)),
                loss_mask.to(device, dtype("loss_mask", torch.int64)),
            )
            del logps, entropies, advantages, loss_mask
            cuda = device == "cuda"
            times = []
            for i in range(reps + 1):
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated() if cuda else 0
                start = time.perf_counter()
                result = s2t_mask(*inputs)
                if cuda:
                    torch.cuda.synchronize()
                if i:  # the first call is a warm-up
                    times.append(time.perf_counter() - start)
                extra = torch.cuda.max_memory_allocated() - before if cuda else None
            rows.append(
                dict(
                    num_tokens=inputs[0].numel(),
                    candidate_fraction=fraction,
                    num_candidates=result.num_candidates,
                    dtypes={
                        k: str(t.dtype) for k, t in zip(("logps", "entropies", "advantages", "loss_mask"), inputs)
                    },
                    seconds=times,
                    peak_extra_bytes=extra,
                )
            )
            print(
                f"  s2t_mask {num_tokens / 2**20:g} Mi tokens, {100 * fraction:g} % candidates: "
                f"{1e3 * statistics.median(times):.2f} ms (median of {reps}), peak extra {fmt_bytes(extra)}",
                flush=True,
            )
            del inputs, result
            if cuda:
                torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------------


def environment() -> dict:
    """Versions and the machine: torch, CUDA, transformers, trl, the GPU."""
    info = dict(versions=versions(), machine=machine_info())
    import datasets
    import tokenizers

    info["versions"].update(datasets=datasets.__version__, tokenizers=tokenizers.__version__)
    info["versions"]["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = dict(name=props.name, memory_bytes=props.total_memory, capability=f"{props.major}.{props.minor}")
    return info


def run(args) -> dict:
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def elapsed() -> str:
        return f"[{time.perf_counter() - started:6.1f} s]"

    torch.set_num_threads(args.threads)
    device = "cpu" if args.cpu_smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu.py: no CUDA device (use --cpu-smoke for the CPU code path)")
    result: dict[str, Any] = dict(
        date=datetime.date.today().isoformat(),
        command=shlex.join(["python", "benchmarks/gpu.py", *args.argv]),
        device_command=os.environ.get("GPU_CHECK_COMMAND"),
        settings={k: v for k, v in vars(args).items() if k not in ("argv",)},
        **environment(),
        runs=[],
        mask=None,
        complete=False,
    )
    print(f"{elapsed()} versions: {result['versions']}; GPU: {result.get('gpu')}", flush=True)

    shape = CPU_SMOKE_SHAPE if args.cpu_smoke else QWEN3_1_7B
    tokenizer = build_tokenizer()
    model = build_model(shape, tokenizer, torch.float32 if args.cpu_smoke else torch.bfloat16, device)
    saved = [p.detach().to("cpu", copy=True) for p in model.parameters()]
    if device == "cuda":
        saved = [t.pin_memory() for t in saved]
    result["model"] = dict(
        shape=shape,
        num_parameters=sum(p.numel() for p in model.parameters()),
        dtype=str(model.dtype),
        attention=model.config._attn_implementation,
    )
    num_prompts = max(GEOMETRIES.values()) * args.completions * (args.warmup_units + args.timed_units)
    num_prompts //= args.num_generations  # what the longest run reads
    shared = dict(model=model, tokenizer=tokenizer, saved=saved, data=build_prompts(num_prompts, args.prompt_tokens))
    meter = Meter(model)
    print(
        f"{elapsed()} model built: {result['model']['num_parameters'] / 1e9:.3f} B parameters, {model.dtype}",
        flush=True,
    )

    def save() -> None:
        (out / "gpu.json").write_text(json.dumps(result, indent=1, default=str) + "\n")

    save()
    fields_by_arm: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="stapo-gpu-") as workdir:
        shared["workdir"] = workdir
        run_seconds: list[float] = []
        stop = False
        for rep in range(args.reps):
            for geometry in GEOMETRIES:
                order = ARMS[rep % len(ARMS) :] + ARMS[: rep % len(ARMS)]
                for arm in order:
                    estimate = max(run_seconds[-len(ARMS) * len(GEOMETRIES) :], default=0.0)
                    if time.perf_counter() - started + estimate + args.reserve_seconds > args.max_seconds:
                        print(f"{elapsed()} budget: no more runs (--max-seconds {args.max_seconds})", flush=True)
                        stop = True
                        break
                    run_start = time.perf_counter()
                    record, fields = run_arm(arm, geometry, rep, args, shared, meter)
                    run_seconds.append(time.perf_counter() - run_start)
                    fields_by_arm.setdefault(f"{arm}|{geometry}", fields)
                    result["runs"].append(record)
                    save()
                    timed = unit_rows(record, args.warmup_units)
                    per_step = [u.get("step_seconds", 0) / u["steps"] for u in timed]
                    print(
                        f"{elapsed()} rep {rep} {geometry} {arm:<5}: {len(timed)} timed units, "
                        f"{statistics.median(per_step) if per_step else float('nan'):.3f} s/step, peak "
                        f"{fmt_bytes(record['peak_bytes'])}, run {run_seconds[-1]:.1f} s",
                        flush=True,
                    )
                if stop:
                    break
            result["field_differences"] = [
                line
                for geometry in GEOMETRIES
                for line in field_differences({k: v for k, v in fields_by_arm.items() if k.endswith(geometry)})
            ]
            if result["field_differences"]:
                print(f"{elapsed()} WARNING: the arms' settings differ: {result['field_differences']}", flush=True)
            if rep == 0 or (stop and result["mask"] is None):
                print(f"{elapsed()} s2t_mask alone, dtypes {shared.get('mask_dtypes')}", flush=True)
                result["mask"] = bench_mask(args.mask_sizes, shared.get("mask_dtypes", {}), device)
                save()
            if stop:
                break
    result["complete"] = not stop
    result["elapsed_seconds"] = time.perf_counter() - started
    save()
    (out / "gpu.md").write_text(report_text(result))
    print(f"{elapsed()} written: {out / 'gpu.json'}, {out / 'gpu.md'}", flush=True)
    return result


# ---------------------------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------------------------


def _fmt_ratios(values: list[float]) -> str:
    if not values:
        return "-"
    mid = statistics.median(values)
    return f"{mid:.3f} [{min(values):.3f}-{max(values):.3f}], n={len(values)}"


def summarize(result: dict) -> dict:
    """Per geometry: per-arm medians and the paired ratios (units of the same index and repetition)."""
    warmup = result["settings"]["warmup_units"]
    completions = result["settings"]["completions"]
    summary = {}
    for geometry in GEOMETRIES:
        runs = [r for r in result["runs"] if r["geometry"] == geometry]
        units = {(r["arm"], r["rep"]): unit_rows(r, warmup) for r in runs}
        per_arm = {}
        for arm in ARMS:
            mine = [r for r in runs if r["arm"] == arm]
            rows = [u for r in mine for u in units[(arm, r["rep"])]]
            if not rows:
                continue
            steps = sum(u["steps"] for u in rows)
            step_total = sum(u.get("step_seconds", 0) for u in rows)
            per_arm[arm] = dict(
                runs=len(mine),
                step_seconds=statistics.median(u.get("step_seconds", 0) / u["steps"] for u in rows),
                train_side_seconds=statistics.median(
                    (u.get("step_seconds", 0) - u.get("generate_seconds", 0)) / u["steps"] for u in rows
                ),
                generate_share=sum(u.get("generate_seconds", 0) for u in rows) / step_total if step_total else None,
                mask_share=sum(u.get("mask_seconds", 0) for u in rows) / step_total if step_total else None,
                records_share=sum(u.get("records_seconds", 0) for u in rows) / step_total if step_total else None,
                grad_forwards=sum(u.get("grad_forwards", 0) for u in rows) / steps,
                nograd_forwards=sum(u.get("nograd_forwards", 0) for u in rows) / steps,
                grad_passes=sum(u.get("grad_rows", 0) for u in rows) / (steps * completions),
                nograd_passes=sum(u.get("nograd_rows", 0) for u in rows) / (steps * completions),
                peak_bytes=statistics.median(r["peak_bytes"] for r in mine) if mine[0]["peak_bytes"] else None,
                start_bytes=statistics.median(r["start_bytes"] for r in mine) if mine[0]["start_bytes"] else None,
                candidate_ratio=_median_logged(mine, "s2t/candidate_ratio", warmup),
                silenced_ratio=_median_logged(mine, "s2t/silenced_ratio", warmup),
                entropy=_median_logged(mine, "entropy", warmup),
                reward_std=_median_logged(mine, "reward_std", warmup),
                completion_length=_median_logged(mine, "completions/mean_length", warmup),
                token_records=[r["token_records"] for r in mine if r["token_records"]],
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
                run_a = next(r for r in runs if r["arm"] == arm and r["rep"] == rep)
                run_b = next(r for r in runs if r["arm"] == base and r["rep"] == rep)
                if run_a["peak_bytes"] and run_b["peak_bytes"]:
                    peak.append(run_a["peak_bytes"] / run_b["peak_bytes"])
            ratios[f"{arm}/{base}"] = dict(step=step, train_side=train, peak=peak)
        summary[geometry] = dict(per_arm=per_arm, ratios=ratios)
    return summary


def _median_logged(runs: list[dict], key: str, warmup_units: int) -> float | None:
    values = []
    for run in runs:
        skip = warmup_units * run["steps_per_unit"]
        values += [v for v in run["logged"].get(key, [])[skip:] if isinstance(v, int | float) and v == v]
    return statistics.median(values) if values else None


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f} %"


def _num(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def report_text(result: dict) -> str:
    """The results page: settings, the ratio table, the per-arm table, token records, `s2t_mask` alone, versions."""
    s, v, m = result["settings"], result["versions"], result["model"]
    summary = summarize(result)
    gpu = result.get("gpu") or {}
    device = gpu.get("name") or "CPU (smoke test: toy shape, float32; times mean nothing)"
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
        f"{m['shape']['hidden_size']}, {m['shape']['num_hidden_layers']} layers, tied embeddings), random weights, "
        f"{m['dtype']}, SDPA attention, activation checkpointing on, HF `generate` (no vLLM)",
        f"- Per optimizer step: {s['completions']} completions ({s['completions'] // s['num_generations']} prompts x "
        f"{s['num_generations']}) of {s['completion_tokens']} new tokens after {s['prompt_tokens']}-token prompts; "
        f"loss `dapo`, epsilon 0.2 / 0.28, beta 0, lr 1e-6, seed {s['seed']}; reward: the completion text's CRC-32 "
        "parity (0 or 1). Geometries: `steps_per_generation` = GA = 1 (TRL's default) and `steps_per_generation` = 4, "
        "GA = 1 (the paper's 4 updates per rollout batch)",
        f"- Runs: per repetition and geometry the three arms in a rotated order (A B C, B C A, ...); each run "
        f"{s['warmup_units']} warm-up unit(s) (discarded) + {s['timed_units']} timed unit(s), a unit being one rollout "
        f"batch (1 or 4 optimizer steps); {s['reps']} repetitions planned, "
        f"{len({r['rep'] for r in result['runs']})} run",
        "",
        "A random-weight model samples near-uniformly: p ~ 1/151,936 < tau_p = 0.002 for nearly every token, so nearly "
        "every positive-advantage token is an S2T candidate (the *candidates* column) and the mask's work is its "
        "worst case, not a trained model's (the paper reports < 0.01 % of tokens silenced).",
        "",
        "## Ratios (median over paired units [min-max], n pairs)",
        "",
        "| geometry | ratio | step time | train-side time (step minus `generate`) | peak GPU memory (per run) |",
        "|---|---|---|---|---|",
    ]
    for geometry, g in summary.items():
        for name, r in g["ratios"].items():
            lines.append(
                f"| {geometry} | {name} | {_fmt_ratios(r['step'])} | {_fmt_ratios(r['train_side'])} | "
                f"{_fmt_ratios(r['peak'])} |"
            )
    lines += [
        "",
        "## Per arm (medians over timed units)",
        "",
        "| geometry | arm | s / step | train-side s / step | `generate` share | mask share | token records share "
        "| grad forwards / step (passes over the step's completions) | no-grad forwards / step (passes) | peak GPU "
        "memory | allocated before `train()` | candidates / loss tokens | silenced / loss tokens | entropy (nats) | "
        "reward std | completion tokens |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for geometry, g in summary.items():
        for arm, a in g["per_arm"].items():
            lines.append(
                f"| {geometry} | {arm} | {a['step_seconds']:.3f} | {a['train_side_seconds']:.3f} | "
                f"{_pct(a['generate_share'])} | {_pct(a['mask_share']) if arm != 'GRPO' else '-'} | "
                f"{_pct(a['records_share']) if arm != 'GRPO' else '-'} | "
                f"{a['grad_forwards']:.2f} ({a['grad_passes']:.2f}) | {a['nograd_forwards']:.2f} "
                f"({a['nograd_passes']:.2f}) | {fmt_bytes(a['peak_bytes'])} | {fmt_bytes(a['start_bytes'])} | "
                f"{_pct(a['candidate_ratio'])} | {_pct(a['silenced_ratio'])} | "
                f"{_num(a['entropy'], '.3f')} | {_num(a['reward_std'], '.3f')} | {_num(a['completion_length'], '.1f')} |"
            )
    lines += [
        "",
        "*mask share*: time inside `_compute_s2t_mask` (the core's `s2t_mask`, the product's diagnostics and its token "
        "records), CUDA synchronised, over the step time of the timed units; *token records share*: "
        "`SpuriousTokenLogger.record` alone (inside the mask share). Forwards: calls of the model's forward with TRL's "
        "fused LM head (training and scoring; generation's incremental forwards are not counted), per optimizer step; "
        "in brackets the rows they scored over the completions of one optimizer step.",
        "",
        "## Token records held per process (`SpuriousTokenLogger`, largest over runs)",
        "",
        "| geometry | arm | pending records at most | pending, Python objects | pending, as JSON | label counters at "
        "the end | tokenizer byte table (entries) | spurious_tokens.jsonl |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for geometry, g in summary.items():
        for arm, a in g["per_arm"].items():
            recs = a["token_records"]
            if not recs:
                continue

            def most(key: str, recs=recs) -> int:
                return max(r[key] for r in recs)

            lines.append(
                f"| {geometry} | {arm} | {most('pending_max_records')} | {fmt_bytes(most('pending_max_bytes'))} | "
                f"{fmt_bytes(most('pending_max_json_bytes'))} | {fmt_bytes(most('counters_bytes'))} | "
                f"{fmt_bytes(most('token_bytes_table_bytes'))} ({most('token_bytes_table_entries'):,}) | "
                f"{fmt_bytes(most('file_bytes'))} |"
            )
    if result.get("mask"):
        lines += [
            "",
            "## `s2t_mask` alone on synthetic tensors (median of 5 calls after a warm-up)",
            "",
            "| tokens | candidates | dtypes (log p, H, A, loss mask) | time | ns / token | peak extra memory |",
            "|---|---|---|---|---|---|",
        ]
        for row in result["mask"]:
            t = statistics.median(row["seconds"])
            d = row["dtypes"]
            lines.append(
                f"| {row['num_tokens'] / 2**20:g} Mi | {row['num_candidates']:,} ({100 * row['candidate_fraction']:g} %) "
                f"| {d['logps']}, {d['entropies']}, {d['advantages']}, {d['loss_mask']} | {1e3 * t:.2f} ms | "
                f"{1e9 * t / row['num_tokens']:.2f} | {fmt_bytes(row['peak_extra_bytes'])} |"
            )
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
    parser.add_argument("--completions", type=int, help="completions per optimizer step (default 32; smoke 8)")
    parser.add_argument("--num-generations", type=int, default=8, help="completions per prompt (the paper's 8)")
    parser.add_argument("--completion-tokens", type=int, help="max_completion_length (default 128; smoke 8)")
    parser.add_argument("--prompt-tokens", type=int, help="tokens per prompt (default 32; smoke 8)")
    parser.add_argument("--reps", type=int, help="interleaved repetitions (default 3; smoke 1)")
    parser.add_argument("--warmup-units", type=int, default=1, help="rollout batches discarded per run")
    parser.add_argument("--timed-units", type=int, help="rollout batches timed per run (default 2; smoke 1)")
    parser.add_argument("--threads", type=int, help="torch threads, every arm (default 8; smoke 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mask-sizes", help="s2t_mask alone: Mi tokens (default 1,16,64; smoke 0.0625,0.25)")
    parser.add_argument("--max-seconds", type=float, default=330.0, help="no run starts that would end past this")
    parser.add_argument(
        "--reserve-seconds", type=float, help="kept for s2t_mask alone and the files (default 30; smoke 5)"
    )
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    smoke = args.cpu_smoke
    for name, full, small in (
        ("completions", 32, 8),
        ("completion_tokens", 128, 8),
        ("prompt_tokens", 32, 8),
        ("reps", 3, 1),
        ("timed_units", 2, 1),
        ("threads", 8, 1),
        ("mask_sizes", "1,16,64", "0.0625,0.25"),
        ("reserve_seconds", 30.0, 5.0),
    ):
        if getattr(args, name) is None:
            setattr(args, name, small if smoke else full)
    args.mask_sizes = [int(float(x) * 2**20) for x in str(args.mask_sizes).split(",")]
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
