r"""Benchmark registry and the ONE loading/normalisation layer used by `stapo-eval` (the evaluation tasks).

The [STAPO](https://huggingface.co/papers/2602.15620) evaluation (Sec. 4): AIME24, AIME25, AMC23 (avg@32),
MATH-500, Minerva Math, OlympiadBench (avg@4). Extras outside the six-benchmark average: GSM8K, and `tiny-math`, the
held-out split of the built-in two-digit addition task ([`stapo_trl.data.make_tiny_math_dataset`], generated, no
file) for CPU smoke runs and in-training evaluation of `builtin:tiny-math`.

Sources. With `data_dir` (tests, offline machines, reproducible runs) the file for benchmark `name` is
`<data_dir>/<name>/test.{jsonl,parquet,json}` (the layout of the Qwen2.5-Math evaluation copies; when several exist the
first of `DATA_FILE_PREFERENCE` wins), or `data_dir` may be the file itself. Without `data_dir`, real users load
the default Hugging Face Hub dataset of each benchmark (`BenchmarkSpec.hub_id`, well-known public copies; needs
network, never used by the tests).

Normalisation: every layout becomes [`BenchmarkProblem`] (`id`, `problem`, `gold`):

| layout | problem | gold |
|---|---|---|
| MATH / H4 / Qwen2.5-Math jsonl | `problem` or `question` | `answer` (`str`, or a float such as AMC23's `27.0`) |
| OlympiadBench (Qwen2.5-Math, `math-ai/olympiadbench`) | `question` | `final_answer` (list of `$...$` strings) |
| Minerva (Qwen2.5-Math jsonl) | `problem` | the last `\boxed{}` of `solution` (there is no answer field) |
| GSM8K | `question` | `answer` after `####` (thousands commas dropped) |
| verl parquet (JustRL, DAPO) | last user message of `prompt` (chat messages) | `reward_model.ground_truth`, unboxed |
| JustRL json | `prompt` (a string) | `answer` |
| ROLL jsonl | `prompt` (a string) | `ground_truth` |

Prompt clean-up: verl/DAPO prompts may embed an instruction. Known templates are removed so that evaluation adds
exactly one instruction through [`stapo_trl.data.format_prompt`]: a trailing sentence asking for the answer
"within \boxed{}" ("Let's think step by step and output the final answer within \boxed{}.", the project's own
`INSTRUCTION`, ...), and DAPO's "Solve the following math problem step by step. The last line ... Answer: $Answer
..." prefix and its 'Remember to put your answer on its own line after "Answer:".' suffix. Nothing else is edited.
(The Qwen2.5-Math jsonl copies carry no embedded instruction; the stripping matters for verl/DAPO exports.)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..grading import extract_boxed_answer


@dataclass(frozen=True)
class BenchmarkSpec:
    """One registered benchmark.

    Args:
        name (`str`): registry key and results key (`aime24`, ...).
        display_name (`str`): column header in the results table (`AIME24`, ...).
        default_samples (`int`): samples per problem in the paper's protocol (avg@N).
        hub_id (`str`): default Hugging Face Hub dataset id (used only when no `data_dir` is given).
        hub_split (`str`): split of `hub_id`.
        hub_config (`str` or `None`): configuration of `hub_id`.
        num_problems (`int` or `None`): expected problem count of the reference copy (informational).
        in_paper (`bool`): part of the paper's six-benchmark average.
    """

    name: str
    display_name: str
    default_samples: int
    hub_id: str
    hub_split: str = "test"
    hub_config: str | None = None
    num_problems: int | None = None
    in_paper: bool = True


BENCHMARKS: dict[str, BenchmarkSpec] = {
    s.name: s
    for s in (
        BenchmarkSpec("aime24", "AIME24", 32, "HuggingFaceH4/aime_2024", hub_split="train", num_problems=30),
        BenchmarkSpec("aime25", "AIME25", 32, "math-ai/aime25", num_problems=30),
        BenchmarkSpec("amc23", "AMC23", 32, "math-ai/amc23", num_problems=40),
        BenchmarkSpec("math500", "MATH-500", 4, "HuggingFaceH4/MATH-500", num_problems=500),
        BenchmarkSpec("minerva", "Minerva", 4, "math-ai/minervamath", num_problems=272),
        BenchmarkSpec("olympiadbench", "OlympiadBench", 4, "math-ai/olympiadbench", num_problems=675),
        BenchmarkSpec("gsm8k", "GSM8K", 4, "openai/gsm8k", hub_config="main", num_problems=1319, in_paper=False),
        # The built-in two-digit addition task's held-out split (stapo_trl.data), for CPU smoke runs and callbacks.
        BenchmarkSpec("tiny-math", "TinyMath", 4, "builtin:tiny-math", num_problems=300, in_paper=False),
    )
}
"""The registry: benchmark name -> [`BenchmarkSpec`]."""

PAPER_BENCHMARKS: tuple[str, ...] = tuple(name for name, spec in BENCHMARKS.items() if spec.in_paper)
"""The six benchmarks of the paper's average, in the paper's column order."""

DATA_FILE_PREFERENCE: tuple[str, ...] = ("test.jsonl", "test.parquet", "test.json")
"""File names looked up in `<data_dir>/<name>/`, first match wins: beside JustRL's verl parquet copies, the
Qwen2.5-Math jsonl copies (AIME24, AMC23, MATH-500, Minerva, OlympiadBench, GSM8K; AIME25 has only the parquet), which
keep the original rows (OlympiadBench: 675 problems, JustRL's 674) and ids; every copy grades its own golds at >= 99 %
(tests/test_grading_benchmarks.py). Pass the file itself as `data_dir` to evaluate another copy."""


@dataclass(frozen=True)
class BenchmarkProblem:
    """One evaluation problem after normalisation.

    Args:
        id (`str`): stable identifier inside the benchmark (the source's id, or the row index).
        problem (`str`): the problem statement only, without any answer-format instruction.
        gold (`str` or `list[str]`): the ground truth; a list only for multi-answer golds given as lists.
        benchmark (`str`): the benchmark name (`""` for ad-hoc files).
    """

    id: str
    problem: str
    gold: str | list[str]
    benchmark: str = ""


def get_benchmark_spec(name: str) -> BenchmarkSpec:
    """Look up a registered benchmark.

    Args:
        name (`str`): a key of [`BENCHMARKS`] (case-insensitive; `-`/`_` ignored, so `MATH-500` works).

    Returns:
        [`BenchmarkSpec`]

    Raises:
        ValueError: unknown name; the message lists the valid names.
    """

    def canonical(s: str) -> str:
        return s.strip().lower().replace("-", "").replace("_", "")

    matches = [spec for key, spec in BENCHMARKS.items() if canonical(key) == canonical(name)]
    if not matches:
        raise ValueError(f"Unknown benchmark {name!r}. Valid benchmarks: {', '.join(BENCHMARKS)}.")
    return matches[0]


# ----------------------------------------------------------------------------------------------------------------
# Prompt clean-up
# ----------------------------------------------------------------------------------------------------------------

# Sentence openers of instructions that ask for the answer in an empty \boxed{} (verl/SimpleRL/JustRL/ours).
_BOXED_INSTRUCTION_OPENERS = ("Let's", "Let us", "Please", "You should", "Think", "Put", "Output", "Return")
_BOXED_INSTRUCTION_TAIL_RE = re.compile(r"\\boxed\{\}[^\n]*$")
_INSTRUCTION_SUFFIX_RES = [re.compile(r"\s*Remember to put your answer on its own line after \"Answer:\"\.?\s*$")]
_INSTRUCTION_PREFIX_RES = [
    re.compile(
        r"^\s*Solve the following math problem step by step\. The last line of your response should be of the "
        r"form Answer: \$Answer \(without quotes\) where \$Answer is the answer to the problem\.\s*"
    )
]


def _strip_boxed_instruction(text: str) -> str:
    """Drop a trailing sentence (on the last line) that opens with an instruction word and asks for \\boxed{}."""
    m = _BOXED_INSTRUCTION_TAIL_RE.search(text)
    if m is None:
        return text
    head = text[: m.start()]
    start = max(head.rfind(word) for word in _BOXED_INSTRUCTION_OPENERS)
    if start < 0 or "\n" in head[start:] or (start > 0 and not head[start - 1].isspace()):
        return text
    return text[:start]


def clean_problem_text(text: str) -> str:
    r"""Remove embedded answer-format instructions from a problem statement (see the module docstring).

    Args:
        text (`str`): a problem statement, possibly from a verl prompt.

    Returns:
        `str`: the statement without the known instruction prefix/suffix, stripped.
    """
    text = text.strip()
    for rx in _INSTRUCTION_PREFIX_RES:
        text = rx.sub("", text)
    for rx in _INSTRUCTION_SUFFIX_RES:
        text = rx.sub("", text)
    return _strip_boxed_instruction(text.strip()).strip()


# ----------------------------------------------------------------------------------------------------------------
# Record normalisation
# ----------------------------------------------------------------------------------------------------------------


def _user_content(messages: Any) -> str | None:
    if isinstance(messages, str):
        try:
            messages = json.loads(messages)
        except json.JSONDecodeError:
            return None
    if isinstance(messages, Mapping):
        messages = [messages]
    if not isinstance(messages, Iterable):
        return None
    users = [m.get("content") for m in messages if isinstance(m, Mapping) and m.get("role") == "user"]
    return users[-1] if users else None


def _gsm8k_gold(answer: str) -> str:
    return answer.split("####")[-1].strip().replace(",", "")


def _gold_from_answer(value: Any) -> str | list[str]:
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, (list, tuple)):
        parts = [str(v).strip() for v in value]
        return parts[0] if len(parts) == 1 else parts
    s = str(value).strip()
    if "####" in s:
        return _gsm8k_gold(s)
    boxed = extract_boxed_answer(s)
    if boxed is not None and re.fullmatch(r"\s*\\(?:boxed|fbox)\s*\{.*\}\s*", s, re.DOTALL):
        return boxed
    return s


def normalize_record(row: Mapping[str, Any], index: int = 0, benchmark: str = "") -> BenchmarkProblem:
    """Turn one raw row of any supported layout into a [`BenchmarkProblem`] (layouts: module docstring).

    Args:
        row (`Mapping`): one raw record (a JSON object, a parquet row or a `datasets` row).
        index (`int`): row index in its file, used as the id when the row has none.
        benchmark (`str`): benchmark name stored on the problem.

    Returns:
        [`BenchmarkProblem`]

    Raises:
        ValueError: the row has no recognisable problem or gold field (the message lists its keys).
    """
    # Problem text: plain fields first, then chat-message layouts.
    problem = None
    for key in ("problem", "question", "prompt"):
        value = row.get(key)
        if isinstance(value, str) and value.strip():
            problem = value
            break
        if key == "prompt" and value is not None and not isinstance(value, str):
            problem = _user_content(list(value))
            if problem:
                break
    if problem is None and row.get("messages") is not None:
        problem = _user_content(row["messages"])
    if not problem:
        raise ValueError(f"Row {index}: no problem field (problem/question/prompt/messages); keys: {sorted(row)}")

    # Gold answer: explicit answer fields first, then verl/ROLL ground truths, then a boxed solution (Minerva).
    gold: Any = None
    reward_model = row.get("reward_model")
    if row.get("answer") is not None and str(row["answer"]).strip():
        gold = _gold_from_answer(row["answer"])
    elif row.get("final_answer") is not None:
        gold = _gold_from_answer(row["final_answer"])
    elif isinstance(reward_model, Mapping) and reward_model.get("ground_truth") is not None:
        gold = _gold_from_answer(reward_model["ground_truth"])
    elif row.get("ground_truth") is not None:
        gold = _gold_from_answer(row["ground_truth"])
    elif isinstance(row.get("solution"), str):
        gold = extract_boxed_answer(row["solution"])
        if gold is None and len(row["solution"]) < 100:  # DAPO-style: the solution is the bare answer
            gold = row["solution"].strip() or None
    if gold is None or gold == "" or gold == []:
        raise ValueError(
            f"Row {index}: no gold answer (answer/final_answer/reward_model.ground_truth/ground_truth/boxed "
            f"solution); keys: {sorted(row)}"
        )

    extra = row.get("extra_info")
    rid = None
    for key in ("id", "unique_id", "idx"):
        if row.get(key) is not None:
            rid = row[key]
            break
    if rid is None and isinstance(extra, Mapping) and extra.get("index") is not None:
        rid = extra["index"]
    if rid is None:
        rid = index
    return BenchmarkProblem(id=str(rid), problem=clean_problem_text(problem), gold=gold, benchmark=benchmark)


def normalize_records(rows: Iterable[Mapping[str, Any]], benchmark: str = "") -> list[BenchmarkProblem]:
    """Normalise rows and make the ids unique (a repeated id gets `#<row index>` appended).

    Args:
        rows (`Iterable[Mapping]`): raw records.
        benchmark (`str`): benchmark name stored on each problem.

    Returns:
        `list[BenchmarkProblem]`, in row order.
    """
    problems, seen = [], set()
    for i, row in enumerate(rows):
        p = normalize_record(row, index=i, benchmark=benchmark)
        if p.id in seen:
            p = BenchmarkProblem(id=f"{p.id}#{i}", problem=p.problem, gold=p.gold, benchmark=p.benchmark)
        seen.add(p.id)
        problems.append(p)
    return problems


# ----------------------------------------------------------------------------------------------------------------
# Files and the Hub
# ----------------------------------------------------------------------------------------------------------------


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Read raw rows from a `.jsonl`, `.json` (an array, or an object holding one) or `.parquet` file.

    Args:
        path (`str` or `Path`): the file.

    Returns:
        `list[dict]`: the rows as plain Python objects.

    Raises:
        ValueError: unsupported extension or JSON layout.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    if suffix == ".json":
        with path.open(encoding="utf-8") as f:
            data = json.load(f)
        if isinstance(data, Mapping):  # {"data": [...]} / {"test": [...]}
            lists = [v for v in data.values() if isinstance(v, list)]
            if len(lists) != 1:
                raise ValueError(f"{path}: a JSON object must hold exactly one list of rows")
            data = lists[0]
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON array of rows")
        return data
    if suffix == ".parquet":
        import pyarrow.parquet as pq  # only for .parquet files (comes with datasets)

        return pq.read_table(path).to_pylist()
    raise ValueError(f"{path}: unsupported file type {suffix!r} (use .jsonl, .json or .parquet)")


def find_benchmark_file(name: str, data_dir: str | Path) -> Path:
    """Locate the local file of benchmark `name` under `data_dir`.

    Args:
        name (`str`): a registered benchmark name.
        data_dir (`str` or `Path`): a directory laid out as `<data_dir>/<name>/test.{jsonl,parquet,json}`
            (also accepted: `<data_dir>/<name>.{jsonl,parquet,json}`), or the data file itself.

    Returns:
        `Path` to the file.

    Raises:
        FileNotFoundError: nothing found; the message lists the paths tried.
    """
    data_dir = Path(data_dir)
    if data_dir.is_file():
        return data_dir
    name = get_benchmark_spec(name).name
    tried = [data_dir / name / fname for fname in DATA_FILE_PREFERENCE]
    tried += [data_dir / f"{name}{Path(fname).suffix}" for fname in DATA_FILE_PREFERENCE]
    for candidate in tried:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"No data file for benchmark {name!r}; tried: {', '.join(map(str, tried))}")


def load_benchmark(name: str, data_dir: str | Path | None = None, limit: int | None = None) -> list[BenchmarkProblem]:
    """Load and normalise one benchmark.

    Args:
        name (`str`): a key of [`BENCHMARKS`].
        data_dir (`str`, `Path` or `None`): local data (see [`find_benchmark_file`]); `None` loads the default Hub
            dataset (`BenchmarkSpec.hub_id`) with `datasets.load_dataset` (needs network or a warm cache).
            `tiny-math` is generated by [`stapo_trl.data.make_tiny_math_dataset`] (test split) and ignores it.
        limit (`int` or `None`): keep only the first `limit` problems (file order).

    Returns:
        `list[BenchmarkProblem]`

    Raises:
        ValueError: unknown benchmark, or a row without problem/gold.
        FileNotFoundError: no file for the benchmark under `data_dir`.
    """
    spec = get_benchmark_spec(name)
    if data_dir is not None and spec.hub_id.startswith("builtin:"):
        data_dir = None  # built-in tasks are generated, never read from files
    if data_dir is not None:
        rows = read_rows(find_benchmark_file(spec.name, data_dir))
    elif spec.hub_id == "builtin:tiny-math":
        from ..data import make_tiny_math_dataset  # datasets is slow to import: only for tiny-math

        rows = [{"id": f"tiny-math-{i}", **row} for i, row in enumerate(make_tiny_math_dataset()["test"])]
    else:
        try:
            from datasets import load_dataset  # slow to import: only for the Hub source

            rows = list(load_dataset(spec.hub_id, spec.hub_config, split=spec.hub_split))
        except Exception as e:
            raise RuntimeError(
                f"Could not load {spec.name!r} from the Hub ({spec.hub_id}, split {spec.hub_split!r}): {e}. "
                "Offline? Pass --data-dir with <dir>/<name>/test.jsonl files."
            ) from e
    if limit is not None:
        rows = rows[: max(0, int(limit))]
    return normalize_records(rows, benchmark=spec.name)


__all__ = [
    "BENCHMARKS",
    "DATA_FILE_PREFERENCE",
    "PAPER_BENCHMARKS",
    "BenchmarkProblem",
    "BenchmarkSpec",
    "clean_problem_text",
    "find_benchmark_file",
    "get_benchmark_spec",
    "load_benchmark",
    "normalize_record",
    "normalize_records",
    "read_rows",
]
