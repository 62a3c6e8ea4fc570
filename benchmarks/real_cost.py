#!/usr/bin/env python
"""What STAPO costs on real models: step time and peak memory against plain `GRPOTrainer` and the `s2t_mode: off`
twin, in TRL's default geometry and beyond.

    python benchmarks/real_cost.py --models builtin:smollm2-135m builtin:gemma3-270m --reps 3

Arms (the same recipe, `recipes/SmolLM2-135M/*.yaml`, with the model, batch and geometry below):
- `GRPO`: plain `trl.GRPOTrainer` (the twin recipe with `trainer: grpo` and no `s2t_*` keys), what a user runs now;
- `off`: `STAPOTrainer` with `s2t_mode: off`, the like-for-like twin;
- `STAPO`: the recipe as shipped;
Geometries: `steps_per_generation` = GA = 1 (TRL's default: p and H from the training forward, no extra forward),
= GA = 2 (one extra no-grad forward per rollout batch: tau_h needs both micro-batches before the first backward), and
= 4 x GA (the paper's: TRL's own old-log-prob forward is reused).

Every run is its own process (peak RSS is the process's, from `VmHWM`; nothing carries over between runs), after the
model was built once into the cache. Runs are interleaved: each repetition runs every arm of a geometry in a rotated
order, and each ratio is taken within a repetition, then the median over repetitions. Time is the `train()` call of
`--rollouts` rollout batches (construction and model loading not timed): CPU time of the process (`time.process_time`,
one torch thread; the measure the targets use, less sensitive to other jobs on shared cores) and wall time. Targets
the project sets: <= 1.02x `GRPOTrainer` where no extra forward is needed, peak memory <= 1.03x.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import script_env  # noqa: I001 (first: the environment and sys.path)


STAPO_RECIPE = "recipes/SmolLM2-135M/stapo.yaml"
OFF_RECIPE = "recipes/SmolLM2-135M/grpo.yaml"
ARMS = ("GRPO", "off", "STAPO")
GEOMETRIES = {"spg=GA=1": (1, 1), "spg=GA=2": (2, 2), "spg=4xGA": (4, 1)}  # name -> (steps_per_generation, GA)
TIME_TARGET, MEMORY_TARGET = 1.02, 1.03


def _vm_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def run_one(config: dict) -> dict:
    """One timed run in this process (the child side): build the trainer, train, measure."""
    import torch
    from harness import Probe, build_trainer, plain_grpo_recipe

    torch.set_num_threads(1)
    spg, grad_accum = GEOMETRIES[config["geometry"]]
    updates_per_rollout = spg // grad_accum
    overrides = [
        "--model_name_or_path", config["model"], "--per_device_train_batch_size", str(config["batch"]),
        "--num_generations", str(config["num_generations"]), "--max_completion_length", str(config["tokens"]),
        "--steps_per_generation", str(spg), "--gradient_accumulation_steps", str(grad_accum),
        "--max_steps", str(config["rollouts"] * updates_per_rollout), "--logging_steps", "1", "--seed", "0",
        "--activation_checkpointing", "false",
    ]  # fmt: skip
    arm = config["arm"]
    recipe = {"GRPO": plain_grpo_recipe(config["off_recipe"]), "off": config["off_recipe"]}.get(
        arm, config["stapo_recipe"]
    )
    trainer, _ = build_trainer(recipe, overrides, workdir=config["workdir"])
    probe = Probe(trainer)
    rss_before = _vm_kb("VmRSS")
    wall, cpu = time.perf_counter(), time.process_time()
    trainer.train()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        **config,
        "wall_seconds": wall,
        "cpu_seconds": cpu,
        "peak_rss_bytes": _vm_kb("VmHWM") * 1024,
        "rss_before_train_bytes": rss_before * 1024,
        "nograd_rows": probe.nograd_rows,
        "grad_rows": probe.grad_rows,
        "mask_cpu_seconds": probe.mask_seconds,
        "steps": trainer.state.global_step,
        "silenced": sum(h.get("s2t/num_silenced", 0) for h in trainer.state.log_history),
    }


def run_in_child(config: dict) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, "--run", json.dumps(config)], capture_output=True, text=True, cwd=script_env.REPO
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"run {config} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def ratios(runs: list[dict], model: str, geometry: str, arm: str, base: str, key: str) -> list[float]:
    """Per-repetition ratios arm / base of `key`."""
    by = {(r["rep"], r["arm"]): r[key] for r in runs if r["model"] == model and r["geometry"] == geometry}
    return [by[(rep, arm)] / by[(rep, base)] for rep, a in by if a == arm and (rep, base) in by]


def _fmt(values: list[float]) -> str:
    if not values:
        return "-"
    mid = statistics.median(values)
    return f"{mid:.3f} [{min(values):.3f}-{max(values):.3f}]" if len(values) > 1 else f"{mid:.3f}"


def write_report(path: Path, args, runs: list[dict], command: str, seconds: float) -> None:
    from harness import machine_info, versions

    lines = [
        f"# STAPO's cost on real models, CPU ({datetime.date.today()})",
        "",
        f"Command: `{command}` ({seconds / 60:.0f} min). Per run: {args.batch} completions per micro-step "
        f"(num_generations {args.num_generations}), {args.tokens} completion tokens max, {args.rollouts} rollout "
        "batches; one torch thread; each run a fresh process. Ratios: median over repetitions of the within-"
        "repetition ratio [min-max]. Time: CPU seconds of the `train()` call. Memory: peak RSS of the process "
        "(model load included).",
        "",
        "| model | geometry | arm | vs | CPU time | wall time | peak RSS | no-grad scoring rows per run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model in args.models:
        for geometry in args.geometries:
            rows = {r["arm"]: r["nograd_rows"] for r in runs if r["model"] == model and r["geometry"] == geometry}
            for arm, base in (("STAPO", "GRPO"), ("STAPO", "off"), ("off", "GRPO")):
                cells = [_fmt(ratios(runs, model, geometry, arm, base, k)) for k in ("cpu_seconds", "wall_seconds")]
                memory = _fmt(ratios(runs, model, geometry, arm, base, "peak_rss_bytes"))
                lines.append(
                    f"| {model} | {geometry} | {arm} | {base} | {cells[0]} | {cells[1]} | {memory} | "
                    f"{rows.get(arm, '-')} vs {rows.get(base, '-')} |"
                )
    lines += ["", "Absolute values (median over repetitions):", "", "| model | geometry | arm | CPU s | wall s | "
              "peak RSS GB | mask CPU s | silenced |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for model in args.models:
        for geometry in args.geometries:
            for arm in args.arms:
                chosen = [r for r in runs if (r["model"], r["geometry"], r["arm"]) == (model, geometry, arm)]
                if not chosen:
                    continue
                med = {k: statistics.median(r[k] for r in chosen) for k in (
                    "cpu_seconds", "wall_seconds", "peak_rss_bytes", "mask_cpu_seconds", "silenced")}  # fmt: skip
                lines.append(
                    f"| {model} | {geometry} | {arm} | {med['cpu_seconds']:.1f} | {med['wall_seconds']:.1f} | "
                    f"{med['peak_rss_bytes'] / 1e9:.2f} | {med['mask_cpu_seconds']:.2f} | {med['silenced']:.0f} |"
                )
    load = os.getloadavg()
    lines += ["", f"Load average at the end: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}.",
              f"Machine: {json.dumps(machine_info())}", f"Versions: {json.dumps(versions())}", ""]  # fmt: skip
    path.write_text("\n".join(lines))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=["builtin:smollm2-135m", "builtin:gemma3-270m"])
    parser.add_argument("--geometries", nargs="+", choices=list(GEOMETRIES), default=list(GEOMETRIES))
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8, help="per_device_train_batch_size (completions)")
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32, help="max_completion_length")
    parser.add_argument("--rollouts", type=int, default=2, help="rollout batches per run")
    parser.add_argument("--stapo-recipe", default=STAPO_RECIPE)
    parser.add_argument(
        "--off-recipe", default=OFF_RECIPE, help="its s2t_mode: off twin (and, as trainer: grpo, GRPO's)"
    )
    parser.add_argument("--out", default=None, help="report (default benchmarks/results/<date>-real-cost.md)")
    parser.add_argument("--run", default=None, help=argparse.SUPPRESS)  # the child side: one run's JSON config
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.run is not None:
        print("RESULT " + json.dumps(run_one(json.loads(args.run))), flush=True)
        return
    import tempfile

    from stapo_trl.models import resolve_model_path

    out = (
        Path(args.out)
        if args.out
        else script_env.REPO / "benchmarks" / "results" / f"{datetime.date.today()}-real-cost.md"
    )
    command = "python benchmarks/real_cost.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    for model in args.models:  # built (or converted) once, outside any timed run
        resolve_model_path(model)
    workdir = tempfile.mkdtemp(prefix="real-cost-")
    start, runs = time.perf_counter(), []
    for model in args.models:
        for rep in range(args.reps):
            for geometry in args.geometries:
                arms = list(args.arms)
                arms = arms[rep % len(arms) :] + arms[: rep % len(arms)]  # rotate the order per repetition
                for arm in arms:
                    config = dict(model=model, geometry=geometry, arm=arm, rep=rep, batch=args.batch,
                                  num_generations=args.num_generations, tokens=args.tokens, rollouts=args.rollouts,
                                  stapo_recipe=args.stapo_recipe, off_recipe=args.off_recipe, workdir=workdir)  # fmt: skip
                    result = run_in_child(config)
                    runs.append(result)
                    print(f"{model} {geometry} {arm} rep {rep}: CPU {result['cpu_seconds']:.1f} s, wall "
                          f"{result['wall_seconds']:.1f} s, peak RSS {result['peak_rss_bytes'] / 1e9:.2f} GB, "
                          f"{result['nograd_rows']} no-grad rows", flush=True)  # fmt: skip
                    out.with_suffix(".json").write_text(json.dumps({"command": command, "runs": runs}, indent=1))
    write_report(out, args, runs, command, time.perf_counter() - start)
    print(out.read_text())


if __name__ == "__main__":
    main()
