"""Section 1 (`overhead`): step time and peak memory of STAPOTrainer against GRPOTrainer on the CPU demo."""

from __future__ import annotations

import math
import os
import statistics
import time
from typing import Any

from harness import (
    GRPO_RECIPE,
    PLAIN_GRPO_RECIPE,
    STAPO_RECIPE,
    TIME_TARGET,
    Probe,
    build_trainer,
    fmt_bytes,
    fmt_ratio,
    rss_growth,
    torch_cpu_allocations,
)


# ---------------------------------------------------------------------------------------------------------------
# Section 1: step time and memory of STAPOTrainer vs GRPOTrainer
# ---------------------------------------------------------------------------------------------------------------

OVERHEAD_ARMS = [
    # (label, recipe). "GRPO": plain trl.GRPOTrainer (the demo baseline run with `trainer: grpo`); "off": the
    # like-for-like twin, STAPOTrainer with s2t_mode off (recipes/demo/grpo.yaml); "STAPO": recipes/demo/stapo.yaml.
    ("GRPO", PLAIN_GRPO_RECIPE),
    ("off", GRPO_RECIPE),
    ("STAPO", STAPO_RECIPE),
]
# Targets: against GRPOTrainer in TRL's default geometry (the mask from the loss's own forward), against the off twin
# in the paper's geometry (steps_per_generation = 4 x GA, where plain GRPOTrainer is another objective).
DEFAULT_GEOMETRY_TARGET = 1.02


def _overhead_overrides(spg: int, grad_accum: int, steps: int, seed: int) -> list[str]:
    overrides = ["--max_steps", str(steps), "--seed", str(seed), "--logging_steps", "1"]
    return overrides + ["--steps_per_generation", str(spg), "--gradient_accumulation_steps", str(grad_accum)]


def _configs(args) -> list[dict]:
    grad_accum = 1  # the demo recipe's value
    return [
        dict(label=label, recipe=recipe, spg=spg, grad_accum=grad_accum, key=f"{label}|{spg}")
        for spg in (grad_accum, 4 * grad_accum)
        for label, recipe in OVERHEAD_ARMS
    ]


def run_overhead(args, workdir: str) -> dict:
    """Section 1: timed runs (interleaved repetitions), then one profiled memory run per configuration."""
    configs = _configs(args)
    runs = _timed_runs(args, workdir, configs)
    memory = _memory_runs(args, workdir, configs)
    return dict(
        rows=_ratio_rows(configs, runs, memory),
        steps=args.overhead_steps,
        memory_steps=args.memory_steps,
        reps=args.reps,
    )


def _timed_runs(args, workdir: str, configs: list[dict]) -> dict[str, list[dict]]:
    """Per configuration key, one record per repetition: wall and CPU time, TRL's step_time, S2T probe counters."""
    steps = args.overhead_steps
    runs: dict[str, list[dict]] = {c["key"]: [] for c in configs}
    # Untimed warm-up: the first train() of a process pays one-off costs (lazy imports, first kernels).
    trainer, _ = build_trainer(GRPO_RECIPE, _overhead_overrides(4, 1, 4, args.seed), workdir=workdir)
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
                _overhead_overrides(config["spg"], config["grad_accum"], steps, args.seed),
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
                    records_seconds=probe.records_seconds,
                )
            )
            print(
                f"  overhead rep {rep + 1}/{args.reps} {config['key']:<40} wall {wall:6.2f} s  cpu {cpu:6.2f} s  "
                f"step_time {sum(step_times):6.2f} s  load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            del trainer
    return runs


def _memory_runs(args, workdir: str, configs: list[dict]) -> dict[str, dict]:
    """Per configuration key: torch peak / largest CPU allocation and RSS growth of one profiled `train()`."""
    # Memory: one untimed, profiled run per configuration, after a discarded one (the first profiled run of a
    # process allocates the profiler's own buffers, which shows in RSS).
    trainer, _ = build_trainer(GRPO_RECIPE, _overhead_overrides(4, 1, 4, args.seed), workdir=workdir)
    torch_cpu_allocations(trainer.train)
    del trainer
    memory: dict[str, dict] = {}
    for config in configs:
        trainer, _ = build_trainer(
            config["recipe"],
            _overhead_overrides(config["spg"], config["grad_accum"], args.memory_steps, args.seed),
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
    return memory


def _ratio_rows(configs: list[dict], runs: dict[str, list[dict]], memory: dict[str, dict]) -> list[dict]:
    """One table row per configuration: ratios against GRPO of the same repetition and geometry."""
    # Ratios against GRPO of the same repetition and geometry.
    rows = []
    for config in configs:
        base_key = f"GRPO|{config['spg']}"
        own, base, twin = runs[config["key"]], runs[base_key], runs[f"off|{config['spg']}"]
        wall_ratios = [o["wall"] / b["wall"] for o, b in zip(own, base, strict=True)]
        cpu_ratios = [o["cpu"] / b["cpu"] for o, b in zip(own, base, strict=True)]
        step_ratios = [o["step_time_sum"] / b["step_time_sum"] for o, b in zip(own, base, strict=True)]
        base_wall = statistics.median(b["wall"] for b in base)
        base_cpu = statistics.median(b["cpu"] for b in base)
        mask_share = statistics.median(o["mask_seconds"] / b["cpu"] for o, b in zip(own, base, strict=True))
        records = [o.get("records_seconds", 0) / b["cpu"] for o, b in zip(own, base, strict=True)]
        mem, base_mem = memory[config["key"]], memory[base_key]
        rows.append(
            dict(
                config={k: config[k] for k in ("label", "spg", "grad_accum")},
                wall_ratios=wall_ratios,
                cpu_ratios=cpu_ratios,
                cpu_ratios_vs_off=[o["cpu"] / t["cpu"] for o, t in zip(own, twin, strict=True)],
                nograd_passes_off=statistics.median(t["nograd_passes"] for t in twin),
                grpo_cpu_median_s=base_cpu,
                step_time_ratios=step_ratios,
                grpo_wall_median_s=base_wall,
                nograd_passes=statistics.median(o["nograd_passes"] for o in own),
                mask_share=mask_share,
                records_share=statistics.median(records),
                torch_peak_bytes=mem["torch_peak_bytes"],
                torch_peak_ratio=mem["torch_peak_bytes"] / base_mem["torch_peak_bytes"],
                torch_peak_diff_bytes=mem["torch_peak_bytes"] - base_mem["torch_peak_bytes"],
                torch_largest_bytes=mem["torch_largest_bytes"],
                rss_growth_bytes=mem["rss_growth_bytes"],
                raw=own,
            )
        )
    return rows


def _overhead_target(row: dict) -> tuple[str, bool | None]:
    """The target of this configuration and whether the median CPU-time ratio meets it: STAPO against GRPOTrainer in
    TRL's default geometry, against its off twin where steps_per_generation > GA."""
    config = row["config"]
    if config["label"] in ("GRPO", "off"):
        return "baseline", None
    if config["spg"] == config["grad_accum"]:
        ratio = statistics.median(row["cpu_ratios"])
        return f"<= {DEFAULT_GEOMETRY_TARGET} vs GRPOTrainer", ratio <= DEFAULT_GEOMETRY_TARGET
    ratio = statistics.median(row["cpu_ratios_vs_off"])
    return f"<= {TIME_TARGET} vs off twin", ratio <= TIME_TARGET


def overhead_table(result: dict) -> str:
    lines = [
        "| spg / GA | trainer | CPU-time ratio vs off twin | CPU-time ratio vs GRPOTrainer, median [range] | "
        "wall ratio | step_time ratio | no-grad passes / gen. batch | mask share | token records share | "
        "target (CPU time) | met | "
        "torch peak | peak ratio (<= 1.03) | peak diff | largest alloc | RSS growth |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        c = row["config"]
        target, ok = _overhead_target(row)
        is_base = c["label"] == "GRPO"
        lines.append(
            "| {spg}/{ga} | {label} | {vs_off} | {cpu} | {wall} | {step} | {passes:.2f} | {mask} | {records} | {target} | "
            "{ok} | {peak} | {pratio} | {pdiff} | {largest} | {rss} |".format(
                spg=c["spg"],
                ga=c["grad_accum"],
                label=c["label"],
                vs_off="-" if is_base else fmt_ratio(row["cpu_ratios_vs_off"]),
                cpu=f"1 ({row['grpo_cpu_median_s']:.2f} s)" if is_base else fmt_ratio(row["cpu_ratios"]),
                wall=f"1 ({row['grpo_wall_median_s']:.2f} s)" if is_base else fmt_ratio(row["wall_ratios"]),
                step="1" if is_base else fmt_ratio(row["step_time_ratios"]),
                passes=row["nograd_passes"],
                mask="-" if is_base else f"{100 * row['mask_share']:.1f} %",
                records="-" if is_base else f"{100 * row.get('records_share', 0):.2f} %",
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


def section_text(args, r) -> str:
    """The Markdown section of the overhead results."""
    return (
        "## 1. Step time and peak memory, STAPOTrainer / its mask-off twin / GRPOTrainer\n\n"
        f"Demo recipes (`{STAPO_RECIPE}`; `{GRPO_RECIPE}`, the `s2t_mode: off` twin; and the same file run by plain "
        f"`trl.GRPOTrainer`), builtin:tiny-math, 16 completions per optimizer "
        f"step, seed {args.seed}; {r['steps']} optimizer steps per run, {r['reps']} interleaved repetitions. "
        "Ratios: each run / the off twin or GRPOTrainer of the same repetition, median [min-max]. *CPU time*: `time.process_time()` "
        "around `trainer.train()` (model build excluded); it is the target's measure because it counts only "
        "this process's work, while wall time also counts waiting for the other jobs on the shared cores. "
        "*wall*: wall time of the same call; *step_time*: sum of TRL's `step_time` metric (wall; generation "
        "included, optimizer step excluded). *no-grad passes*: no-grad scoring forwards over each generation "
        "batch (TRL's old log-probs + S2T's own). *mask share*: CPU time inside `_s2t_result` (the mask, its "
        "metrics and the product's diagnostics and token records), as a share of GRPO's CPU time; *token records "
        "share*: CPU time in `SpuriousTokenLogger.record` (inside the mask share) and `write_pending`, likewise. Targets: "
        f"<= {DEFAULT_GEOMETRY_TARGET} against GRPOTrainer in TRL's default geometry (spg = GA), <= {TIME_TARGET} "
        "against the off twin in the paper's (spg = 4 x GA). "
        "Memory: one extra run of "
        f"{r['memory_steps']} steps per configuration; *torch peak*: peak of live torch CPU allocations during "
        "`train()` (torch profiler, see the harness docstring); *RSS growth*: peak RSS minus RSS before "
        "`train()` (dominated by Python and allocator caching at this model size).\n\n" + overhead_table(r)
    )
