#!/usr/bin/env python
"""Benchmarks of `stapo_trl`: what the S2T mask costs against `GRPOTrainer` and its `s2t_mode: off` twin, and how
it scales.

    .venv/bin/python benchmarks/bench.py                  # both sections (`make bench` runs this first)
    .venv/bin/python benchmarks/bench.py --quick          # smoke run of both sections at toy sizes
    .venv/bin/python benchmarks/bench.py --sections mask  # one or more of: overhead, mask

Sections (each writes one Markdown table; all tables go to stdout and to `benchmarks/results/<date>.md`, the raw
numbers to `<date>.json`; `--quick` writes `<date>-quick.*`):

1. `overhead`: [`~stapo_trl.STAPOTrainer`] against a plain [`~trl.GRPOTrainer`] on the CPU demo
   (`recipes/demo/{grpo,stapo}.yaml`, builtin:tiny-math) and its `s2t_mode: off` twin, same seed and batch geometry,
   `steps_per_generation` equal to and 4x `gradient_accumulation_steps`. Every configuration gets a freshly built
   trainer (build not timed) and runs the same number of optimizer steps; configurations are interleaved within each
   repetition (the order rotates), and each STAPO time is divided by the GRPO time of the same repetition; the table
   gives the median ratio over repetitions and its range. Times: CPU time (`time.process_time`, the targets'
   measure: the cores are shared) and wall time of `trainer.train()`, and the sum of TRL's own `step_time` metric.
   Memory: one extra, untimed run per configuration under the torch profiler (see "Memory measurement" below).
2. `mask`: [`~stapo_trl.s2t_mask`] alone on 1M / 16M / 64M tokens with 0.1 % and 5 % candidates, against a naive
   implementation (`probs = logps.exp()`, `torch.quantile` over the candidates' entropies), plus one size past
   2**24 candidates, where `torch.quantile` raises.

The code: `harness.py` (environment, measurement helpers, trainers from the demo recipes, the report file; the
memory measurement is described there), one module per section (`overhead.py`, `mask.py`, each with `run_*`, its
table and its `section_text`), and this entry point. The GPU check is its own script, `gpu.py`
(`scripts/gpu_check.sh`); GRPO against STAPO in learning is `make compare`.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any


# Before torch is imported (by the sections): one OpenMP thread (a tiny model gains nothing from threads, and on
# shared cores two threads waiting on each other thrash), no Hub access, quiet tokenizers.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import harness  # noqa: E402 (the sections import torch: after the environment variables above)
import mask  # noqa: E402
import overhead  # noqa: E402
import torch  # noqa: E402


def section_texts(args, results: dict) -> dict[str, str]:
    """The Markdown section of every section that ran."""
    texts = {}
    for name, module in (("overhead", overhead), ("mask", mask)):
        if name in results:
            texts[name] = module.section_text(args, results[name])
    return texts


# ---------------------------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------------------------

SECTIONS = ("overhead", "mask")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="benchmarks/bench.py", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    parser.add_argument("--quick", action="store_true", help="toy sizes for every section (a smoke test)")
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
    args.mask_sizes = [int(float(s) * 2**20) for s in str(args.mask_sizes).split(",")]
    args.mask_fractions = [float(f) for f in str(args.mask_fractions).split(",")]
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
        machine=harness.machine_info(),
        versions=harness.versions(),
    )
    print(
        f"stapo_trl benchmarks {date}: sections {args.sections}; "
        f"load average {header['machine']['load_average_start']}"
    )
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="stapo-bench-") as workdir:
        if "overhead" in args.sections:
            header["builtin"] = harness.builtin_info()
        # Cheapest and least load-sensitive first.
        if "mask" in args.sections:
            print("== mask", flush=True)
            results["mask"] = mask.run_mask(args)
        if "overhead" in args.sections:
            print("== overhead", flush=True)
            results["overhead"] = overhead.run_overhead(args, workdir)
    header["load_average_end"] = os.getloadavg()
    header["elapsed_s"] = time.perf_counter() - started
    output = Path(args.output) if args.output else harness.RESULTS_DIR / f"{date}{'-quick' if args.quick else ''}.md"
    report = harness.write_report(
        output, header, section_texts(args, results), dict(header=header, args=vars(args), **results)
    )
    print("\n" + report)
    print(f"Written: {output} and {output.with_suffix('.json')}")


if __name__ == "__main__":
    main()
