"""The `stapo-eval` results file and its tables: model identity, versions, resuming, the paper-style table and
`--compare` (relative gains (b - a) / a, STAPO Sec. 4).
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from .metrics import avg_key
from .tasks import BENCHMARKS, PAPER_BENCHMARKS


RESULTS_FORMAT_VERSION = 1


def describe_model(model: str, revision: str | None = None) -> dict[str, Any]:
    """Identify the evaluated model for the results file.

    Args:
        model (`str`): local path, Hub id, or `builtin:<name>`.
        revision (`str` or `None`): requested Hub revision.

    Returns:
        `dict`: `name_or_path`, `source` (`local`/`hub`), `revision` (the commit hash of a Hub model when it can be
        resolved from the local cache or the Hub, else the requested revision; the absolute path of a local model).
    """
    path = Path(model).expanduser()
    if path.exists():
        return {"name_or_path": model, "source": "local", "revision": str(path.resolve())}
    commit = None
    try:
        from huggingface_hub import try_to_load_from_cache  # only for a Hub model: kept out of `--compare`

        cached = try_to_load_from_cache(model, "config.json", revision=revision)
        if isinstance(cached, str):
            commit = Path(cached).parent.name  # .../snapshots/<commit>/config.json
    except Exception:  # noqa: BLE001 - identification is best effort, never fatal
        commit = None
    if commit is None and os.environ.get("HF_HUB_OFFLINE", "0") not in ("1", "true", "True"):
        try:
            from huggingface_hub import HfApi  # only online, for a Hub model

            commit = HfApi().model_info(model, revision=revision).sha
        except Exception:  # noqa: BLE001
            commit = None
    return {"name_or_path": model, "source": "hub", "revision": commit or revision, "requested_revision": revision}


def library_versions(backend: str) -> dict[str, str | None]:
    """Versions of Python and the libraries that shape the numbers."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    names = ["stapo_trl", "torch", "transformers", "trl", "math-verify", "latex2sympy2_extended", "datasets"]
    if backend == "vllm":
        names.append("vllm")
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


# ----------------------------------------------------------------------------------------------------------------
# Results file
# ----------------------------------------------------------------------------------------------------------------

# Settings that change the numbers of a (benchmark, decoding) pair: they must match to resume a file.
_RESUME_KEYS = (
    "model",
    "revision",
    "backend",
    "samples",
    "max_new_tokens",
    "limit",
    "data_dir",
    "seed",
    "instruction",
    "chat_template",
)


def now() -> str:
    """The current UTC time as ISO 8601 to the second (`2026-11-30T15:44:21+00:00`), for the results file."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write `data` as JSON to `path` through a temporary file in the same folder and `os.replace`.

    Args:
        path (`str` or `Path`): destination (its folder is created).
        data (`Any`): JSON-serialisable object.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, ensure_ascii=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_results(path: str | Path) -> dict[str, Any]:
    """Read a `stapo-eval` results file.

    Raises:
        ValueError: not a results file of this format.
    """
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not a stapo-eval results file: not JSON ({e}).") from None
    if not isinstance(data, dict) or data.get("format_version") != RESULTS_FORMAT_VERSION or "results" not in data:
        raise ValueError(f"{path} is not a stapo-eval results file (format_version {RESULTS_FORMAT_VERSION}).")
    return data


def check_resumable(existing: dict[str, Any], config: dict[str, Any], path: Path) -> None:
    """Refuse to resume a results file written with other settings (`_RESUME_KEYS`: model, backend, samples, ...).

    Raises:
        ValueError: listing every differing setting, with the file's and the new value.
    """
    old = existing.get("config", {})
    diffs = [
        f"{k}: file has {old.get(k)!r}, now {config.get(k)!r}" for k in _RESUME_KEYS if old.get(k) != config.get(k)
    ]
    if diffs:
        raise ValueError(
            f"{path} was written with different settings, so its results cannot be resumed:\n  "
            + "\n  ".join(diffs)
            + "\nRe-run with the same arguments, or choose another --output."
        )


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Six-benchmark averages per decoding.

    Args:
        results (`dict`): the `results` section, `{decoding: {benchmark: table}}`.

    Returns:
        `dict`: `{decoding: {"avg": mean avg@N over the paper benchmarks present (fraction), "benchmarks": [...],
        "complete": all six present}}`.
    """
    summary = {}
    for decoding, tables in results.items():
        present = [b for b in PAPER_BENCHMARKS if b in tables]
        values = [tables[b][avg_key(tables[b])] for b in present]
        summary[decoding] = {
            "avg": sum(values) / len(values) if values else None,
            "benchmarks": present,
            "complete": len(present) == len(PAPER_BENCHMARKS),
        }
    return summary


# ----------------------------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------------------------


def _columns(result_sets: Sequence[dict[str, Any]]) -> list[str]:
    present = {b for data in result_sets for tables in data["results"].values() for b in tables}
    return [b for b in BENCHMARKS if b in present]


def _row_values(tables: dict[str, Any], columns: list[str]) -> tuple[list[float | None], float | None, bool]:
    values = [tables[b][avg_key(tables[b])] if b in tables else None for b in columns]
    paper = [tables[b][avg_key(tables[b])] for b in PAPER_BENCHMARKS if b in tables]
    avg = sum(paper) / len(paper) if paper else None
    return values, avg, len(paper) == len(PAPER_BENCHMARKS)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _model_label(data: dict[str, Any]) -> str:
    name = data["model"]["name_or_path"]
    return name.rstrip("/").split("/")[-1] if data["model"].get("source") == "local" else name


def format_results_table(result_sets: Sequence[dict[str, Any]]) -> str:
    """Markdown table laid out like the paper's: rows model/decoding, columns benchmarks + Avg, in %.

    Args:
        result_sets (`Sequence[dict]`): results files (as loaded by [`load_results`]).

    Returns:
        `str`: the Markdown table (avg@N per cell; `*` on Avg when fewer than the six paper benchmarks are present).
    """
    columns = _columns(result_sets)
    header = ["Model"] + [BENCHMARKS[b].display_name for b in columns] + ["Avg"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    incomplete = False
    for data in result_sets:
        for decoding, tables in data["results"].items():
            values, avg, complete = _row_values(tables, columns)
            incomplete |= not complete and avg is not None
            cells = [f"{_model_label(data)}/{decoding}"] + [_fmt(v) for v in values]
            cells.append(_fmt(avg) + ("" if complete or avg is None else "*"))
            lines.append("| " + " | ".join(cells) + " |")
    if incomplete:
        lines.append("")
        lines.append("\\* Avg over the paper benchmarks present (fewer than six).")
    return "\n".join(lines)


# Settings that must match for two results files to be compared like for like (the backend may differ).
COMPARABLE_SETTINGS = ("max_new_tokens", "limit", "instruction", "chat_template", "data_dir")


def comparison_caveats(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What differs between two results files beyond the model: run settings and per-benchmark sample counts.

    Returns:
        `list[str]`: one line per difference (empty when the files are like for like).
    """
    caveats = []
    config_a, config_b = a.get("config", {}), b.get("config", {})
    for key in COMPARABLE_SETTINGS:
        if key in config_a and key in config_b and config_a[key] != config_b[key]:
            caveats.append(f"{key}: {config_a[key]!r} vs {config_b[key]!r}")
    for decoding in [d for d in a["results"] if d in b["results"]]:
        tables_a, tables_b = a["results"][decoding], b["results"][decoding]
        for bench in [x for x in BENCHMARKS if x in tables_a and x in tables_b]:
            n_a, n_b = tables_a[bench].get("n_samples"), tables_b[bench].get("n_samples")
            if n_a != n_b:
                caveats.append(f"{bench} / {decoding}: {n_a} vs {n_b} samples per problem")
            p_a, p_b = tables_a[bench].get("num_problems"), tables_b[bench].get("num_problems")
            if p_a != p_b:
                caveats.append(f"{bench} / {decoding}: {p_a} vs {p_b} problems")
    return caveats


def format_comparison(a: dict[str, Any], b: dict[str, Any]) -> str:
    """Side-by-side table of two results files with the relative gain (b - a) / a per column, as the paper reports.

    Avg is taken over the paper benchmarks that both files have (marked `*`, with a footnote, when fewer than six),
    so the two Avg values and their gain cover the same benchmarks. Settings that differ between the files
    ([`comparison_caveats`]) are listed under the tables.

    Args:
        a (`dict`): the baseline results file.
        b (`dict`): the compared results file.

    Returns:
        `str`: a Markdown table per decoding present in both files, then the footnote and caveats.

    Raises:
        ValueError: the files share no decoding setting.
    """
    shared = [d for d in a["results"] if d in b["results"]]
    if not shared:
        raise ValueError(f"No common decoding: {sorted(a['results'])} vs {sorted(b['results'])}.")
    out, footnotes = [], []
    for decoding in shared:
        tables_a, tables_b = a["results"][decoding], b["results"][decoding]
        columns = [c for c in BENCHMARKS if c in tables_a or c in tables_b]
        both = [c for c in PAPER_BENCHMARKS if c in tables_a and c in tables_b]
        header = ["Model"] + [BENCHMARKS[c].display_name for c in columns] + ["Avg"]
        lines = [f"Decoding {decoding}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        rows = []
        same_name = _model_label(a) == _model_label(b)
        for tag, data, tables in (("a", a, tables_a), ("b", b, tables_b)):
            values, _, _ = _row_values(tables, columns)
            avg = sum(tables[c][avg_key(tables[c])] for c in both) / len(both) if both else None
            rows.append(values + [avg])
            label = f"{_model_label(data)}/{decoding}" + (f" ({tag})" if same_name else "")
            mark = "" if len(both) == len(PAPER_BENCHMARKS) or avg is None else "*"
            lines.append("| " + " | ".join([label] + [_fmt(v) for v in values] + [_fmt(avg) + mark]) + " |")
        if both and len(both) < len(PAPER_BENCHMARKS):
            note = f"\\* Avg over the {len(both)} paper benchmark(s) both files have: {', '.join(both)}."
            if note not in footnotes:
                footnotes.append(note)
        gains = []
        for va, vb in zip(*rows):
            if va is None or vb is None or va == 0:
                gains.append("n/a")
            else:
                gains.append(f"{100 * (vb - va) / va:+.1f}%")
        lines.append("| " + " | ".join(["rel. gain (b-a)/a"] + gains) + " |")
        out.append("\n".join(lines))
    caveats = comparison_caveats(a, b)
    if caveats:
        footnotes.append("Not like for like (the files differ in): " + "; ".join(caveats) + ".")
    return "\n\n".join(out + footnotes)
