"""The `stapo-eval` results file (model, versions, resuming) and its tables: the paper's and `--compare`'s (Sec. 4)."""

from __future__ import annotations

import json
import logging
import os
import platform
from datetime import UTC, datetime
from importlib.metadata import distributions
from pathlib import Path

from huggingface_hub import try_to_load_from_cache

from ..models.cache import weight_files
from ..run_folder.checkpoints import write_atomic
from .tasks import BENCHMARKS, PAPER_BENCHMARKS


RESULTS_FORMAT_VERSION = 2  # 2: a seed per sample; 1 (read, not resumed): per benchmark and decoding
_RESUME_FLAGS = {  # the settings a file resumes only with equal: their flag and what unset means
    "model": ("--model", None), "revision": ("--revision", "the default branch"), "backend": ("--backend", None),
    "samples": ("--samples", "each benchmark's default"), "max_new_tokens": ("--max-new-tokens", None),
    "limit": ("--limit", "every problem"), "data_dir": ("--data-dir", "the Hub datasets"), "seed": ("--seed", None),
    "instruction": ("", None), "chat_template": ("--no-chat-template", None), "dtype": ("--dtype", None),
    "batch_size": ("--batch-size", None), "threads": ("--threads", "torch's default, one for a tiny model"),
}  # fmt: skip
DROPPED_NOTE = ("(n/N): the cell averages n of the benchmark's N problems; the others' prompts were too long for the "
                "model's positions with this generation budget (the results file's num_problems).")  # fmt: skip


def describe_model(model: str, revision: str | None = None) -> dict:
    """`name_or_path`, `source` (`local`/`hub`), `revision`: a folder's absolute path, a cached Hub commit or asked;
    `weights`, what they are: a folder's weight files as {name: [bytes, mtime in ns]}, else the cached Hub commit."""
    if (folder := Path(model).expanduser()).exists():
        stats = {name: (folder / name).stat() for name in weight_files(sorted(os.listdir(folder)))}
        weights = {name: [stat.st_size, stat.st_mtime_ns] for name, stat in stats.items()}
        return {"name_or_path": model, "source": "local", "revision": str(folder.resolve()), "weights": weights}
    try:
        cached = try_to_load_from_cache(model, "config.json", revision=revision)  # snapshots/<commit>/config.json
    except Exception:  # noqa: BLE001 - best effort
        cached = None
    commit = Path(cached).parent.name if isinstance(cached, str) else None
    return {"name_or_path": model, "source": "hub", "revision": commit or revision, "requested_revision": revision,
            "weights": commit}  # fmt: skip


def library_versions(backend: str) -> dict[str, str | None]:
    """The versions of Python and of the libraries that shape the numbers (`None`: not installed)."""
    names = ["stapo_trl", "torch", "transformers", "trl", "math-verify", "latex2sympy2_extended", "datasets"]
    return {"python": platform.python_version()} | {n: next((d.version for d in distributions(name=n)), None)
                                                     for n in names + ["vllm"] * (backend == "vllm")}  # fmt: skip


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def write_json_atomic(path: str | Path, data) -> None:
    """`data` as JSON, never half a file ([`~stapo_trl.run_folder.checkpoints.write_atomic`])."""
    write_atomic(path, json.dumps(data, indent=1, ensure_ascii=False))


def load_results(path: str | Path) -> dict:
    """A results file's content; `ValueError` for a file that is not JSON or not a results file of this format."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not a stapo-eval results file: not JSON ({e}).") from None
    if not isinstance(data, dict) or data.get("format_version") not in (1, 2) or "results" not in data:
        raise ValueError(f"{path} is not a stapo-eval results file (format_version {RESULTS_FORMAT_VERSION}).")
    return data


def check_resumable(existing: dict, config: dict, path: Path, weights) -> None:
    """One `ValueError` line naming each setting that differs from the file's (one it lacks does not) and the flags
    that resume it; else the weights ([`describe_model`]) when they differ from the file's or it lacks them."""
    delete = "so it cannot be resumed: choose another --output, or delete it to rerun."
    if existing.get("format_version") == 1:
        raise ValueError(f"{path} holds results of the old seeding (a seed per benchmark and decoding, now one per "
                         f"sample, as in stapo-train's evaluation), {delete}")  # fmt: skip
    old, whats, add, drop = existing.get("config", {}), [], [], []
    for key, (flag, unset) in _RESUME_FLAGS.items():
        a, b = old.get(key), config.get(key)  # the same numbers: one folder written two ways; each default
        if key == "model" and isinstance(a, str) and isinstance(b, str) and os.path.isdir(b):
            a, b = (os.path.abspath(os.path.expanduser(m)) for m in (a, b))
        if key == "samples" and (names := old.get("benchmarks") or []) and all(n in BENCHMARKS for n in names):
            a, b = ([v or BENCHMARKS[n].default_samples for n in names] for v in (a, b))
        if key not in old or a == b:
            continue
        a, b = old[key], config.get(key)
        if key == "instruction":
            whats.append("the prompt instruction (stapo_trl's own: another version wrote the file)")
        elif key == "chat_template":
            whats.append("{} in the file, {} now".format(*("the chat template" if v else flag for v in (a, b))))
            (drop if a else add).append(flag)
        else:
            whats.append(f"{flag} {a if a is not None or not unset else f'unset ({unset})'} in the file, "
                         f"{b if b is not None or not unset else f'unset ({unset})'} now")  # fmt: skip
            if a is not None:
                add.append(f"{flag} {a}")
            else:
                drop.append(flag)
    if whats:
        rerun = " and ".join([f"with {' '.join(add)}"] * bool(add) + [f"without {', '.join(drop)}"] * bool(drop))
        rerun = f"Rerun {rerun} to add to it" if rerun else "Rerun with the stapo_trl version that wrote it"
        raise ValueError(f"{path} holds results of other settings, so it cannot be resumed: {'; '.join(whats)}. "
                         f"{rerun}, or choose another --output.")  # fmt: skip
    if (was := (existing.get("model") or {}).get("weights", "unrecorded")) != weights:
        what = f"other weights (Hub commit {was or 'unknown'} in the file, {weights or 'unknown'} now)"
        if was == "unrecorded":
            what = "weights it does not record (written before stapo-eval recorded them)"
        elif isinstance(was, dict) and isinstance(weights, dict):
            changed = ", ".join(sorted(n for n in {**was, **weights} if was.get(n) != weights.get(n)))
            what = f"other weights ({changed} changed since)"
        raise ValueError(f"{path} holds results of {what}, {delete}")


def open_results(path: Path, config: dict, weights) -> dict:
    """The results file at `path` to resume ([`load_results`], [`check_resumable`]), else a new one of `config`."""
    if path.exists():
        check_resumable(data := load_results(path), config, path, weights)
        logging.getLogger(__name__).info("Resuming %s", path)
        return data
    versions = library_versions(config["backend"])
    return {"format_version": RESULTS_FORMAT_VERSION, "created_at": now(), "config": config, "model": None,
            "versions": versions, "decodings": {}, "results": {}, "summary": {}, "samples": []}  # fmt: skip


def _avg(table: dict) -> float:
    return table[f"avg@{table['n_samples']}"]


def summarize(results: dict) -> dict:
    """Per decoding: `avg` (mean avg@N over the paper benchmarks present), `benchmarks`, `complete` (all six)."""
    present = {decoding: [b for b in PAPER_BENCHMARKS if b in tables] for decoding, tables in results.items()}
    return {d: {"avg": sum(_avg(results[d][b]) for b in p) / len(p) if p else None, "benchmarks": p,
                "complete": len(p) == len(PAPER_BENCHMARKS)} for d, p in present.items()}  # fmt: skip


def _label(data: dict) -> str:
    name = data["model"]["name_or_path"]
    return name.rstrip("/").split("/")[-1] if data["model"].get("source") == "local" else name


def _table(columns: list[str], rows, partial_note: str):
    """(Markdown lines, values per row, footnotes) of `rows` (label, tables, benchmarks averaged), in %."""
    names = ["Model", *(BENCHMARKS[b].display_name for b in columns), "Avg"]
    lines, values, partial, dropped = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)], [], False, False
    for label, tables, averaged in rows:
        row = [_avg(tables[b]) if b in tables else None for b in columns]
        row.append(sum(_avg(tables[b]) for b in averaged) / len(averaged) if averaged else None)
        counts = [[(tables.get(b) or {}).get(k) for k in ("num_problems", "num_problems_loaded")] for b in columns]
        notes = [f" ({n}/{t})" if None not in (n, t) and n < t else "" for n, t in counts] + [""]
        dropped |= any(notes)
        if row[-1] is not None and len(averaged) < len(PAPER_BENCHMARKS):
            partial, notes[-1] = True, "*"
        cells = ["-" if v is None else f"{100 * v:.1f}{note}" for v, note in zip(row, notes)]
        lines.append("| " + " | ".join([label, *cells]) + " |")
        values.append(row)
    return lines, values, [partial_note] * partial + [DROPPED_NOTE] * dropped


def format_results_table(result_sets: list[dict]) -> str:
    """The paper's table in Markdown: a row per model and decoding, a column per benchmark present, Avg, in %."""
    present = {b for data in result_sets for tables in data["results"].values() for b in tables}
    rows = [(f"{_label(data)}/{decoding}", tables, [b for b in PAPER_BENCHMARKS if b in tables])
            for data in result_sets for decoding, tables in data["results"].items()]  # fmt: skip
    partial = "\\* Avg over the paper benchmarks present (fewer than six)."
    lines, _, notes = _table([b for b in BENCHMARKS if b in present], rows, partial)
    if limits := sorted({data.get("config", {}).get("limit") for data in result_sets} - {None}):
        notes.append(f"Only the first {', '.join(map(str, limits))} problems of each benchmark (--limit).")
    return "\n".join(lines + ([""] + notes if notes else []))


def format_comparison(a: dict, b: dict) -> str:
    """A Markdown table per decoding both files hold (`ValueError` if none): their rows, Avg over the paper benchmarks
    both have, the relative gain (b - a) / a per column; then what differs beyond the model (settings, samples)."""
    if not (shared := [d for d in a["results"] if d in b["results"]]):
        raise ValueError(f"No common decoding: {sorted(a['results'])} vs {sorted(b['results'])}.")
    ca, cb, out, notes = a.get("config", {}), b.get("config", {}), [], []
    keys = ("max_new_tokens", "limit", "instruction", "chat_template", "data_dir")  # the backend may differ
    caveats = [f"{k}: {ca[k]!r} vs {cb[k]!r}" for k in keys if k in ca and k in cb and ca[k] != cb[k]]
    for decoding in shared:
        ta, tb = a["results"][decoding], b["results"][decoding]
        both = [c for c in PAPER_BENCHMARKS if c in ta and c in tb]
        suffixes = (" (a)", " (b)") if _label(a) == _label(b) else ("", "")
        rows = [(f"{_label(d)}/{decoding}{s}", t, both) for d, t, s in zip((a, b), (ta, tb), suffixes)]
        note = f"\\* Avg over the {len(both)} paper benchmark(s) both files have: {', '.join(both)}."
        lines, (va, vb), table_notes = _table([c for c in BENCHMARKS if c in ta or c in tb], rows, note)
        gains = ["n/a" if not x or y is None else f"{100 * (y - x) / x:+.1f}%" for x, y in zip(va, vb)]
        out.append("\n".join([f"Decoding {decoding}", "", *lines, f"| rel. gain (b-a)/a | {' | '.join(gains)} |"]))
        notes += [n for n in table_notes if n not in notes]
        counted = (("n_samples", "samples per problem"), ("num_problems", "problems"))
        caveats += [f"{x} / {decoding}: {ta[x].get(k)} vs {tb[x].get(k)} {what}" for x in BENCHMARKS
                    if x in ta and x in tb for k, what in counted if ta[x].get(k) != tb[x].get(k)]  # fmt: skip
    if caveats:
        notes.append("Not like for like (the files differ in): " + "; ".join(caveats) + ".")
    return "\n\n".join(out + notes)
