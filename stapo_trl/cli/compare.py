"""`stapo-train compare RECIPE_A RECIPE_B [--seeds ...]`: both arms of a comparison on the same seeds, one figure
with both runs' curves (reward, entropy, silenced ratio) and a before/after held-out accuracy table.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Sequence
from typing import Any

from .args import parse_args
from .errors import EXIT_STATUS_HELP, InputError, OneLineErrorParser


def _run_label(recipe: str, taken: set[str]) -> str:
    label = os.path.splitext(os.path.basename(recipe))[0]
    if label in taken:
        label = os.path.basename(os.path.dirname(os.path.abspath(recipe))) + "-" + label
    while label in taken:
        label += "'"
    return label


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return f"{100 * mean:.1f} ± {100 * std:.1f}"


def _accuracy_table(results: dict[str, list[dict[str, Any]]]) -> tuple[str, str]:
    """The before/after accuracy table (one row per run, one mean row per label) and the metric name (avg@k)."""
    k_metric = next((r["eval"]["metric"] for rs in results.values() for r in rs if r["eval"]), "avg@k")
    header = f"{'run':<12} {'seed':>5} {k_metric + ' before':>14} {k_metric + ' after':>14} {'silenced ratio':>15}"
    lines = [header, "-" * len(header)]
    for label, label_results in results.items():
        befores, afters = [], []
        for r in label_results:
            ev, s2t = r["eval"] or {}, r["s2t"]
            ratio = f"{s2t['silenced_ratio']:.2e}" if s2t else "-"  # pooled: Σ silenced / Σ loss tokens
            before, after = ev.get("accuracy_before"), ev.get("accuracy_after")
            if before is not None:
                befores.append(before)
                afters.append(after)
            lines.append(f"{label:<12} {r['seed']:>5} {_percent(before):>14} {_percent(after):>14} {ratio:>15}")
        lines.append(f"{label:<12} {'mean':>5} {_mean_std(befores):>14} {_mean_std(afters):>14}")
    return "\n".join(lines), k_metric


def _parser() -> OneLineErrorParser:
    parser = OneLineErrorParser(
        prog="stapo-train compare",
        allow_abbrev=False,
        description="Train two recipes on the same seeds; plot both runs' curves in one PNG and print held-out "
        "accuracy before/after. Arguments after `--` override keys of both recipes (e.g. -- --max_steps 100).",
        epilog=EXIT_STATUS_HELP,
    )
    parser.add_argument(
        "recipes", nargs="*", metavar="RECIPE", help="Two recipe YAML files (e.g. grpo.yaml stapo.yaml)."
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="Seeds to run each recipe on.")
    parser.add_argument("--output-dir", default="outputs/compare", help="Root folder of the runs and the figure.")
    return parser


def _check_recipes_and_seeds(prog: str, args) -> None:
    """Two recipes, distinct seeds; else an `InputError` naming the argument."""
    if len(args.recipes) != 2:
        given = ", ".join(args.recipes) if args.recipes else "none"
        raise InputError(
            prog,
            f"RECIPE: compare trains two recipes on the same seeds (e.g. recipes/demo/grpo.yaml "
            f"recipes/demo/stapo.yaml); {len(args.recipes)} given ({given}).",
        )
    repeated = sorted({seed for seed in args.seeds if args.seeds.count(seed) > 1})
    if repeated:
        raise InputError(
            prog,
            f"--seeds {' '.join(map(str, args.seeds))}: seed(s) {', '.join(map(str, repeated))} given twice; each "
            "seed is one run folder per recipe, so give distinct seeds.",
        )


def compare(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """`stapo-train compare RECIPE_A RECIPE_B [--seeds ...] [--output-dir DIR] [-- OVERRIDES]`.

    Trains both recipes on every seed (in this process, one after the other; `OVERRIDES` go to every run), with the
    before/after evaluation on, into `DIR/<recipe name>/seed<N>`. Writes `DIR/compare.png` (reward and entropy over
    steps: mean over seeds with a min/max band; the silenced ratio pooled over seeds, Σ silenced / Σ loss tokens at
    each step, as the table pools it over the run) and `DIR/compare.json`, and prints the accuracy table. Finished runs are not redone (each run resumes from its last checkpoint).

    Args:
        argv (`Sequence[str]`, *optional*): the arguments after `compare`; `None` reads `sys.argv[2:]`.

    Returns:
        `dict`: what `DIR/compare.json` holds (figure path, seeds, and per run its output folder, eval and S2T).
    """
    argv = list(sys.argv[2:] if argv is None else argv)
    overrides: list[str] = []
    if "--" in argv:
        overrides = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    parser = _parser()
    args = parser.parse_args(argv)
    _check_recipes_and_seeds(parser.prog, args)

    labels: dict[str, str] = {}
    for recipe in args.recipes:
        labels[recipe] = _run_label(recipe, set(labels.values()))
    # Parse every run first, so that a bad recipe or override fails before the first training starts.
    planned = []
    try:
        for recipe in args.recipes:
            for seed in args.seeds:
                run_dir = os.path.join(args.output_dir, labels[recipe], f"seed{seed}")
                run_argv = ["--config", recipe, "--eval_before_after", "true", "--seed", str(seed)]
                planned.append((labels[recipe], seed, parse_args([*run_argv, "--output_dir", run_dir, *overrides])))
    except (ValueError, OSError) as e:
        raise InputError(parser.prog, str(e)) from e
    # The training stack and the figures (seconds to import): after the arguments, so that --help and errors are fast.
    from ..plots import TRAINING_CURVES, plot_diagnostics, plot_training_curves
    from ..runfiles.metrics_log import read_metrics
    from .run import train

    results: dict[str, list[dict[str, Any]]] = {label: [] for label in labels.values()}
    for i, (label, seed, parsed) in enumerate(planned):
        print(f"\n### compare: {label} seed {seed} -> {parsed[1].output_dir}")
        result = train(*parsed, end_training=i == len(planned) - 1)
        result["seed"] = seed
        results[label].append(result)

    runs = {label: [read_metrics(r["output_dir"]) for r in label_results] for label, label_results in results.items()}
    out = os.path.join(args.output_dir, "compare.png")
    title = " vs ".join(runs) + f" (seeds {', '.join(map(str, args.seeds))})"
    plot_training_curves(runs, out, curves=TRAINING_CURVES, title=title)
    run_dirs = [(f"{label} seed {r['seed']}", r["output_dir"]) for label, rs in results.items() for r in rs]
    plot_diagnostics([d for _, d in run_dirs], args.output_dir, labels=[name for name, _ in run_dirs])

    table, k_metric = _accuracy_table(results)
    summary: dict[str, Any] = {"figure": out, "seeds": args.seeds, "runs": {}}
    for label, label_results in results.items():
        summary["runs"][label] = [
            {"seed": r["seed"], "output_dir": r["output_dir"], "eval": r["eval"], "s2t": r["s2t"]}
            for r in label_results
        ]
    print(f"\nHeld-out accuracy (%), {k_metric}, mean ± std over seeds:\n{table}\nFigure: {out}")
    from ..runfiles.run_folder import open_run_file

    with open_run_file(os.path.join(args.output_dir, "compare.json")) as f:
        json.dump(summary, f, indent=2)
    return summary
