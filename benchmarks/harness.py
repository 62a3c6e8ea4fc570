"""The benchmark harness: machine and version facts, CPU memory measurement, trainers built from the demo recipes,
and the report file. Shared by every section; `bench.py` sets the thread and Hub environment before any of them loads torch.

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

import contextlib
import datetime
import json
import math
import os
import platform
import re
import statistics
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch


REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "benchmarks" / "results"
GRPO_RECIPE = "recipes/demo/grpo.yaml"
STAPO_RECIPE = "recipes/demo/stapo.yaml"


def plain_grpo_recipe(recipe: str = GRPO_RECIPE) -> str:
    """A recipe (default `recipes/demo/grpo.yaml`) as plain `trl.GRPOTrainer` runs it: `trainer: grpo` and no `s2t_*`
    keys (a temporary file, so the comparison with TRL needs no recipe of its own in the repository)."""
    text = re.sub(r"^trainer: *stapo\b", "trainer: grpo", (REPO / recipe).read_text(), flags=re.MULTILINE)
    if not re.search(r"^trainer: *grpo\b", text, flags=re.MULTILINE):
        raise ValueError(f"{recipe} has no `trainer: stapo` line to turn into `trainer: grpo`.")
    path = Path(tempfile.mkdtemp(prefix="stapo-bench-")) / "grpo_plain_trl.yaml"
    path.write_text("\n".join(line for line in text.splitlines() if not line.startswith("s2t_")) + "\n")
    return str(path)


PLAIN_GRPO_RECIPE = plain_grpo_recipe()
QUANTILE_LIMIT = 2**24  # torch.quantile raises above this many elements (pytorch#64947)

# The project's targets: time ratios against GRPOTrainer, peak-memory ratio.
TIME_TARGET = 1.03
MEMORY_TARGET = 1.03


# ---------------------------------------------------------------------------------------------------------------
# Measurement helpers
# ---------------------------------------------------------------------------------------------------------------


def write_result(text: str, name: str, out: Path | None = None) -> Path:
    """Write a standalone section's Markdown to `out` (default `results/<date>-<name>.md`) and print it."""
    out = out or RESULTS_DIR / f"{datetime.date.today()}-{name}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    return out


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


def build_trainer(recipe: str, overrides: list[str], *, workdir: str):
    """A trainer of `recipe` (a `recipes/` YAML) with command-line `overrides`, as `stapo-train` would build it.

    The recipe is parsed by `stapo_trl.cli.args.parse_args` (so the recipe stays the single source of the settings);
    the dataset and model path are prepared once per recipe and reused. Checkpointing, printing and the run files
    (`s2t_write_run_files`) are off.

    Every arm runs on one thread count ([`pin_threads`]): plain `GRPOTrainer` has no thread policy of its own.
    """
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOTrainer

    from stapo_trl.cli.args import parse_args
    from stapo_trl.cli.run import prepare
    from stapo_trl.trainer.config import STAPOConfig
    from stapo_trl.trainer.trainers import STAPOTrainer

    output_dir = tempfile.mkdtemp(prefix="run-", dir=workdir)
    argv = ["--config", recipe, "--output_dir", output_dir, "--save_strategy", "no", "--report_to", "none"]
    argv += ["--disable_tqdm", "true", *overrides]
    script_args, training_args, model_args = parse_args(argv)
    pin_threads(script_args.torch_num_threads)
    if isinstance(training_args, STAPOConfig):
        training_args.s2t_write_run_files = (
            False  # no metrics.jsonl / spurious_tokens.jsonl: plain GRPOTrainer has none
        )
    key = f"{recipe}|{model_args.model_name_or_path}"
    if key not in _PREPARED:
        _PREPARED[key] = prepare(script_args, training_args, model_args)
    run = _PREPARED[key]
    training_args.model_init_kwargs = {"dtype": model_args.dtype}
    trainer_class = GRPOTrainer if script_args.trainer == "grpo" else STAPOTrainer
    trainer = trainer_class(
        model=run.model_path,
        reward_funcs=run.reward_funcs,
        args=training_args,
        train_dataset=run.train_dataset,
    )
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer, run


def pin_threads(recipe_threads: int | None) -> int:
    """Set torch's thread count for every arm alike: `OMP_NUM_THREADS` when set, else the recipe's `torch_num_threads`
    (what `stapo-train` uses), else 1; exported as `OMP_NUM_THREADS` too, which the product trainers take as the caller's
    choice. Without it, plain `GRPOTrainer` ran on torch's default (one thread per core) while `STAPOTrainer` ran a
    built-in tiny model on one, and a plain-TRL baseline looked slower for that alone. Returns the count."""
    threads = int(os.environ.get("OMP_NUM_THREADS") or recipe_threads or 1)
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    return threads


class Probe:
    """Counts the policy's scoring forwards (TRL's fused-LM-head calls) and times the S2T-specific methods.

    `nograd_rows` / `grad_rows`: completions scored without / with gradient (generation forwards are not counted:
    they do not use the fused head). `mask_seconds`: time in `STAPOTrainer._s2t_result` (the mask, its metrics, and
    the product's diagnostics and token records). `records_seconds`: time in the token records' `record` (per mask,
    inside the mask's time) and `write_pending` (per logging step), of a `SpuriousTokenLogger` added here.
    """

    def __init__(self, trainer):
        from stapo_trl.run_folder.logs import SpuriousTokenLogger
        from stapo_trl.trainer.trainers import STAPOTrainer

        self.nograd_rows = self.grad_rows = 0
        self.mask_seconds = self.records_seconds = 0.0
        trainer.model.register_forward_hook(self._hook, with_kwargs=True)
        if isinstance(trainer, STAPOTrainer):
            self._time(trainer, "_s2t_result", "mask_seconds")
            logger = SpuriousTokenLogger(trainer)  # used by train() instead of the built-in one
            trainer.add_callback(logger)
            self._time(logger, "record", "records_seconds")
            self._time(logger, "write_pending", "records_seconds")

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

        setattr(trainer, method, timed)  # instance attribute: the owner's own calls go through it


# ---------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------


def builtin_info() -> dict:
    """The build record of builtin:tiny-math, and whether it matches the build settings of this checkout.

    The cache folder is keyed by name and version only, so a cache filled by another checkout (or by an earlier
    recipe under the same version) is reused silently; the bench says so instead of benchmarking a different model.
    """
    from stapo_trl.models import BUILTIN_MODELS, read_builtin_info, resolve_model_path
    from stapo_trl.models.tiny import SFT_CONFIG

    path = resolve_model_path("builtin:tiny-math")
    info = read_builtin_info(path)
    sft = info.get("sft", {})
    expected = dict(SFT_CONFIG, steps=BUILTIN_MODELS["tiny-math"]["sft_steps"])
    mismatches = {k: (sft[k], v) for k, v in expected.items() if k in sft and sft[k] != v}
    if mismatches:
        print(
            f"WARNING: the cached builtin:tiny-math at {path} was built with other settings than this checkout's "
            f"stapo_trl/models/ (cached, expected): {mismatches}. Use --model-cache DIR for a fresh build.",
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
