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


# How each resume setting is given to `stapo-eval`, and what its unset value (`None`) means.
_RESUME_FLAGS = {
    "model": ("--model", None),
    "revision": ("--revision", "the default branch"),
    "backend": ("--backend", None),
    "samples": ("--samples", "each benchmark's default"),
    "max_new_tokens": ("--max-new-tokens", None),
    "limit": ("--limit", "every problem"),
    "data_dir": ("--data-dir", "the Hub datasets"),
    "seed": ("--seed", None),
}
_RESUME_KEYS = (*_RESUME_FLAGS, "instruction", "chat_template")  # they change the numbers: equal to resume a file


def _same_setting(key: str, old: Any, new: Any, benchmarks: Sequence[str]) -> bool:
    """Whether two values of a resume setting give the same numbers: the same local model folder written two ways
    (`outputs/x`, `outputs/x/`); `--samples` unset and the default of every benchmark of the file."""
    if key == "model" and isinstance(old, str) and isinstance(new, str) and os.path.isdir(new):
        return os.path.abspath(os.path.expanduser(old)) == os.path.abspath(os.path.expanduser(new))
    if key == "samples" and benchmarks and all(b in BENCHMARKS for b in benchmarks):
        return all(
            (old or BENCHMARKS[b].default_samples) == (new or BENCHMARKS[b].default_samples) for b in benchmarks
        )
    return old == new


def _describe(key: str, value: Any) -> str:
    """A resume setting's value in words: `unset (what that means)` for `None`; the chat template by its flag."""
    if key == "chat_template":
        return "the chat template" if value else "--no-chat-template"
    unset = _RESUME_FLAGS[key][1]
    return f"unset ({unset})" if value is None and unset else str(value)


def _restore(key: str, value: Any) -> tuple[str, str]:
    """(flag to give, flag to leave out) that sets a resume setting back to `value`; `""` for none."""
    if key == "chat_template":
        return ("", "--no-chat-template") if value else ("--no-chat-template", "")
    flag = _RESUME_FLAGS[key][0]
    return ("", flag) if value is None else (f"{flag} {value}", "")


def resume_differences(existing: dict[str, Any], config: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The settings (`_RESUME_KEYS`) that differ between a results file and this run, each as (what differs, the flag
    to give, the flag to leave out to resume the file), e.g. `("--max-new-tokens 48 in the file, 64 now",
    "--max-new-tokens 48", "")`; the flags are `""` where there is none (the prompt instruction is stapo_trl's own).

    A setting the file does not record (written by an older version) is not a difference, nor are two values that
    give the same numbers: the same local model folder written two ways (`outputs/x`, `outputs/x/`), `--samples` unset
    and the default of every benchmark in the file.
    """
    old = existing.get("config", {})
    benchmarks = old.get("benchmarks") or []
    differences = []
    for key in _RESUME_KEYS:
        if key not in old or _same_setting(key, old[key], config.get(key), benchmarks):
            continue
        if key == "instruction":
            differences.append(("the prompt instruction (stapo_trl's own: another version wrote the file)", "", ""))
            continue
        what = f"{_describe(key, old[key])} in the file, {_describe(key, config.get(key))} now"
        differences.append(
            (what if key == "chat_template" else f"{_RESUME_FLAGS[key][0]} {what}", *_restore(key, old[key]))
        )
    return differences


def check_resumable(existing: dict[str, Any], config: dict[str, Any], path: Path) -> None:
    """Refuse to resume a results file written with other settings (`_RESUME_KEYS`: model, backend, samples, ...).

    Raises:
        ValueError: one line listing only the settings that differ ([`resume_differences`]), with the file's value,
            this run's, and the flags that would resume the file, e.g. "results.json holds results of other settings,
            so it cannot be resumed: --max-new-tokens 48 in the file, 64 now. Rerun with --max-new-tokens 48 to add
            to it, or choose another --output."
    """
    differences = resume_differences(existing, config)
    if not differences:
        return
    give = " ".join(flag for _, flag, _ in differences if flag)
    leave_out = ", ".join(flag for _, _, flag in differences if flag)
    rerun = " and ".join(filter(None, [f"with {give}" if give else "", f"without {leave_out}" if leave_out else ""]))
    rerun = f"Rerun {rerun} to add to it" if rerun else "Rerun with the stapo_trl version that wrote it"
    raise ValueError(
        f"{path} holds results of other settings, so it cannot be resumed: "
        + "; ".join(what for what, _, _ in differences)
        + f". {rerun}, or choose another --output."
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


def problems_note(table: dict[str, Any] | None) -> str:
    """`" (n/N)"` for a benchmark table that averages `n` of the `N` problems loaded (the others dropped, their prompts
    being too long for the model's positions), else `""` (also for files written before `N` was recorded)."""
    n, total = (table or {}).get("num_problems"), (table or {}).get("num_problems_loaded")
    if isinstance(n, int) and isinstance(total, int) and n < total:
        return f" ({n}/{total})"
    return ""


PROBLEMS_FOOTNOTE = (
    "(n/N): the cell averages n of the benchmark's N problems; the others' prompts were too long for the model's "
    "positions with this generation budget (the results file's num_problems)."
)


def _limit_note(result_sets: Sequence[dict[str, Any]]) -> str | None:
    limits = sorted({data.get("config", {}).get("limit") for data in result_sets} - {None})
    if not limits:
        return None
    return f"Only the first {', '.join(map(str, limits))} problems of each benchmark (--limit)."


def _model_label(data: dict[str, Any]) -> str:
    name = data["model"]["name_or_path"]
    return name.rstrip("/").split("/")[-1] if data["model"].get("source") == "local" else name


def format_results_table(result_sets: Sequence[dict[str, Any]]) -> str:
    """Markdown table laid out like the paper's: rows model/decoding, columns benchmarks + Avg, in %.

    Args:
        result_sets (`Sequence[dict]`): results files (as loaded by [`load_results`]).

    Returns:
        `str`: the Markdown table (avg@N per cell, with `(n/N)` when it averages n of the benchmark's N problems
        ([`problems_note`]); `*` on Avg when fewer than the six paper benchmarks are present), and its footnotes.
    """
    columns = _columns(result_sets)
    header = ["Model"] + [BENCHMARKS[b].display_name for b in columns] + ["Avg"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    incomplete = dropped = False
    for data in result_sets:
        for decoding, tables in data["results"].items():
            values, avg, complete = _row_values(tables, columns)
            incomplete |= not complete and avg is not None
            notes = [problems_note(tables.get(b)) for b in columns]
            dropped |= any(notes)
            cells = [f"{_model_label(data)}/{decoding}"] + [_fmt(v) + note for v, note in zip(values, notes)]
            cells.append(_fmt(avg) + ("" if complete or avg is None else "*"))
            lines.append("| " + " | ".join(cells) + " |")
    footnotes = ["\\* Avg over the paper benchmarks present (fewer than six)."] if incomplete else []
    footnotes += [PROBLEMS_FOOTNOTE] if dropped else []
    footnotes += [note for note in [_limit_note(result_sets)] if note]
    if footnotes:
        lines += ["", *footnotes]
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
            notes = [problems_note(tables.get(c)) for c in columns]
            if any(notes) and PROBLEMS_FOOTNOTE not in footnotes:
                footnotes.append(PROBLEMS_FOOTNOTE)
            cells = [_fmt(v) + note for v, note in zip(values, notes)]
            lines.append("| " + " | ".join([label] + cells + [_fmt(avg) + mark]) + " |")
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
