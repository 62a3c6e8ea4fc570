"""The figures of `stapo-train` runs (`stapo-plot`): a run folder, or a folder of seeds' run folders (their mean,
ratios of counts pooled). Each `plot_*` writes and returns `out` (`out=None`: the `Figure`); `None` without data."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ..run_folder.checkpoints import write_atomic


logger = logging.getLogger(__name__)
TRAINING_CURVES = (  # (log key, panel title, y scale)
    ("reward", "reward (mean over completions)", "linear"), ("entropy", "policy entropy (nats / token)", "linear"),
    ("s2t/silenced_ratio", "S2T silenced-token ratio (log)", "log"))  # fmt: skip
RATIO_CURVES = (TRAINING_CURVES[2], ("s2t/candidate_ratio", "S2T candidate ratio (log)", "log"))  # s2t_ratios.png
POOLED_RATIOS = {"s2t/silenced_ratio": ("s2t/num_silenced", "s2t/num_loss_tokens"),  # Σ / Σ, pooled over seeds too
                 "s2t/candidate_ratio": ("s2t/num_candidates", "s2t/num_loss_tokens")}  # fmt: skip
FIGURE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")
_WARNED_EMPTY: set[str] = set()


def _files(path: str, name: str) -> list[str]:
    if os.path.isfile(os.path.join(path, name)):
        return [os.path.join(path, name)]
    names = sorted(os.listdir(path)) if os.path.isdir(path) else []
    return [file for n in names if os.path.isfile(file := os.path.join(path, n, name))]


def load_run(path: str, *, require_steps: bool = False) -> list[list[dict]]:
    """`metrics.jsonl` rows per seed; `FileNotFoundError` if none; `ValueError` for no metric (`require_steps`)."""
    path = os.fspath(path)
    if not (files := [path] if os.path.isfile(path) and path.endswith(".jsonl") else _files(path, "metrics.jsonl")):
        raise FileNotFoundError(f"No metrics.jsonl in {path!r} nor in its sub-folders. Pass the output_dir of a "
                                "`stapo-train` run, or a folder of them (one per seed).")  # fmt: skip
    from ..run_folder.logs import read_metrics  # imports torch: after the checks of the command line

    for file, rows in zip(files, seeds := [read_metrics(file) for file in files]):
        if require_steps and not any(set(row) - {"step", "epoch"} for row in rows):
            why = "logged metric, only steps" if rows else "metrics row (see the warning above for its lines)"
            why = f"holds no {why}" if Path(file).read_bytes().strip() else ("is empty: the run has not reached its "
                  "first logging step (logging_steps) yet, or stopped before it")  # fmt: skip
            raise ValueError(f"{file} {why}. Nothing to draw: plot a run folder that logged at least one step, or "
                             "leave this one out.")  # fmt: skip
    return seeds


def load_token_records(run_dir: os.PathLike | str) -> list[dict]:
    """The records of the run's (or its seeds') `spurious_tokens.jsonl`; a file without one is warned about once."""
    from ..run_folder.logs import read_token_records

    files = {file: read_token_records(file) for file in _files(os.fspath(run_dir), "spurious_tokens.jsonl")}
    for file in [file for file, records in files.items() if not records and file not in _WARNED_EMPTY]:
        _WARNED_EMPTY.add(file)
        logger.warning(f"{file} holds no token record: no s2t_prob_entropy.png or s2t_top_tokens.png from it (the run "
                       "logged no positive-advantage token, or the file was cut).")  # fmt: skip
    return [record for records in files.values() for record in records]


def seed_values(seeds: Sequence, key: str):
    """`(steps all seeds logged, values (seeds, steps), " (2 seeds)")` of `key`; a [`POOLED_RATIOS`] ratio: one row."""
    series = lambda rows, key: {  # noqa: E731 - without null and NaN
        int(row["step"]): float(row[key]) for row in rows if row.get("step") is not None and row.get(key) is not None
        and row[key] == row[key]}  # fmt: skip
    num, den = POOLED_RATIOS.get(key, (None, None))
    if len(seeds) > 1 and num and all(series(rows, den) for rows in seeds):
        counts = [(series(rows, num), series(rows, den)) for rows in seeds]
        steps = sorted(set.intersection(*(set(n) & set(d) for n, d in counts)))
        pooled = {s: sum(n[s] for n, _ in counts) / total for s in steps if (total := sum(d[s] for _, d in counts))}
        if pooled:
            return list(pooled), np.array([list(pooled.values())]), f" ({len(seeds)} seeds, pooled)"
    per_seed = [found for rows in seeds if (found := series(rows, key))]
    steps = sorted(set.intersection(*map(set, per_seed))) if per_seed else []
    note = f" ({len(per_seed)} seeds)" if len(per_seed) > 1 else ""
    return steps, np.array([[found[step] for step in steps] for found in per_seed]), note


def _figure(rows: int, cols: int, size: tuple[float, float], **kwargs):
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="tight")
    return fig, fig.subplots(rows, cols, squeeze=False, **kwargs)


def _save(fig, out: Path | str | None):
    if out is not None:  # one atomic write: a kill leaves the old figure or the new
        fig.savefig(buffer := io.BytesIO(), dpi=110, format=os.path.splitext(os.fspath(out))[1][1:].lower() or "png")
        write_atomic(out, buffer.getvalue())
    return fig if out is None else out


def _axes(ax, title: str, log=False, xlabel="optimizer step", fontsize=10, grid="both", empty=None, **legend) -> None:
    from matplotlib.ticker import LogFormatterSciNotation, LogLocator, MaxNLocator

    if empty:
        ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xlabel(xlabel)
    ax.xaxis.set_major_locator(MaxNLocator(nbins="auto", steps=[1, 2, 2.5, 5, 10], integer=True))
    if log:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(LogFormatterSciNotation(labelOnlyBase=False))
    ax.set_title(title, fontsize=fontsize)
    ax.grid(alpha=0.3, which="both", axis=grid)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, **legend)


def plot_training_curves(runs: Mapping, out=None, *, curves=TRAINING_CURVES, title=None, smoothing=None):
    """A panel per `(log key, title, "linear" | "log")` of `curves`; `runs`: label -> rows per seed. Linear: a moving
    average (`smoothing` steps, default ~1/20 of a run), seeds in a min/max band; log: the seeds' mean, 0s counted."""
    fig, axes = _figure(1, len(curves), (5.2 * len(curves), 3.9), sharex=True)
    for ax, (key, panel_title, scale) in zip(axes[0], curves, strict=True):
        for i, (label, seeds) in enumerate(runs.items()):
            steps, values, note = seed_values(seeds, key)
            if steps and scale == "log":
                pos = (mean := values.mean(axis=0)) > 0
                zeros = f", 0 at {(~pos).sum()}/{len(mean)} logged steps" if pos.any() else ": always 0"
                ax.plot(np.array(steps)[pos], mean[pos], "o", ms=3.5, color=f"C{i}", label=label + note + zeros)
            elif steps:
                start = np.maximum((end := np.arange(1, len(steps) + 1)) - (smoothing or max(1, len(steps) // 20)), 0)
                cumsum = np.cumsum(np.insert(values, 0, 0.0, axis=1), axis=1)
                smooth = (cumsum[:, end] - cumsum[:, start]) / (end - start)  # (seeds, steps); trailing windows
                if len(values) == 1:
                    ax.plot(steps, values[0], color=f"C{i}", alpha=0.25, lw=0.8)
                else:
                    ax.fill_between(steps, smooth.min(axis=0), smooth.max(axis=0), color=f"C{i}", alpha=0.2)
                ax.plot(steps, smooth.mean(axis=0), color=f"C{i}", lw=1.8, label=label + note)
        _axes(ax, panel_title, scale == "log", empty=None if ax.lines else f"{key!r} not logged")
    if title:
        fig.suptitle(title, fontsize=11)
    return _save(fig, out)


def plot_entropy_quantiles(runs: Mapping[str, Sequence], out: Path | None = None):
    """The loss tokens' entropy quantiles over steps: a p10-p95 band, p50 solid, p80 dashed."""
    fig, ((ax,),) = _figure(1, 1, (7.5, 4.2))
    for i, (label, seeds) in enumerate(runs.items()):
        q = {p: seed_values(seeds, f"s2t/entropy_p{p}")[:2] for p in (10, 50, 80, 95)}
        if q[10][0] and q[10][0] == q[95][0]:
            ax.fill_between(q[10][0], q[10][1].mean(axis=0), q[95][1].mean(axis=0), color=f"C{i}", alpha=0.15, lw=0)
        for p, lw, ls, name in ((50, 1.8, "-", "p50 (band p10-p95)"), (80, 1.2, "--", "p80")):
            if q[p][0]:
                ax.plot(q[p][0], q[p][1].mean(axis=0), color=f"C{i}", lw=lw, ls=ls, label=f"{label}: {name}")
    if not ax.lines and not ax.collections:
        return None
    ax.set_ylabel("entropy of loss tokens (nats)")
    _axes(ax, "Policy entropy quantiles (all loss tokens, all processes)", log=True)
    return _save(fig, out)


def plot_prob_entropy_scatter(records: Mapping[str, Sequence], out: Path | None = None):
    """Probability (log) vs entropy of positive-advantage tokens, silenced in red, with τ_p and the median τ_h."""
    if not (records := {label: recs for label, recs in records.items() if recs}):
        return None
    fig, axes = _figure(1, len(records), (6.0 * len(records), 4.6))
    for ax, (label, recs) in zip(axes[0], records.items(), strict=True):
        for kind, color, name, size in (("reference", "0.6", "other positive-advantage tokens (sample)", 6),
                                        ("kept_candidate", "tab:blue", "kept candidates (logged)", 12),
                                        ("silenced", "tab:red", "silenced (spurious)", 16)):  # fmt: skip
            if points := [(r["prob"], r["entropy"]) for r in recs if r["kind"] == kind and r["prob"] > 0]:
                ax.scatter(*zip(*points), s=size, c=color, alpha=0.7, lw=0, label=f"{name}: {len(points)}")
        if tau_p := [r["prob_threshold"] for r in recs if r.get("prob_threshold")]:
            ax.axvline(tau_p[-1], color="k", ls=":", lw=1, label=f"τ_p = {tau_p[-1]:g}")
        if tau_h := sorted(r["entropy_threshold"] for r in recs if r.get("entropy_threshold") is not None):
            ax.axhline(m := tau_h[len(tau_h) // 2], color="k", ls="--", lw=1, label=f"median τ_h = {m:.3g} nats")
        xlabel = "probability of the sampled token (log)"
        _axes(ax, f"{label}: positive-advantage tokens", xlabel=xlabel, loc="upper right")
        ax.set(xscale="log", ylabel="entropy at the position (nats)")  # after _axes: a log axis's own ticks
    return _save(fig, out)


def plot_top_tokens(records: Mapping[str, Sequence], out=None, k: int = 15, token_bytes: Mapping | None = None):
    """Bars of the `k` most frequent silenced and kept-candidate tokens per run, named by [`readable_token`]."""
    from ..diagnostics.token_records import TOKEN_LABEL_KEY, readable_token

    if not (records := {label: recs for label, recs in records.items() if recs}):
        return None
    fig, axes = _figure(len(records), 2, (10, height := 1.3 + 0.28 * k * len(records)))
    panels = (("silenced", "tab:red", "most frequent silenced tokens", "silenced occurrences over the run"),
              ("kept_candidate", "tab:blue", "most frequent kept candidates",
               "kept-candidate occurrences (logged records)"))  # fmt: skip
    for row, (label, recs) in zip(axes, records.items(), strict=True):
        for ax, (kind, color, title, xlabel) in zip(row, panels, strict=True):
            counts = Counter((r.get("token_id"), r["token"]) for r in recs if r["kind"] == kind)
            known, top = (token_bytes or {}).get(label) or {}, counts.most_common(k)
            names = [readable_token(token, known.get(token_id), token_id) for (token_id, token), _ in top]
            ax.barh(range(len(top)), [n for _, n in top], color=color, alpha=0.8)
            ax.set_yticks(range(len(top)), names, fontsize=8)
            ax.invert_yaxis()
            shown = f" ({len(top)} of {len(counts)} distinct)" if len(counts) > len(top) else ""
            _axes(ax, f"{label}: {title}{shown}", xlabel=xlabel, fontsize=9, grid="x", empty=not top and "none logged")
    fig.text(0.5, 0.01, TOKEN_LABEL_KEY, ha="center", va="bottom", fontsize=7.5, wrap=True)
    fig.set_layout_engine("tight", rect=(0, 0.45 / height, 1, 1))
    return _save(fig, out)


def _load(run_dirs: Sequence, labels: Sequence[str] | None, require_steps: bool = False):
    """(metrics, token records, `tokenizer.json`'s token bytes) by label (default: the folder names, else paths)."""
    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"--labels: got {len(labels)} label(s) for {len(run_dirs)} OUTPUT_DIR(s): give one label per "
                         "folder, or none (the folder names).")  # fmt: skip
    names = [os.path.basename(os.path.normpath(d)) for d in run_dirs]
    default = names if len(set(names)) == len(names) else [os.path.normpath(d) for d in run_dirs]
    runs = dict(zip(default if labels is None else labels, map(os.fspath, run_dirs), strict=True))
    metrics = {label: load_run(d, require_steps=require_steps) for label, d in runs.items()}
    records, token_bytes = {label: load_token_records(d) for label, d in runs.items()}, {}
    for label, files in ((label, _files(d, "tokenizer.json")) for label, d in runs.items() if records[label]):
        from ..diagnostics.token_records import tokenizer_token_bytes  # imports torch: only for a run with records

        with contextlib.suppress(OSError, ValueError, IndexError):
            token_bytes[label] = tokenizer_token_bytes(json.loads(Path(files[0]).read_text(encoding="utf-8")))
    return metrics, records, token_bytes


def plot_diagnostics(run_dirs: Sequence, out_dir: Path | str, labels: Sequence[str] | None = None, *, loaded=None):
    """Write the S2T figures of the runs (or `_load`'s `loaded`) into `out_dir`; their paths. `FileNotFoundError`."""
    metrics, records, token_bytes = loaded or _load(run_dirs, labels)
    ratios = any(seed_values(seeds, "s2t/silenced_ratio")[0] for seeds in metrics.values())
    written = [plot_entropy_quantiles(metrics, Path(out_dir, "s2t_entropy_quantiles.png")),
               plot_training_curves(metrics, Path(out_dir, "s2t_ratios.png"), curves=RATIO_CURVES) if ratios else None,
               plot_prob_entropy_scatter(records, Path(out_dir, "s2t_prob_entropy.png")),
               plot_top_tokens(records, Path(out_dir, "s2t_top_tokens.png"), token_bytes=token_bytes)]  # fmt: skip
    return [Path(path) for path in written if path is not None]


def plot_output_dirs(output_dirs: Sequence[str], out: str | None = None, *, labels=None, title=None, smoothing=None):
    """Every figure of `stapo-train` output folders, all read first; the paths written. The training curves go to `out`
    (a file or folder; default: the one folder, or `.`), the S2T figures beside; `FileNotFoundError`, `ValueError`."""
    if smoothing is not None and smoothing < 1:
        raise ValueError(f"--smoothing {smoothing}: the moving-average window must be >= 1 logged step.")
    out, loaded = _curves_file(output_dirs, out), _load(output_dirs, labels, require_steps=True)
    out = plot_training_curves(loaded[0], out, title=title, smoothing=smoothing)
    return [out, *plot_diagnostics(output_dirs, Path(os.path.abspath(out)).parent, loaded=loaded)]


def _curves_file(output_dirs: Sequence[str], out: str | None) -> str:
    suffix = os.path.splitext(out or "")[1]
    if suffix and not os.path.isdir(out) and suffix.lower() not in FIGURE_SUFFIXES:
        raise ValueError(f"--out {out}: {suffix!r} is not a figure format ({', '.join(FIGURE_SUFFIXES)}): name a file "
            "with one of these extensions, or a folder (a path without an extension) for every figure.")  # fmt: skip
    out = (output_dirs[0] if len(output_dirs) == 1 and os.path.isdir(output_dirs[0]) else ".") if out is None else out
    return os.path.join(out, "training_curves.png") if os.path.isdir(out) or not suffix else out
