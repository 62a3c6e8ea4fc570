"""Training-curve figures from the `metrics.jsonl` files that `stapo-train` writes (the `stapo-plot` command is
`stapo_trl.cli.plot`).

    stapo-plot outputs/demo-stapo                                  # -> outputs/demo-stapo/training_curves.png
    stapo-plot outputs/demo-grpo outputs/demo-stapo --out cmp.png  # runs overlaid
    stapo-plot outputs/compare/grpo outputs/compare/stapo          # folders of seeds: mean with a min/max band

A run is a folder holding `metrics.jsonl`, or a folder whose sub-folders each hold one (one per seed, the layout of
`stapo-train compare`): seeds are then drawn as their mean with a min/max band. `stapo-train` and
`stapo-train compare` draw their figures with the same [`plot_training_curves`].
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from .metrics_log import load_run, pooled_ratio_series
from .run_folder import open_run_file


# (log key, panel title, y scale). Reward and entropy are smoothed; the silenced ratio is drawn raw on a log scale
# because it is 0 at most steps and ~1e-4 when the mask fires: zeros cannot sit on a log axis, so they are counted in
# the legend instead of drawn.
TRAINING_CURVES: tuple[tuple[str, str, str], ...] = (
    ("reward", "reward (mean over completions)", "linear"),
    ("entropy", "policy entropy (nats / token)", "linear"),
    ("s2t/silenced_ratio", "S2T silenced-token ratio (log)", "log"),
)

Run = Sequence[Sequence[dict[str, Any]]]  # one list of metrics.jsonl rows per seed


# `--out` with one of these suffixes is a figure file (matplotlib writes the format); a path without a suffix (or an
# existing folder) is a folder; any other suffix is refused ([`figure_out_kind`]).
FIGURE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")


def figure_out_kind(out: str) -> str:
    """`"file"` or `"folder"`: what an `out` path of [`plot_output_dirs`] names.

    Raises:
        ValueError: when `out` ends in a suffix that is not a figure format (`curves.xyz`): it would otherwise
            become a folder named like a file.
    """
    suffix = os.path.splitext(out)[1]
    if os.path.isdir(out) or not suffix:
        return "folder"
    if suffix.lower() in FIGURE_SUFFIXES:
        return "file"
    raise ValueError(
        f"--out {out}: {suffix!r} is not a figure format ({', '.join(FIGURE_SUFFIXES)}): name a file with one of "
        "these extensions, or a folder (a path without an extension) for every figure."
    )


def set_log_y_axis(ax) -> None:
    """Log-scale y axis with labelled ticks at 1, 2 and 5 x 10^k (data within one decade still gets labels)."""
    from matplotlib.ticker import LogFormatterSciNotation, LogLocator

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(LogFormatterSciNotation(labelOnlyBase=False))


def set_step_x_axis(ax) -> None:
    """Label the x axis "optimizer step" with integer ticks only (a short run would otherwise get steps like 2.5)."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("optimizer step")
    ax.xaxis.set_major_locator(MaxNLocator(nbins="auto", steps=[1, 2, 2.5, 5, 10], integer=True))


def _series(rows: Sequence[dict[str, Any]], key: str) -> dict[int, float]:
    """`{step: value}` of one metric over the rows that logged it (a later row for the same step wins)."""
    return {int(row["step"]): float(row[key]) for row in rows if row.get(key) is not None and "step" in row}


def _moving_average(values, window: int):
    """Trailing moving average with a shrinking window at the start (no lag artefacts at step 0)."""
    import numpy as np

    values = np.asarray(values, dtype=float)
    if window <= 1 or len(values) == 0:
        return values
    cumsum = np.cumsum(np.insert(values, 0, 0.0))
    idx = np.arange(1, len(values) + 1)
    start = np.maximum(idx - window, 0)
    return (cumsum[idx] - cumsum[start]) / (idx - start)


def _draw_run(
    ax, x, values, label: str, color: str, scale: str, smoothing: int | None, pooled_over: int | None = None
) -> bool:
    """Draw one run (its (num_seeds, num_steps) `values` over the steps `x`) on a panel; returns whether a curve
    was drawn (a log panel whose mean is 0 everywhere gets a legend entry only). `pooled_over`: `values` is one row
    pooled over that many seeds ([`~stapo_trl.runfiles.metrics_log.pooled_ratio_series`])."""
    import numpy as np  # comes with matplotlib, only for figures

    if pooled_over is not None:
        seed_note = f" ({pooled_over} seeds, pooled)" if pooled_over > 1 else ""
    else:
        seed_note = f" ({len(values)} seeds)" if len(values) > 1 else ""
    if scale == "log":
        mean = values.mean(axis=0)
        positive = mean > 0
        zero_note = f", 0 at {int((~positive).sum())}/{len(mean)} logged steps"
        if positive.any():
            label_text = f"{label}{seed_note}{zero_note}"
            ax.plot(x[positive], mean[positive], "o", ms=3, color=color, label=label_text)
            return True
        # Keep the run in the legend so "never fired" is visible, not mistaken for "not logged".
        ax.plot([], [], "o", ms=3, color=color, label=f"{label}{seed_note}: always 0")
        return False
    window = smoothing or max(1, len(x) // 20)
    smooth = np.stack([_moving_average(v, window) for v in values])  # (num_seeds, num_steps)
    if len(values) == 1:
        ax.plot(x, values[0], color=color, alpha=0.25, lw=0.8)
        ax.plot(x, smooth[0], color=color, lw=1.8, label=label)
    else:
        ax.plot(x, smooth.mean(axis=0), color=color, lw=1.8, label=f"{label}{seed_note}")
        ax.fill_between(x, smooth.min(axis=0), smooth.max(axis=0), color=color, alpha=0.2)
    return True


def plot_training_curves(
    runs: Mapping[str, Run],
    out: str,
    *,
    curves: Sequence[tuple[str, str, str]] = TRAINING_CURVES,
    title: str | None = None,
    smoothing: int | None = None,
) -> str:
    """Draw one panel per metric with every run overlaid ([`training_curves_figure`]), and save a PNG.

    Args:
        runs, curves, title, smoothing: as [`training_curves_figure`].
        out (`str`): Path of the PNG to write (folders are created).

    Returns:
        `str`: `out`.
    """
    fig = training_curves_figure(runs, curves=curves, title=title, smoothing=smoothing)  # selects the Agg backend
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    save_figure(fig, out)
    plt.close(fig)
    return out


def save_figure(fig, out: str | os.PathLike) -> None:
    """`fig.savefig(out)` (dpi 110, the format of `out`'s suffix), never through a symbolic link
    ([`~stapo_trl.runfiles.run_folder.open_run_file`])."""
    with open_run_file(out, "wb") as f:
        fig.savefig(f, dpi=110, format=os.path.splitext(os.fspath(out))[1].lstrip(".").lower() or "png")


def training_curves_figure(
    runs: Mapping[str, Run],
    *,
    curves: Sequence[tuple[str, str, str]] = TRAINING_CURVES,
    title: str | None = None,
    smoothing: int | None = None,
):
    """The figure of [`plot_training_curves`] (a matplotlib `Figure`, not saved): one panel per metric, runs overlaid.

    Args:
        runs (`Mapping[str, Sequence[Sequence[dict]]]`):
            Label -> one list of `metrics.jsonl` rows per seed. One seed: the raw curve (thin) and its moving
            average (bold). Several seeds: the mean of the per-seed moving averages over the steps all seeds logged,
            with a min/max band (log panels: the per-step mean over seeds, as points); a ratio of counts
            (`s2t/silenced_ratio`, `s2t/candidate_ratio`) is pooled instead, Σ silenced / Σ loss tokens over the
            seeds at each step ([`~stapo_trl.runfiles.metrics_log.pooled_ratio_series`]), as the accuracy table pools it.
        curves (`Sequence[tuple[str, str, str]]`, *optional*, defaults to `TRAINING_CURVES`):
            `(log key, panel title, "linear" | "log")` per panel. On a log panel, zeros are not drawn; the legend says
            at how many logged steps the value was 0.
        title (`str`, *optional*):
            Figure title.
        smoothing (`int`, *optional*):
            Moving-average window in logged steps for the linear panels; `None` picks ~1/20 of the run's length.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    # One step axis for every panel: the log panel draws only the steps where the value was > 0, and must not zoom in
    # on them as if the run had ended there.
    fig, axes = plt.subplots(1, len(curves), figsize=(5.2 * len(curves), 3.9), squeeze=False, sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, panel_title, scale) in zip(axes[0], curves):
        drawn = False
        for i, (label, seeds) in enumerate(runs.items()):
            color = colors[i % len(colors)]
            pooled = pooled_ratio_series(seeds, key) if len(seeds) > 1 else None
            if pooled:  # a ratio of counts: Σ numerator / Σ denominator over the seeds, as the accuracy table
                steps = sorted(pooled)
                values = np.array([[pooled[step] for step in steps]])  # (1, num_steps)
                drawn = _draw_run(ax, np.array(steps), values, label, color, scale, smoothing, len(seeds)) or drawn
                continue
            series = [_series(rows, key) for rows in seeds]
            series = [s for s in series if s]
            if not series:
                continue
            steps = sorted(set.intersection(*(set(s) for s in series)))
            if not steps:
                continue
            values = np.array([[s[step] for step in steps] for s in series])  # (num_seeds, num_steps)
            drawn = _draw_run(ax, np.array(steps), values, label, color, scale, smoothing) or drawn
        ax.set_title(panel_title, fontsize=10)
        set_step_x_axis(ax)
        if scale == "log":
            set_log_y_axis(ax)
        if not drawn and not ax.get_legend_handles_labels()[0]:
            ax.text(0.5, 0.5, f"{key!r} not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def plot_output_dirs(
    output_dirs: Sequence[str],
    out: str | None = None,
    *,
    labels: Sequence[str] | None = None,
    title: str | None = None,
    smoothing: int | None = None,
) -> str:
    """Draw the training curves of `stapo-train` output folders (or folders of seeds) into one PNG.

    Args:
        output_dirs (`Sequence[str]`): Folders with `metrics.jsonl`, or folders of per-seed folders.
        out (`str`, *optional*): The figure file (a path ending in one of `FIGURE_SUFFIXES`), or a folder (a path
            without a suffix, or an existing folder; created if needed) that gets `training_curves.png`; default
            `OUTPUT_DIR/training_curves.png` for one folder, `./training_curves.png` for several. Another suffix is
            refused ([`figure_out_kind`]).
        labels (`Sequence[str]`, *optional*): Legend labels, one per folder; default the folder names.
        title (`str`, *optional*): Figure title.
        smoothing (`int`, *optional*): Moving-average window in logged steps.

    Returns:
        `str`: The path of the PNG.

    Raises:
        FileNotFoundError: a folder without `metrics.jsonl` ([`~stapo_trl.runfiles.metrics_log.load_run`]).
        ValueError: a `metrics.jsonl` without a logged step, an `out` with an unknown suffix, a label count that does
            not match.
    """
    if labels is not None and len(labels) != len(output_dirs):
        raise ValueError(f"Got {len(labels)} labels for {len(output_dirs)} output folders.")
    labels = list(labels or [os.path.basename(os.path.normpath(d)) for d in output_dirs])
    if len(set(labels)) < len(labels):  # the same folder name twice: use the paths as given
        labels = [os.path.normpath(d) for d in output_dirs]
    kind = None if out is None else figure_out_kind(out)
    runs = {label: load_run(d, require_steps=True) for label, d in zip(labels, output_dirs)}
    if out is None:
        one_folder = len(output_dirs) == 1 and os.path.isdir(output_dirs[0])
        out = os.path.join(output_dirs[0], "training_curves.png") if one_folder else "training_curves.png"
    elif kind == "folder":
        os.makedirs(out, exist_ok=True)
        out = os.path.join(out, "training_curves.png")
    elif os.path.dirname(out):
        os.makedirs(os.path.dirname(out), exist_ok=True)
    return plot_training_curves(runs, out, title=title, smoothing=smoothing)
