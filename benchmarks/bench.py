#!/usr/bin/env python
"""Benchmarks of `stapo_trl`: what the S2T mask costs, how it scales, and what it does to learning.

    make bench                                            # every section, ~8-15 min on 2 shared CPU cores
    .venv/bin/python benchmarks/bench.py --quick          # smoke run of every section at toy sizes, ~3 min
    .venv/bin/python benchmarks/bench.py --sections mask  # one or more of: overhead, mask, learning, gpu

Sections (each writes one Markdown table; all tables go to stdout and to `benchmarks/results/<date>.md`, the raw
numbers to `<date>.json`; `--quick` writes `<date>-quick.*`):

1. `overhead`: [`~stapo_trl.STAPOTrainer`] against a plain [`~trl.GRPOTrainer`] on the CPU demo
   (`recipes/demo/{grpo,stapo}.yaml`, builtin:tiny-math), same seed and batch geometry, for both `s2t_scope`
   values, `steps_per_generation` equal to and 4x `gradient_accumulation_steps`, with and without
   `STAPOConfig.s2t_diagnostics`. Every configuration gets a freshly built trainer (build not timed) and runs the
   same number of optimizer steps; configurations are interleaved within each repetition (the order rotates), and
   each STAPO time is divided by the GRPO time of the same repetition; the table gives the median ratio over
   repetitions and its range. Times: CPU time (`time.process_time`, the targets' measure: the cores are shared)
   and wall time of `trainer.train()`, and the sum of TRL's own `step_time` metric.
   Memory: one extra, untimed run per configuration under the torch profiler (see "Memory measurement" below).
2. `mask`: [`~stapo_trl.s2t_mask`] alone on 1M / 16M / 64M tokens with 0.1 % and 5 % candidates, against a naive
   implementation (`probs = logps.exp()`, `torch.quantile` over the candidates' entropies), plus one size past
   2**24 candidates, where `torch.quantile` raises.
3. `learning`: GRPO vs STAPO on the demo task over seeds, at the demo learning rate and at a destabilising one:
   held-out avg@k after training and the standard deviation of the logged policy entropy over the second half.
   Shrunk for time (fewer steps and held-out problems than `make demo`; the table says how much).
4. `gpu`: a Qwen3-0.6B-shaped model (random weights from `transformers.Qwen3Config`, no download) with and
   without STAPO: completion tokens per second and peak GPU memory. Runs only when `torch.cuda.is_available()`.

Memory measurement (CPU). PyTorch has no peak-memory counter for CPU tensors, so allocations are read from the
torch profiler (`profile_memory=True`): every allocation and free made by the c10 CPU allocator while profiling,
in time order. Peak = the maximum of their running sum (bytes of tensors allocated inside the measured call and
still alive, outputs included); largest = the biggest single allocation. Limits: it sees torch tensors only (not
Python objects, tokenizers or numpy), and frees of tensors allocated before profiling started are not reported,
so the peak is an upper bound of the growth above the starting level. Peak RSS growth (`VmHWM` after resetting it
through `/proc/self/clear_refs`, minus `VmRSS` before) is reported next to it; on a 142k-parameter model it is
dominated by Python and allocator caching and is only a sanity check.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import math
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any


# Before torch is imported: one OpenMP thread (a tiny model gains nothing from threads, and on shared cores two
# threads waiting on each other thrash), no Hub access, quiet tokenizers.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402 (after the environment variables above)


REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "benchmarks" / "results"
GRPO_RECIPE = "recipes/demo/grpo.yaml"
STAPO_RECIPE = "recipes/demo/stapo.yaml"
QUANTILE_LIMIT = 2**24  # torch.quantile raises above this many elements (pytorch#64947)

# Targets from the benchmark issue: time ratios against GRPOTrainer, peak-memory ratio.
TIME_TARGET = 1.03
MEMORY_TARGET = 1.05


# ---------------------------------------------------------------------------------------------------------------
# Measurement helpers
# ---------------------------------------------------------------------------------------------------------------


def median_range(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max) of a non-empty list."""
    return statistics.median(values), min(values), max(values)


def fmt_ratio(values: list[float]) -> str:
    if not values:
        return "-"
    mid, lo, hi = median_range(values)
    return f"{mid:.3f} [{lo:.2f}-{hi:.2f}]" if len(values) > 1 else f"{mid:.3f}"


def fmt_bytes(n: float) -> str:
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def torch_cpu_allocations(fn):
    """Run `fn()` under the torch profiler and return `(result, peak_bytes, largest_bytes)` of its CPU allocations.

    Peak is the maximum running sum of the allocator's alloc (+) and free (-) events in time order; largest is the
    biggest single allocation. See the module docstring for what this does and does not see.
    """
    from torch.profiler import ProfilerActivity, profile

    with warnings.catch_warnings(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        warnings.simplefilter("ignore")
        result = fn()
    events = [
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    ]
    events.sort(key=lambda e: e[0])  # stable: ties keep the recorded order
    live = peak = largest = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
        largest = max(largest, nbytes)
    return result, peak, largest


def _proc_status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@contextlib.contextmanager
def rss_growth(record: dict):
    """Record `rss_growth_bytes` = peak RSS during the block (VmHWM, reset first) minus RSS before it (Linux)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        before = _proc_status_kb("VmRSS")
    except OSError:
        before = None
    yield
    peak = _proc_status_kb("VmHWM")
    record["rss_growth_bytes"] = None if before is None or peak is None else peak - before


def machine_info() -> dict[str, Any]:
    cpu_model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_total = _meminfo_total()
    info = {
        "cpu_model": cpu_model,
        "cores": os.cpu_count(),
        "cores_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_total_bytes": mem_total,
        "load_average_start": os.getloadavg(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    return info


def _meminfo_total() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def versions() -> dict[str, str]:
    import accelerate
    import transformers
    import trl

    import stapo_trl

    out = {
        "stapo_trl": getattr(stapo_trl, "__version__", "?"),
        "torch": torch.__version__,
        "trl": trl.__version__,
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
    }
    try:  # read-only git queries
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True)
        if rev.returncode == 0:
            out["git"] = rev.stdout.strip() + ("+uncommitted changes" if dirty.stdout.strip() else "")
    except OSError:
        pass
    return out


# ---------------------------------------------------------------------------------------------------------------
# Trainers from the demo recipes
# ---------------------------------------------------------------------------------------------------------------

_PREPARED: dict[str, Any] = {}


def build_trainer(recipe: str, overrides: list[str], *, diagnostics: bool = True, reward_funcs=None, workdir: str):
    """A trainer of `recipe` (a `recipes/demo` YAML) with command-line `overrides`, as `stapo-train` would build it.

    The recipe is parsed by `stapo_trl.cli.args.parse_args` (so the recipe stays the single source of the settings);
    the dataset and model path are prepared once per recipe and reused. Checkpointing and printing are off.
    `diagnostics=False` sets `s2t_diagnostics: false` (STAPOConfig).
    """
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOTrainer

    from stapo_trl.cli.train import parse_args, prepare
    from stapo_trl.trainer import STAPOTrainer

    output_dir = tempfile.mkdtemp(prefix="run-", dir=workdir)
    argv = ["--config", recipe, "--output_dir", output_dir, "--save_strategy", "no", "--report_to", "none"]
    argv += ["--disable_tqdm", "true", *overrides]
    if not diagnostics:
        argv += ["--s2t_diagnostics", "false"]
    script_args, training_args, model_args = parse_args(argv)
    key = f"{recipe}|{model_args.model_name_or_path}"
    if key not in _PREPARED:
        _PREPARED[key] = prepare(script_args, training_args, model_args)
    run = _PREPARED[key]
    training_args.model_init_kwargs = {"dtype": model_args.dtype}
    trainer_class = GRPOTrainer if script_args.trainer == "grpo" else STAPOTrainer
    trainer = trainer_class(
        model=run.model_path,
        reward_funcs=reward_funcs if reward_funcs is not None else run.reward_funcs,
        args=training_args,
        train_dataset=run.train_dataset,
    )
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer, run


class Probe:
    """Counts the policy's scoring forwards (TRL's fused-LM-head calls) and times the S2T-specific methods.

    `nograd_rows` / `grad_rows`: completions scored without / with gradient (generation forwards are not counted:
    they do not use the fused head). `mask_seconds`: time in `STAPOTrainer._build_s2t_mask` (the mask, its metrics
    and the diagnostics). `extra_forward_seconds`: time in `STAPOTrainer._policy_logps_and_entropies`, the no-grad
    forward the generation_batch scope runs when TRL computed no old log-probs.
    """

    def __init__(self, trainer):
        from stapo_trl.trainer import STAPOTrainer

        self.nograd_rows = self.grad_rows = 0
        self.mask_seconds = self.extra_forward_seconds = 0.0
        trainer.model.register_forward_hook(self._hook, with_kwargs=True)
        if isinstance(trainer, STAPOTrainer):
            self._time(trainer, "_build_s2t_mask", "mask_seconds")
            self._time(trainer, "_policy_logps_and_entropies", "extra_forward_seconds")

    def _hook(self, module, args, kwargs, output):
        if kwargs.get("fused_lm_head"):
            rows = kwargs["input_ids"].size(0)
            if torch.is_grad_enabled():
                self.grad_rows += rows
            else:
                self.nograd_rows += rows

    def _time(self, trainer, method: str, counter: str) -> None:
        bound = getattr(trainer, method)

        def timed(*args, **kwargs):
            start = time.process_time()
            try:
                return bound(*args, **kwargs)
            finally:
                setattr(self, counter, getattr(self, counter) + time.process_time() - start)

        setattr(trainer, method, timed)  # instance attribute: the trainer's own calls go through it


# ---------------------------------------------------------------------------------------------------------------
# Section 1: step time and memory of STAPOTrainer vs GRPOTrainer
# ---------------------------------------------------------------------------------------------------------------

OVERHEAD_ARMS = [
    # (label, recipe, s2t_scope, diagnostics)
    ("GRPO", GRPO_RECIPE, None, None),
    ("STAPO", STAPO_RECIPE, "generation_batch", True),
    ("STAPO", STAPO_RECIPE, "generation_batch", False),
    ("STAPO", STAPO_RECIPE, "micro_batch", True),
    ("STAPO", STAPO_RECIPE, "micro_batch", False),
]


def _overhead_overrides(spg: int, grad_accum: int, steps: int, scope: str | None, seed: int) -> list[str]:
    overrides = ["--max_steps", str(steps), "--seed", str(seed), "--logging_steps", "1"]
    overrides += ["--steps_per_generation", str(spg), "--gradient_accumulation_steps", str(grad_accum)]
    if scope is not None:
        overrides += ["--s2t_scope", scope]
    return overrides


def _configs(args) -> list[dict]:
    grad_accum = 1  # the demo recipe's value
    configs = []
    for spg in (grad_accum, 4 * grad_accum):
        for label, recipe, scope, diagnostics in OVERHEAD_ARMS:
            configs.append(
                dict(
                    label=label,
                    recipe=recipe,
                    scope=scope,
                    diagnostics=diagnostics,
                    spg=spg,
                    grad_accum=grad_accum,
                    key=f"{label}|{scope}|{diagnostics}|{spg}",
                )
            )
    return configs


def run_overhead(args, workdir: str) -> dict:
    configs = _configs(args)
    steps = args.overhead_steps
    runs: dict[str, list[dict]] = {c["key"]: [] for c in configs}
    # Untimed warm-up: the first train() of a process pays one-off costs (lazy imports, first kernels).
    trainer, _ = build_trainer(GRPO_RECIPE, _overhead_overrides(4, 1, 4, None, args.seed), workdir=workdir)
    trainer.train()
    del trainer
    # One block per geometry, so that each STAPO run is compared with a GRPO run made seconds apart; inside a
    # block the order rotates with the repetition, so no configuration always runs first or last.
    blocks = [[c for c in configs if c["spg"] == spg] for spg in sorted({c["spg"] for c in configs})]
    for rep in range(args.reps):
        order = []
        for block in blocks:
            shift = rep % len(block)
            order += block[shift:] + block[:shift]
        for config in order:
            trainer, _ = build_trainer(
                config["recipe"],
                _overhead_overrides(config["spg"], config["grad_accum"], steps, config["scope"], args.seed),
                diagnostics=bool(config["diagnostics"]),
                workdir=workdir,
            )
            probe = Probe(trainer)
            start, cpu_start = time.perf_counter(), time.process_time()
            trainer.train()
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
            step_times = [h["step_time"] for h in trainer.state.log_history if "step_time" in h]
            generation_batch = trainer.args.per_device_train_batch_size * trainer.args.steps_per_generation
            num_generations = math.ceil(steps / trainer.args.steps_per_generation)
            runs[config["key"]].append(
                dict(
                    wall=wall,
                    cpu=cpu,
                    step_time_sum=sum(step_times),
                    nograd_passes=probe.nograd_rows / (generation_batch * num_generations),
                    mask_seconds=probe.mask_seconds,
                    extra_forward_seconds=probe.extra_forward_seconds,
                )
            )
            print(
                f"  overhead rep {rep + 1}/{args.reps} {config['key']:<40} wall {wall:6.2f} s  cpu {cpu:6.2f} s  "
                f"step_time {sum(step_times):6.2f} s  load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            del trainer

    # Memory: one untimed, profiled run per configuration, after a discarded one (the first profiled run of a
    # process allocates the profiler's own buffers, which shows in RSS).
    trainer, _ = build_trainer(GRPO_RECIPE, _overhead_overrides(4, 1, 4, None, args.seed), workdir=workdir)
    torch_cpu_allocations(trainer.train)
    del trainer
    memory: dict[str, dict] = {}
    for config in configs:
        trainer, _ = build_trainer(
            config["recipe"],
            _overhead_overrides(config["spg"], config["grad_accum"], args.memory_steps, config["scope"], args.seed),
            diagnostics=bool(config["diagnostics"]),
            workdir=workdir,
        )
        record: dict[str, Any] = {}
        with rss_growth(record):
            _, peak, largest = torch_cpu_allocations(trainer.train)
        record.update(torch_peak_bytes=peak, torch_largest_bytes=largest)
        memory[config["key"]] = record
        print(
            f"  memory {config['key']:<40} torch peak {fmt_bytes(peak)}  RSS growth "
            f"{fmt_bytes(record['rss_growth_bytes'])}",
            flush=True,
        )
        del trainer

    # Ratios against GRPO of the same repetition and geometry.
    rows = []
    for config in configs:
        base_key = f"GRPO|None|None|{config['spg']}"
        own, base = runs[config["key"]], runs[base_key]
        wall_ratios = [o["wall"] / b["wall"] for o, b in zip(own, base, strict=True)]
        cpu_ratios = [o["cpu"] / b["cpu"] for o, b in zip(own, base, strict=True)]
        step_ratios = [o["step_time_sum"] / b["step_time_sum"] for o, b in zip(own, base, strict=True)]
        base_wall = statistics.median(b["wall"] for b in base)
        base_cpu = statistics.median(b["cpu"] for b in base)
        mask_share = statistics.median(o["mask_seconds"] / b["cpu"] for o, b in zip(own, base, strict=True))
        forward_share = statistics.median(
            o["extra_forward_seconds"] / b["cpu"] for o, b in zip(own, base, strict=True)
        )
        mem, base_mem = memory[config["key"]], memory[base_key]
        rows.append(
            dict(
                config={k: config[k] for k in ("label", "scope", "diagnostics", "spg", "grad_accum")},
                wall_ratios=wall_ratios,
                cpu_ratios=cpu_ratios,
                grpo_cpu_median_s=base_cpu,
                step_time_ratios=step_ratios,
                grpo_wall_median_s=base_wall,
                nograd_passes=statistics.median(o["nograd_passes"] for o in own),
                mask_share=mask_share,
                extra_forward_share=forward_share,
                torch_peak_bytes=mem["torch_peak_bytes"],
                torch_peak_ratio=mem["torch_peak_bytes"] / base_mem["torch_peak_bytes"],
                torch_peak_diff_bytes=mem["torch_peak_bytes"] - base_mem["torch_peak_bytes"],
                torch_largest_bytes=mem["torch_largest_bytes"],
                rss_growth_bytes=mem["rss_growth_bytes"],
                raw=own,
            )
        )
    return dict(rows=rows, steps=steps, memory_steps=args.memory_steps, reps=args.reps)


def _overhead_target(row: dict) -> tuple[str, bool | None]:
    """The issue's target for this configuration and whether the median CPU-time ratio meets it."""
    config = row["config"]
    if config["label"] == "GRPO":
        return "baseline", None
    ratio = statistics.median(row["cpu_ratios"])
    if config["scope"] == "micro_batch" or config["spg"] > config["grad_accum"]:
        return f"<= {TIME_TARGET}", ratio <= TIME_TARGET
    # generation_batch scope, no old log-probs from TRL: allowed exactly one extra no-grad forward.
    allowed = TIME_TARGET + row["extra_forward_share"]
    ok = ratio <= allowed and round(row["nograd_passes"], 2) == 1.0
    return f"1 no-grad fwd: <= {allowed:.3f}", ok


def overhead_table(result: dict) -> str:
    lines = [
        "| spg / GA | trainer | s2t_scope | diagnostics | CPU-time ratio, median [range] | wall ratio | "
        "step_time ratio | no-grad passes / gen. batch | mask share | extra-fwd share | target (CPU time) | met | "
        "torch peak | peak ratio (<= 1.05) | peak diff | largest alloc | RSS growth |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        c = row["config"]
        target, ok = _overhead_target(row)
        is_base = c["label"] == "GRPO"
        lines.append(
            "| {spg}/{ga} | {label} | {scope} | {diag} | {cpu} | {wall} | {step} | {passes:.2f} | {mask} | {fwd} | "
            "{target} | "
            "{ok} | {peak} | {pratio} | {pdiff} | {largest} | {rss} |".format(
                spg=c["spg"],
                ga=c["grad_accum"],
                label=c["label"],
                scope=c["scope"] or "-",
                diag="-" if c["diagnostics"] is None else ("on" if c["diagnostics"] else "off"),
                cpu=f"1 ({row['grpo_cpu_median_s']:.2f} s)" if is_base else fmt_ratio(row["cpu_ratios"]),
                wall=f"1 ({row['grpo_wall_median_s']:.2f} s)" if is_base else fmt_ratio(row["wall_ratios"]),
                step="1" if is_base else fmt_ratio(row["step_time_ratios"]),
                passes=row["nograd_passes"],
                mask="-" if is_base else f"{100 * row['mask_share']:.1f} %",
                fwd="-" if is_base else f"{100 * row['extra_forward_share']:.1f} %",
                target=target,
                ok="" if ok is None else ("yes" if ok else "no"),
                peak=fmt_bytes(row["torch_peak_bytes"]),
                pratio="1" if is_base else f"{row['torch_peak_ratio']:.3f}",
                pdiff="-" if is_base else f"{row['torch_peak_diff_bytes'] / 1e6:+.2f} MB",
                largest=fmt_bytes(row["torch_largest_bytes"]),
                rss=fmt_bytes(row["rss_growth_bytes"]),
            )
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# Section 2: s2t_mask alone, against a naive torch.quantile implementation
# ---------------------------------------------------------------------------------------------------------------


def naive_s2t_keep(per_token_logps, entropies, advantages, loss_mask, prob_threshold=0.002, entropy_quantile=0.75):
    """The obvious implementation: a float probability copy and `torch.quantile` (raises above 2**24 candidates)."""
    with torch.no_grad():
        probs = per_token_logps.exp()  # (B, T) float copy
        candidate = loss_mask.bool() & (advantages.view(-1, 1) > 0) & (probs < prob_threshold)  # (B, T)
        candidate_entropies = entropies[candidate]
        if candidate_entropies.numel() == 0:
            return torch.ones_like(candidate)
        tau_h = torch.quantile(candidate_entropies, entropy_quantile)
        return ~(candidate & (entropies < tau_h))


def make_mask_inputs(num_tokens: int, candidate_fraction: float, seq_len: int = 4096, seed: int = 0):
    """Synthetic (B, T) inputs with `candidate_fraction` of all tokens being S2T candidates.

    Half the rows have a positive advantage; in every row a random 2 x `candidate_fraction` of positions get a
    log-probability below log(0.002), so candidates = positive rows x low-probability positions. Entropies are
    uniform in [0, 3) nats. The loss mask is a bool tensor (TRL's int64 mask would add one bool conversion).
    """
    batch = num_tokens // seq_len
    generator = torch.Generator().manual_seed(seed)
    per_token_logps = torch.rand(batch, seq_len, generator=generator).mul_(-3.0)  # p in (0.05, 1]
    low = torch.rand(batch, seq_len, generator=generator) < 2 * candidate_fraction
    per_token_logps[low] -= 7.0  # p < e^-7 < 0.002
    del low
    entropies = torch.rand(batch, seq_len, generator=generator).mul_(3.0)
    advantages = torch.where(torch.arange(batch) % 2 == 0, 1.0, -1.0)  # (B,)
    loss_mask = torch.ones(batch, seq_len, dtype=torch.bool)
    return per_token_logps, entropies, advantages, loss_mask


def _timed(fn, reps: int) -> tuple[list[float], Any]:
    times, result = [], None
    for _ in range(reps):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times, result


def run_mask(args) -> dict:
    from stapo_trl.s2t import linear_quantile, s2t_mask

    cases = [(n, f) for n in args.mask_sizes for f in args.mask_fractions]
    cases.append((args.mask_sizes[-1], args.mask_overflow_fraction))  # past 2**24 candidates
    rows = []
    for num_tokens, fraction in cases:
        inputs = make_mask_inputs(num_tokens, fraction)
        input_bytes = sum(t.numel() * t.element_size() for t in inputs)
        stapo_fn = functools.partial(s2t_mask, *inputs)
        naive_fn = functools.partial(naive_s2t_keep, *inputs)
        times, result = _timed(stapo_fn, args.mask_reps)
        _, peak, largest = torch_cpu_allocations(stapo_fn)
        row = dict(
            num_tokens=inputs[0].numel(),
            candidate_fraction=fraction,
            num_candidates=result.num_candidates,
            input_bytes=input_bytes,
            s2t_seconds=times,
            s2t_peak_bytes=peak,
            s2t_largest_bytes=largest,
        )
        try:
            naive_times, naive_keep = _timed(naive_fn, args.mask_reps)
            _, naive_peak, naive_largest = torch_cpu_allocations(naive_fn)
            row.update(
                naive_seconds=naive_times,
                naive_peak_bytes=naive_peak,
                naive_largest_bytes=naive_largest,
                naive_status="ok",
                same_keep=bool(torch.equal(naive_keep, result.keep)),
            )
        except RuntimeError as e:
            row.update(naive_status=f"RuntimeError: {e}".splitlines()[0])
        rows.append(row)
        print(
            f"  mask {row['num_tokens'] / 1e6:5.1f}M tokens, {100 * fraction:g} % candidates: s2t "
            f"{statistics.median(times):.3f} s, naive {row['naive_status']}",
            flush=True,
        )
        del inputs, result, stapo_fn, naive_fn

    # Exactly where torch.quantile stops: 2**24 elements work, 2**24 + 1 raise; linear_quantile takes both.
    boundary = []
    for n in (QUANTILE_LIMIT, QUANTILE_LIMIT + 1):
        values = torch.rand(n, generator=torch.Generator().manual_seed(0))
        start = time.perf_counter()
        try:
            torch.quantile(values, 0.75)
            status = f"ok ({time.perf_counter() - start:.2f} s)"
        except RuntimeError as e:
            status = f"RuntimeError: {e}".splitlines()[0]
        start = time.perf_counter()
        linear_quantile(values, 0.75)
        boundary.append(dict(n=n, torch_quantile=status, linear_quantile_seconds=time.perf_counter() - start))
        del values
    return dict(rows=rows, boundary=boundary, reps=args.mask_reps)


def mask_table(result: dict) -> str:
    lines = [
        "| tokens | candidates | s2t_mask time, median | ns / token | s2t peak alloc (B / token) | s2t largest "
        "alloc (B / token) | naive time | naive peak alloc (B / token) | naive largest alloc (B / token) | "
        "same keep mask |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        n = r["num_tokens"]
        s2t_time = statistics.median(r["s2t_seconds"])
        if r["naive_status"] == "ok":
            naive = (
                f"{statistics.median(r['naive_seconds']):.3f} s",
                f"{fmt_bytes(r['naive_peak_bytes'])} ({r['naive_peak_bytes'] / n:.2f})",
                f"{fmt_bytes(r['naive_largest_bytes'])} ({r['naive_largest_bytes'] / n:.2f})",
                "yes" if r["same_keep"] else "NO",
            )
        else:
            naive = (f"fails: {r['naive_status']}", "-", "-", "-")
        past_limit = " **> 2^24**" if r["num_candidates"] > QUANTILE_LIMIT else ""
        stapo = (
            f"{n / 2**20:g} Mi ({n:,})",
            f"{100 * r['candidate_fraction']:g} % ({r['num_candidates']:,}){past_limit}",
            f"{s2t_time:.3f} s",
            f"{1e9 * s2t_time / n:.1f}",
            f"{fmt_bytes(r['s2t_peak_bytes'])} ({r['s2t_peak_bytes'] / n:.2f})",
            f"{fmt_bytes(r['s2t_largest_bytes'])} ({r['s2t_largest_bytes'] / n:.2f})",
        )
        lines.append("| " + " | ".join(stapo + naive) + " |")
    boundary = "; ".join(
        f"n = {b['n']:,}: torch.quantile {b['torch_quantile']}, linear_quantile {b['linear_quantile_seconds']:.2f} s"
        for b in result["boundary"]
    )
    return "\n".join(lines) + f"\n\nQuantile boundary (1-D tensors): {boundary}."


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

    from stapo_trl.builtin import resolve_model_path

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
        ("STAPO generation_batch", STAPO_RECIPE, ["--s2t_scope", "generation_batch"]),
        ("STAPO micro_batch", STAPO_RECIPE, ["--s2t_scope", "micro_batch"]),
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


# ---------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------


def builtin_info() -> dict:
    """The build record of builtin:tiny-math, and whether it matches the build settings of this checkout.

    The cache folder is keyed by name and version only, so a cache filled by another checkout (or by an earlier
    recipe under the same version) is reused silently; the bench says so instead of benchmarking a different model.
    """
    from stapo_trl.builtin import BUILTIN_MODELS, SFT_CONFIG, read_builtin_info, resolve_model_path

    path = resolve_model_path("builtin:tiny-math")
    info = read_builtin_info(path)
    sft = info.get("sft", {})
    expected = dict(SFT_CONFIG, steps=BUILTIN_MODELS["tiny-math"]["sft_steps"])
    mismatches = {k: (sft[k], v) for k, v in expected.items() if k in sft and sft[k] != v}
    if mismatches:
        print(
            f"WARNING: the cached builtin:tiny-math at {path} was built with other settings than this checkout's "
            f"stapo_trl/builtin.py (cached, expected): {mismatches}. Use --model-cache DIR for a fresh build.",
            flush=True,
        )
    return dict(
        path=path,
        num_parameters=info.get("model", {}).get("num_parameters"),
        vocab_size=info.get("tokenizer", {}).get("vocab_size"),
        sft_steps=sft.get("steps"),
        sft_learning_rate=sft.get("learning_rate"),
        sampled_accuracy=info.get("eval", {}).get("sampled_accuracy"),
        matches_checkout=not mismatches,
        mismatches=mismatches,
    )


def write_report(path: Path, header: dict, sections: dict[str, str], raw: dict) -> str:
    m, v = header["machine"], header["versions"]
    load_start = ", ".join(f"{x:.2f}" for x in m["load_average_start"])
    load_end = ", ".join(f"{x:.2f}" for x in header["load_average_end"])
    lines = [
        f"# stapo_trl benchmarks, {header['date']}",
        "",
        f"- Command: `{header['command']}` ({header['elapsed_s'] / 60:.1f} min)",
        f"- Machine: {m['cpu_model']}, {m['cores_available']} cores available ({m['cores']} online), "
        f"{fmt_bytes(m['memory_total_bytes'])} RAM, GPU: {m['gpu'] or 'none'}; torch threads: {m['torch_threads']}",
        f"- Load average (1, 5, 15 min) at start: {load_start}; at end: {load_end} (the machine is shared: absolute "
        "times are noisy, ratios are taken within one repetition)",
        f"- Versions: stapo_trl {v['stapo_trl']} ({v.get('git', 'no git')}), torch {v['torch']}, trl {v['trl']}, "
        f"transformers {v['transformers']}, accelerate {v['accelerate']}, Python {m['python']}",
    ]
    if header.get("builtin"):
        b = header["builtin"]
        lines.append(
            f"- Model: builtin:tiny-math, {b['num_parameters']:,} parameters, {b['vocab_size']}-token vocabulary, "
            f"SFT {b['sft_steps']} steps at lr {b['sft_learning_rate']:g}, sampled accuracy at build "
            f"{100 * b['sampled_accuracy']:.1f} % (300 held-out problems, T = 1.0), from `{b['path']}`"
            + (
                ""
                if b["matches_checkout"]
                else f" **(stale: built with other settings than this checkout: {b['mismatches']})**"
            )
        )
    lines.append("")
    lines += [text + "\n" for text in sections.values()]
    report = "\n".join(lines) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report)
    path.with_suffix(".json").write_text(json.dumps(raw, indent=2, default=str) + "\n")
    return report


def section_texts(args, results: dict) -> dict[str, str]:
    texts = {}
    if "overhead" in results:
        r = results["overhead"]
        texts["overhead"] = (
            "## 1. Step time and peak memory, STAPOTrainer / GRPOTrainer\n\n"
            f"Demo recipes (`{GRPO_RECIPE}`, `{STAPO_RECIPE}`), builtin:tiny-math, 16 completions per optimizer "
            f"step, seed {args.seed}; {r['steps']} optimizer steps per run, {r['reps']} interleaved repetitions. "
            "Ratios: STAPO / GRPO of the same repetition, median [min-max]. *CPU time*: `time.process_time()` "
            "around `trainer.train()` (model build excluded); it is the target's measure because it counts only "
            "this process's work, while wall time also counts waiting for the other jobs on the shared cores. "
            "*wall*: wall time of the same call; *step_time*: sum of TRL's `step_time` metric (wall; generation "
            "included, optimizer step excluded). *no-grad passes*: no-grad scoring forwards over each generation "
            "batch (TRL's old log-probs + S2T's own). *mask share* / *extra-fwd share*: CPU time inside "
            "`_build_s2t_mask` (mask, metrics, diagnostics) / inside the generation_batch scope's own no-grad "
            "forward, as a share of GRPO's CPU time. Targets: micro_batch and spg > GA <= 1.03; generation_batch "
            "with spg = GA: one no-grad forward (measured) + 0.03. "
            "Memory: one extra run of "
            f"{r['memory_steps']} steps per configuration; *torch peak*: peak of live torch CPU allocations during "
            "`train()` (torch profiler, see the harness docstring); *RSS growth*: peak RSS minus RSS before "
            "`train()` (dominated by Python and allocator caching at this model size).\n\n" + overhead_table(r)
        )
    if "mask" in results:
        texts["mask"] = (
            "## 2. `s2t_mask` alone vs a naive `torch.quantile` implementation\n\n"
            "Synthetic float32 (B, 4096) log-probs and entropies, bool loss mask, (B,) advantages (half positive); "
            f"median of {results['mask']['reps']} calls, 1 torch thread. Memory: one profiled call; *peak alloc*: "
            "peak of live torch CPU allocations made inside the call (outputs included: `keep`, `candidate`, "
            "`silenced` are three bool (B, T) masks = 3 B/token); *largest alloc*: the biggest single allocation "
            "(1 B/token = a bool (B, T) mask, 4 B/token = a float32 (B, T) copy). The inputs are "
            "9 B/token (two float32 tensors and a bool mask). Naive: `p = logps.exp()` then "
            "`torch.quantile(entropies[candidate], q)`.\n\n" + mask_table(results["mask"])
        )
    if "learning" in results:
        r = results["learning"]
        texts["learning"] = (
            "## 3. Learning on the demo task, GRPO vs STAPO\n\n"
            "Demo recipes with `--max_steps` and `--learning_rate` overridden; "
            f"seeds {', '.join(map(str, args.seeds))}. "
            f"Shrunk from `make demo` (500 steps, avg@4 on 300 problems) to fit the time budget: {args.learn_steps} "
            f"steps at lr {args.demo_lr:g}, {args.high_lr_steps} steps at lr {args.high_lr:g} (ENVIRONMENT.md: "
            f"the tiny model collapses within 10-30 steps at 6e-4 and 1e-3), held-out avg@{r['eval_samples']} on the "
            f"first {r['eval_problems']} test problems (T = 1.0). Entropy: TRL's logged `entropy` (mean over loss "
            "tokens, one value per logging step of 4 optimizer steps = one generation batch), std over the "
            "logging steps of the second half.\n\n" + learning_table(r)
        )
    if "gpu" in results or "gpu" in args.sections:
        gpu = results.get("gpu")
        on_cpu = gpu is not None and gpu["device"].startswith("cpu")
        precision = "float32, 2 small layers (a CPU smoke test of the code path)" if on_cpu else "bf16"
        note = (
            f"Qwen3-0.6B-shaped model, random weights (no download), {precision}, "
            f"{gpu['steps']} optimizer steps, "
            f"{gpu['completion_length']} new tokens, random 0/1 reward, demo batch geometry; "
            "tokens/s = completion tokens generated / `train()` wall time; peak = `torch.cuda.max_memory_allocated`."
            if gpu
            else "Code path: `run_gpu` (Qwen3-0.6B shape from `transformers.Qwen3Config`, random weights, bf16, "
            "GRPO and STAPO with both scopes); it runs only when `torch.cuda.is_available()`."
        )
        texts["gpu"] = "## 4. GPU\n\n" + note + "\n\n" + gpu_table(gpu)
    return texts


# ---------------------------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------------------------

SECTIONS = ("overhead", "mask", "learning", "gpu")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="benchmarks/bench.py", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    parser.add_argument("--quick", action="store_true", help="toy sizes for every section (a smoke test, ~3 min)")
    parser.add_argument("--output", help="Markdown file (default benchmarks/results/<date>[-quick].md)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the overhead runs")
    parser.add_argument(
        "--model-cache", help="cache folder of builtin: models (sets STAPO_TRL_CACHE; default ~/.cache/stapo_trl)"
    )
    # overhead
    parser.add_argument("--reps", type=int, help="overhead: interleaved repetitions (default 7; quick 2)")
    parser.add_argument("--overhead-steps", type=int, help="overhead: optimizer steps per run (default 8; quick 4)")
    parser.add_argument("--memory-steps", type=int, default=4, help="overhead: steps of the profiled memory run")
    # mask
    parser.add_argument("--mask-sizes", help="mask: token counts in Mi (default 1,16,64; quick 1,4)")
    parser.add_argument("--mask-fractions", default="0.001,0.05", help="mask: candidate fractions")
    parser.add_argument(
        "--mask-overflow-fraction",
        type=float,
        help="mask: candidate fraction of the extra row at the largest size "
        "(default 0.3: 19.2M candidates at 64 Mi tokens, past 2**24; quick 0.001)",
    )
    parser.add_argument("--mask-reps", type=int, help="mask: timed calls per case (default 3; quick 1)")
    # learning
    parser.add_argument("--seeds", help="learning: seeds (default 0,1,2; quick 0)")
    parser.add_argument("--learn-steps", type=int, help="learning: steps at the demo lr (default 300; quick 8)")
    parser.add_argument("--high-lr-steps", type=int, help="learning: steps at the high lr (default 60; quick 8)")
    parser.add_argument(
        "--demo-lr", type=float, default=1e-4, help="learning: the demo learning rate (recipes/demo/stapo.yaml)"
    )
    parser.add_argument(
        "--high-lr", type=float, default=6e-4, help="learning: a destabilising learning rate (lowest documented)"
    )
    parser.add_argument("--eval-problems", type=int, help="learning: held-out problems (default 200; quick 20)")
    parser.add_argument("--eval-samples", type=int, default=4, help="learning: samples per problem (avg@k)")
    # gpu
    parser.add_argument("--gpu-steps", type=int, default=8, help="gpu: optimizer steps per run")
    parser.add_argument("--gpu-reps", type=int, default=2, help="gpu: interleaved repetitions")
    parser.add_argument("--gpu-completion-length", type=int, default=256, help="gpu: max_completion_length")
    parser.add_argument(
        "--gpu-on-cpu", action="store_true", help="gpu: run the GPU code path on the CPU with a 2-layer model (a test)"
    )
    args = parser.parse_args(argv)

    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {unknown}; choose from {list(SECTIONS)}")
    quick = args.quick

    def default(name, full, small):
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)

    default("reps", 7, 2)
    default("overhead_steps", 8, 4)
    default("mask_sizes", "1,16,64", "1,4")
    default("mask_overflow_fraction", 0.3, 0.001)
    default("mask_reps", 3, 1)
    default("seeds", "0,1,2", "0")
    default("learn_steps", 300, 8)
    default("high_lr_steps", 60, 8)
    default("eval_problems", 200, 20)
    args.mask_sizes = [int(float(s) * 2**20) for s in str(args.mask_sizes).split(",")]
    args.mask_fractions = [float(f) for f in str(args.mask_fractions).split(",")]
    args.seeds = [int(s) for s in str(args.seeds).split(",")]
    if args.reps < 1 or args.mask_reps < 1:
        parser.error("--reps and --mask-reps must be >= 1")
    return args


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.model_cache:
        os.environ["STAPO_TRL_CACHE"] = args.model_cache
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    warnings.filterwarnings("ignore")
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    started = time.perf_counter()
    date = datetime.date.today().isoformat()
    header: dict[str, Any] = dict(
        date=date,
        command=shlex.join(["python", "benchmarks/bench.py", *argv]),
        machine=machine_info(),
        versions=versions(),
    )
    print(
        f"stapo_trl benchmarks {date}: sections {args.sections}; "
        f"load average {header['machine']['load_average_start']}"
    )
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="stapo-bench-") as workdir:
        if {"overhead", "learning"} & set(args.sections):
            header["builtin"] = builtin_info()
        # Cheapest and least load-sensitive first.
        if "mask" in args.sections:
            print("== mask", flush=True)
            results["mask"] = run_mask(args)
        if "overhead" in args.sections:
            print("== overhead", flush=True)
            results["overhead"] = run_overhead(args, workdir)
        if "learning" in args.sections:
            print("== learning", flush=True)
            results["learning"] = run_learning(args, workdir)
        if "gpu" in args.sections:
            if args.gpu_on_cpu:
                print("== gpu code path on the CPU (smoke test)", flush=True)
                results["gpu"] = run_gpu(args, workdir, on_cpu=True)
            elif torch.cuda.is_available():
                print("== gpu", flush=True)
                results["gpu"] = run_gpu(args, workdir)
            else:
                print("== gpu: not run (no GPU)", flush=True)
    header["load_average_end"] = os.getloadavg()
    header["elapsed_s"] = time.perf_counter() - started
    output = Path(args.output) if args.output else RESULTS_DIR / f"{date}{'-quick' if args.quick else ''}.md"
    report = write_report(
        output, header, section_texts(args, results), dict(header=header, args=vars(args), **results)
    )
    print("\n" + report)
    print(f"Written: {output} and {output.with_suffix('.json')}")


if __name__ == "__main__":
    main()
