r"""Figures of the S2T diagnostics: what `stapo-plot` adds from `metrics.jsonl` and `spurious_tokens.jsonl`.

    from .diagnostic_plots import plot_diagnostics
    plot_diagnostics([Path("outputs/demo-grpo"), Path("outputs/demo-stapo")], Path("outputs/figures"))

writes, for every run given (several runs share each figure):

- `s2t_entropy_quantiles.png`: the entropy quantiles of all loss tokens over steps (`s2t/entropy_p10` to `p95`):
  a p10-p95 band, p50 solid and p80 dashed, one colour per run, log scale.
- `s2t_ratios.png`: silenced and candidate ratios (log scale; zeros are counted in the legend, not drawn).
- `s2t_prob_entropy.png` (needs `spurious_tokens.jsonl`): the paper's four-quadrant picture, one panel per run:
  probability (log) vs entropy of positive-advantage tokens; silenced tokens in red, kept candidates in blue,
  other positive-advantage tokens (p >= τ_p, a sample) in grey; τ_p and the median τ_h as lines.
- `s2t_top_tokens.png` (needs `spurious_tokens.jsonl`): the most frequent silenced tokens next to the most
  frequent kept candidates (of the logged records), one row per run, with integer counts; byte-level BPE fragments
  are labelled by their bytes (`byte 0xE2`, read from the run's `tokenizer.json`), control characters by their code,
  and the label scheme is written under the figure ([`readable_token`]).

A run is a folder with `metrics.jsonl` (and `spurious_tokens.jsonl` when [`~stapo_trl.runfiles.callbacks.SpuriousTokenLogger`]
ran), or a folder of per-seed folders (the layout of `stapo-train compare`): seeds are averaged on the curves and
pooled on the token figures. A figure whose data no run has is not written.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .metrics_log import SPURIOUS_TOKENS_FILENAME, load_run, pooled_ratio_series, read_token_records
from .plots import save_figure, set_log_y_axis, set_step_x_axis
from .token_labels import TOKEN_LABEL_KEY, load_token_bytes, top_token_labels


logger = logging.getLogger(__name__)

Rows = Sequence[dict[str, Any]]

_KIND_STYLE = {  # kind -> (colour, label, marker size, z-order)
    "reference": ("0.6", "other positive-advantage tokens (sample)", 6, 1),
    "kept_candidate": ("tab:blue", "kept candidates (logged)", 12, 2),
    "silenced": ("tab:red", "silenced (spurious)", 16, 3),
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _run_labels(run_dirs: Sequence[os.PathLike | str]) -> list[str]:
    labels = [os.path.basename(os.path.normpath(d)) for d in run_dirs]
    if len(set(labels)) < len(labels):  # same basename twice: the paths as given
        labels = [os.path.normpath(d) for d in run_dirs]
    return labels


def load_token_records(run_dir: os.PathLike | str) -> list[dict[str, Any]]:
    """Records of `run_dir/spurious_tokens.jsonl`, or of every `run_dir/*/spurious_tokens.jsonl` (seeds), or `[]`.

    Lines that are not token records are skipped with a warning ([`~stapo_trl.runfiles.metrics_log.read_token_records`]); a
    file that holds none is warned about once (the token figures of the run are then not drawn).
    """
    run_dir = os.fspath(run_dir)
    if os.path.isfile(os.path.join(run_dir, SPURIOUS_TOKENS_FILENAME)):
        files = [os.path.join(run_dir, SPURIOUS_TOKENS_FILENAME)]
    elif os.path.isdir(run_dir):
        files = [
            os.path.join(run_dir, name, SPURIOUS_TOKENS_FILENAME)
            for name in sorted(os.listdir(run_dir))
            if os.path.isfile(os.path.join(run_dir, name, SPURIOUS_TOKENS_FILENAME))
        ]
    else:
        files = []
    records = []
    for file in files:
        file_records = read_token_records(file)
        if not file_records and file not in _WARNED_EMPTY:
            _WARNED_EMPTY.add(file)
            logger.warning(
                f"{file} holds no token record: no s2t_prob_entropy.png or s2t_top_tokens.png from it (the run logged "
                "no positive-advantage token, or the file was cut)."
            )
        records += file_records
    return records


_WARNED_EMPTY: set[str] = set()  # spurious_tokens.jsonl files already said to hold no record


def _mean_series(seeds: Sequence[Rows], key: str) -> tuple[list[int], list[float]]:
    """Steps logged by every seed and the mean of `key` over seeds there (None / NaN rows skipped); a ratio of counts
    (`s2t/silenced_ratio`, `s2t/candidate_ratio`) over several seeds is pooled instead, Σ numerator / Σ denominator
    ([`~stapo_trl.runfiles.metrics_log.pooled_ratio_series`])."""
    pooled = pooled_ratio_series([list(rows) for rows in seeds], key) if len(seeds) > 1 else None
    if pooled:
        steps = sorted(pooled)
        return steps, [pooled[step] for step in steps]
    per_seed = []
    for rows in seeds:
        series = {}
        for row in rows:
            value = row.get(key)
            if value is not None and "step" in row and not (isinstance(value, float) and math.isnan(value)):
                series[int(row["step"])] = float(value)
        if series:
            per_seed.append(series)
    if not per_seed:
        return [], []
    steps = sorted(set.intersection(*(set(s) for s in per_seed)))
    return steps, [sum(s[step] for s in per_seed) / len(per_seed) for step in steps]


def _save(fig, out: Path) -> Path:
    plt = _pyplot()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    save_figure(fig, out)
    plt.close(fig)
    return out


def plot_entropy_quantiles(runs: Mapping[str, Sequence[Rows]], out: Path) -> Path | None:
    """Entropy quantile bands over steps (`s2t/entropy_p10` ... `p95`), runs overlaid; `None` if none logged them.

    Args:
        runs (`Mapping[str, Sequence[Sequence[dict]]]`): label -> one list of `metrics.jsonl` rows per seed.
        out (`Path`): PNG to write.
    """
    from ..diagnostics.metrics import ENTROPY_QUANTILES  # imports torch (seconds): not for `stapo-plot --help`

    keys = [f"s2t/entropy_p{round(100 * q)}" for q in ENTROPY_QUANTILES]  # p10, p50, p80, p95
    series = {label: {key: _mean_series(seeds, key) for key in keys} for label, seeds in runs.items()}
    if not any(s[key][0] for s in series.values() for key in keys):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, by_key) in enumerate(series.items()):
        color = colors[i % len(colors)]
        (s10, p10), (s50, p50), (s80, p80), (s95, p95) = (by_key[key] for key in keys)
        if s10 and s10 == s95:
            ax.fill_between(s10, p10, p95, color=color, alpha=0.15, lw=0)
        if s50:
            ax.plot(s50, p50, color=color, lw=1.8, label=f"{label}: p50 (band p10-p95)")
        if s80:
            ax.plot(s80, p80, color=color, lw=1.2, ls="--", label=f"{label}: p80")
    set_log_y_axis(ax)
    set_step_x_axis(ax)
    ax.set_ylabel("entropy of loss tokens (nats)")
    ax.set_title("Policy entropy quantiles (all loss tokens, all processes)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return _save(fig, out)


_RATIO_SERIES = (("s2t/silenced_ratio", "silenced"), ("s2t/candidate_ratio", "candidates"))


def plot_s2t_ratios(runs: Mapping[str, Sequence[Rows]], out: Path) -> Path | None:
    """Silenced and candidate ratios over steps, log scale; `None` if nothing was logged.

    Zeros cannot sit on a log axis: each legend entry says at how many logged steps the value was 0.
    """
    if not any(_mean_series(seeds, "s2t/silenced_ratio")[0] for seeds in runs.values()):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.0))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, seeds) in enumerate(runs.items()):
        color = colors[i % len(colors)]
        for (key, what), marker in zip(_RATIO_SERIES, ("o", "x"), strict=True):
            steps, values = _mean_series(seeds, key)
            if not steps:
                continue
            positive = [(s, v) for s, v in zip(steps, values, strict=True) if v > 0]
            note = f"{label}: {what} (0 at {len(steps) - len(positive)}/{len(steps)} logged steps)"
            ax.plot([s for s, _ in positive], [v for _, v in positive], marker, ms=3.5, color=color, label=note)
    set_log_y_axis(ax)
    set_step_x_axis(ax)
    ax.set_title("S2T token ratios (of loss tokens, log)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return _save(fig, out)


def plot_prob_entropy_scatter(records: Mapping[str, Sequence[dict[str, Any]]], out: Path) -> Path | None:
    """The four-quadrant picture: probability vs entropy of positive-advantage tokens, one panel per run.

    Args:
        records (`Mapping[str, Sequence[dict]]`): label -> `spurious_tokens.jsonl` records.
        out (`Path`): PNG to write.

    Returns:
        `Path` or `None` when no run has a record.
    """
    records = {label: recs for label, recs in records.items() if recs}
    if not records:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(records), figsize=(6.0 * len(records), 4.6), squeeze=False)
    for ax, (label, recs) in zip(axes[0], records.items(), strict=True):
        for kind, (color, name, size, z) in _KIND_STYLE.items():
            points = [r for r in recs if r["kind"] == kind and r["prob"] > 0]
            if points:
                ax.scatter(
                    [r["prob"] for r in points],
                    [r["entropy"] for r in points],
                    s=size,
                    color=color,
                    alpha=0.7,
                    zorder=z,
                    label=f"{name}: {len(points)}",
                    edgecolors="none",
                )
        prob_thresholds = [r["prob_threshold"] for r in recs if r.get("prob_threshold")]
        entropy_thresholds = sorted(r["entropy_threshold"] for r in recs if r.get("entropy_threshold") is not None)
        if prob_thresholds:
            ax.axvline(prob_thresholds[-1], color="k", ls=":", lw=1, label=f"τ_p = {prob_thresholds[-1]:g}")
        if entropy_thresholds:
            median = entropy_thresholds[len(entropy_thresholds) // 2]
            ax.axhline(median, color="k", ls="--", lw=1, label=f"median τ_h = {median:.3g} nats")
        ax.set_xscale("log")
        ax.set_xlabel("probability of the sampled token (log)")
        ax.set_ylabel("entropy at the position (nats)")
        ax.set_title(f"{label}: positive-advantage tokens", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="upper right")
    return _save(fig, out)


def top_tokens_figure(
    records: Mapping[str, Sequence[dict[str, Any]]],
    k: int = 15,
    token_bytes: Mapping[str, Mapping[int, bytes]] | None = None,
):
    """The figure of [`plot_top_tokens`] (a matplotlib `Figure`, not saved), or `None` when no run has a record.

    Args:
        records (`Mapping[str, Sequence[dict]]`): label -> `spurious_tokens.jsonl` records.
        k (`int`, *optional*, defaults to `15`): bars per panel.
        token_bytes (`Mapping[str, Mapping[int, bytes]]`, *optional*): label -> the run's `token id -> bytes`
            ([`load_token_bytes`]), so byte fragments show their bytes.
    """
    from matplotlib.ticker import MaxNLocator

    records = {label: recs for label, recs in records.items() if recs}
    if not records:
        return None
    token_bytes = token_bytes or {}
    plt = _pyplot()
    height = 1.3 + 0.28 * k * len(records)
    fig, axes = plt.subplots(len(records), 2, figsize=(10, height), squeeze=False)
    for row, (label, recs) in zip(axes, records.items(), strict=True):
        panels = (
            (row[0], "silenced", "tab:red", "most frequent silenced tokens", "silenced occurrences over the run"),
            (
                row[1],
                "kept_candidate",
                "tab:blue",
                "most frequent kept candidates",
                "kept-candidate occurrences (logged records)",
            ),
        )
        for ax, kind, color, title, xlabel in panels:
            counts = top_token_labels(recs, kind, k, token_bytes.get(label))
            distinct = len({r.get("token_id", r["token"]) for r in recs if r["kind"] == kind})
            if distinct > len(counts):  # say that the bars are the top of a longer list
                title = f"{title} ({len(counts)} of {distinct} distinct)"
            if counts:
                ax.barh(range(len(counts)), [c for _, c in counts], color=color, alpha=0.8)
                ax.set_yticks(range(len(counts)), [name for name, _ in counts], fontsize=8)
                ax.invert_yaxis()
            else:
                ax.text(0.5, 0.5, "none logged", ha="center", va="center", transform=ax.transAxes, color="gray")
                ax.set_yticks([])
            ax.xaxis.set_major_locator(MaxNLocator(nbins="auto", steps=[1, 2, 2.5, 5, 10], integer=True))
            ax.set_xlabel(xlabel)
            ax.set_title(f"{label}: {title}", fontsize=9)
            ax.grid(alpha=0.3, axis="x")
    fig.text(0.5, 0.01, TOKEN_LABEL_KEY, ha="center", va="bottom", fontsize=7.5, wrap=True)
    fig.tight_layout(rect=(0, 0.45 / height, 1, 1))
    return fig


def plot_top_tokens(
    records: Mapping[str, Sequence[dict[str, Any]]],
    out: Path,
    k: int = 15,
    token_bytes: Mapping[str, Mapping[int, bytes]] | None = None,
) -> Path | None:
    """Bar charts of the k most frequent silenced and kept-candidate tokens, one row per run; `None` without records.

    Every silenced token is logged (up to `SpuriousTokenLogger.max_silenced` per logging step); kept candidates are a
    sample of at most `max_kept_candidates` per logging step, so their counts are of the logged records. Labels
    follow [`readable_token`] (byte fragments by their bytes when `token_bytes` has them), explained under the
    figure; counts are integer ticks.
    """
    fig = top_tokens_figure(records, k, token_bytes)
    if fig is None:
        return None
    plt = _pyplot()
    out.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, out)
    plt.close(fig)
    return out


def plot_diagnostics(
    run_dirs: Sequence[Path | str], out_dir: Path | str, labels: Sequence[str] | None = None
) -> list[Path]:
    """Write every S2T diagnostics figure for the given runs (overlaid) into `out_dir`.

    Args:
        run_dirs (`Sequence[Path]`): `stapo-train` output folders (or folders of per-seed folders).
        out_dir (`Path`): folder of the PNGs (created).
        labels (`Sequence[str]`, *optional*): one legend label per run (default: folder names).

    Returns:
        `list[Path]`: the PNGs written, in the order of the module docstring; figures without data are skipped.

    Raises:
        FileNotFoundError: if a run folder has no `metrics.jsonl` (from [`~stapo_trl.runfiles.metrics_log.load_run`]).
    """
    labels = list(labels) if labels is not None else _run_labels(run_dirs)
    if len(labels) != len(run_dirs):
        raise ValueError(f"got {len(labels)} labels for {len(run_dirs)} run folders")
    out_dir = Path(out_dir)
    runs = {label: load_run(os.fspath(d)) for label, d in zip(labels, run_dirs, strict=True)}
    records = {label: load_token_records(d) for label, d in zip(labels, run_dirs, strict=True)}
    token_bytes = {label: load_token_bytes(d) for label, d in zip(labels, run_dirs, strict=True)}
    written = [
        plot_entropy_quantiles(runs, out_dir / "s2t_entropy_quantiles.png"),
        plot_s2t_ratios(runs, out_dir / "s2t_ratios.png"),
        plot_prob_entropy_scatter(records, out_dir / "s2t_prob_entropy.png"),
        plot_top_tokens(records, out_dir / "s2t_top_tokens.png", token_bytes=token_bytes),
    ]
    return [path for path in written if path is not None]
