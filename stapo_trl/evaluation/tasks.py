"""The benchmarks (STAPO Sec. 4's six, GSM8K, the built-in `tiny-math`) as [`BenchmarkProblem`]s, avg@N and pass@k."""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections import namedtuple
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ..data import format_prompt, load_local_dataset_file, make_tiny_math_dataset, remove_dapo_instruction
from ..grading import extract_boxed_answer


# default_samples: N of the paper's avg@N; num_problems: the reference copy's; in_paper: in the paper's Avg
_SPEC_FIELDS = "name display_name default_samples hub_id hub_split hub_config num_problems in_paper"
BenchmarkSpec = namedtuple("BenchmarkSpec", _SPEC_FIELDS, defaults=("test", None, None, True))

BENCHMARKS: dict[str, BenchmarkSpec] = {s.name: s for s in (
        BenchmarkSpec("aime24", "AIME24", 32, "HuggingFaceH4/aime_2024", hub_split="train", num_problems=30),
        BenchmarkSpec("aime25", "AIME25", 32, "math-ai/aime25", num_problems=30),
        BenchmarkSpec("amc23", "AMC23", 32, "math-ai/amc23", num_problems=40),
        BenchmarkSpec("math500", "MATH-500", 4, "HuggingFaceH4/MATH-500", num_problems=500),
        BenchmarkSpec("minerva", "Minerva", 4, "math-ai/minervamath", num_problems=272),
        BenchmarkSpec("olympiadbench", "OlympiadBench", 4, "math-ai/olympiadbench", num_problems=675),
        BenchmarkSpec("gsm8k", "GSM8K", 4, "openai/gsm8k", hub_config="main", num_problems=1319, in_paper=False),
        BenchmarkSpec("tiny-math", "TinyMath", 4, "builtin:tiny-math", num_problems=300, in_paper=False),
)}  # fmt: skip
PAPER_BENCHMARKS: tuple[str, ...] = tuple(name for name, spec in BENCHMARKS.items() if spec.in_paper)
BenchmarkProblem = namedtuple("BenchmarkProblem", "id problem gold benchmark", defaults=("",))


def get_benchmark_spec(name: str) -> BenchmarkSpec:
    """The spec of `name` (case, `-` and `_` ignored); `ValueError` listing the valid ones."""
    key = name.strip().lower().replace("-", "").replace("_", "")
    if spec := next((s for s in BENCHMARKS.values() if s.name.replace("-", "") == key), None):
        return spec
    raise ValueError(f"Unknown benchmark {name!r}. Valid benchmarks: {', '.join(BENCHMARKS)}.")


def clean_problem_text(text: str) -> str:
    r"""`text` without DAPO's "Answer:" wrapper and a last-line instruction to answer in `\boxed{}`."""
    text = remove_dapo_instruction(text.strip()).strip()
    if (m := re.search(r"\\boxed\{\}[^\n]*$", text)) is not None:
        head = text[: m.start()]
        start = max(map(head.rfind, ("Let's", "Let us", "Please", "You should", "Think", "Put", "Output", "Return")))
        if start >= 0 and "\n" not in head[start:] and (start == 0 or head[start - 1].isspace()):
            text = text[:start]
    return text.strip()


def _user_content(messages) -> str | None:  # of a chat: a list of messages, one message, or their JSON
    if isinstance(messages, str):
        with contextlib.suppress(json.JSONDecodeError):
            messages = json.loads(messages)
    messages = [messages] if isinstance(messages, Mapping) else messages if isinstance(messages, (list, tuple)) else []
    users = [m.get("content") for m in messages if isinstance(m, Mapping) and m.get("role") == "user"]
    return users[-1] if users else None


def _gold(value) -> str | list[str]:
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, (list, tuple)):
        parts = [str(v).strip() for v in value]
        return parts[0] if len(parts) == 1 else parts
    text = str(value).strip()
    if "####" in text:  # GSM8K
        return text.split("####")[-1].strip().replace(",", "")
    boxed = extract_boxed_answer(text)
    return boxed if boxed is not None and re.fullmatch(r"\s*\\(?:boxed|fbox)\s*\{.*\}\s*", text, re.DOTALL) else text


def normalize_record(row: Mapping, index: int = 0, benchmark: str = "") -> BenchmarkProblem:
    """A row of any layout of docs/evaluation.md as a [`BenchmarkProblem`] (id: the row's, else `index`); `ValueError`
    naming the row's keys without a problem or a gold."""
    texts = (t for k in ("problem", "question", "prompt") if isinstance(t := row.get(k), str) and t.strip())
    if not (problem := next(texts, None) or _user_content(row.get("prompt")) or _user_content(row.get("messages"))):
        raise ValueError(f"Row {index}: no problem field (problem/question/prompt/messages); keys: {sorted(row)}")
    verl = row.get("reward_model") if isinstance(row.get("reward_model"), Mapping) else {}
    answers = [row.get("answer"), row.get("final_answer"), verl.get("ground_truth"), row.get("ground_truth")]
    gold = next((_gold(a) for a in answers if a is not None and str(a).strip()), None)
    if gold is None and isinstance(row.get("solution"), str):  # Minerva: the boxed answer; DAPO: the bare answer
        gold = extract_boxed_answer(row["solution"])
        if gold is None and len(row["solution"]) < 100:
            gold = row["solution"].strip() or None
    if gold in (None, "", []):
        fields = "answer/final_answer/reward_model.ground_truth/ground_truth/boxed solution"
        raise ValueError(f"Row {index}: no gold answer ({fields}); keys: {sorted(row)}")
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), Mapping) else {}
    row_id = next((i for i in [*map(row.get, ("id", "unique_id", "idx")), extra.get("index")] if i is not None), index)
    return BenchmarkProblem(str(row_id), clean_problem_text(problem), gold, benchmark)


def normalize_records(rows: Iterable[Mapping], benchmark: str = "") -> list[BenchmarkProblem]:
    """[`normalize_record`] over rows; a repeated id gets `#<row index>` appended."""
    problems, seen = (normalize_record(row, index=i, benchmark=benchmark) for i, row in enumerate(rows)), set()
    return [seen.add(q.id) or q for i, p in enumerate(problems)
            for q in [p._replace(id=f"{p.id}#{i}") if p.id in seen else p]]  # fmt: skip


def read_rows(path: str | Path) -> list[dict]:
    """A benchmark file's rows (`{"data": [...]}` gives its list); `load_local_dataset_file`'s `ValueError`s."""
    rows = load_local_dataset_file(str(path)).to_list()
    one = len(rows) == 1 and len(rows[0]) == 1 and isinstance(inner := next(iter(rows[0].values())), list)
    return inner if one else rows


def find_benchmark_file(name: str, data_dir: str | Path) -> Path:
    """`<data_dir>/<name>/test.*` or `<name>.*`, or `data_dir` if a file; `FileNotFoundError` naming those tried."""
    if (data_dir := Path(data_dir)).is_file():
        return data_dir
    name, files = get_benchmark_spec(name).name, ("test.jsonl", "test.parquet", "test.json")  # in that order
    tried = [data_dir / name / f for f in files] + [data_dir / f"{name}{Path(f).suffix}" for f in files]
    if found := next((candidate for candidate in tried if candidate.is_file()), None):
        return found
    raise FileNotFoundError(f"No data file for benchmark {name!r}; tried: {', '.join(map(str, tried))}")


def load_benchmark(name: str, data_dir: str | Path | None = None, limit: int | None = None) -> list[BenchmarkProblem]:
    """The first `limit` problems of `name` from `data_dir` or the Hub (`tiny-math`: generated). Raises ValueError (a
    bad name, file or row), FileNotFoundError (no file under `data_dir`), RuntimeError (the Hub copy not loaded)."""
    spec = get_benchmark_spec(name)
    if spec.hub_id == "builtin:tiny-math":
        rows = [{"id": f"tiny-math-{i}", **row} for i, row in enumerate(make_tiny_math_dataset()["test"])]
    elif data_dir is not None:
        rows = read_rows(find_benchmark_file(spec.name, data_dir))
    else:
        try:
            from datasets import load_dataset

            rows = list(load_dataset(spec.hub_id, spec.hub_config, split=spec.hub_split))
        except Exception as e:
            raise RuntimeError(f"Could not load {spec.name!r} from the Hub ({spec.hub_id}, split {spec.hub_split!r}): "
                f"{e}. Offline? Pass --data-dir with <dir>/<name>/test.jsonl files.") from e  # fmt: skip
    return normalize_records(rows[: None if limit is None else max(0, int(limit))], benchmark=spec.name)


def benchmark_dataset(problems: Iterable[BenchmarkProblem], instruction: str | None):
    """The problems as an `eval_dataset`: `prompt` and `solution` (several golds joined with `", "`)."""
    from datasets import Dataset

    rows = [(format_prompt(p.problem, instruction), p.gold) for p in problems]
    return Dataset.from_list([{"prompt": q, "solution": g if isinstance(g, str) else ", ".join(g)} for q, g in rows])


def pass_at_k(n: int, c: int, k: int) -> float:
    """pass@k = 1 - C(n-c, k) / C(n, k) (Chen et al. 2021, Eq. 1); `ValueError` unless 1 <= k <= n, 0 <= c <= n."""
    if not (1 <= k <= n and 0 <= c <= n):
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def benchmark_metrics(correct: Sequence[Sequence[bool]], n_samples: int, benchmark=None, problem_ids=None) -> dict:
    """`avg@N` (mean fraction correct, in [0, 1]), mean `pass@k` (`{str(k): value}`, k the powers of two <= N),
    `n_samples`, `num_problems` of a (P, N) correctness table; `ValueError` naming the problem of an empty row."""
    if (i := next((i for i, row in enumerate(correct) if not row), None)) is not None:
        problem = problem_ids[i] if problem_ids is not None and i < len(problem_ids) else f"#{i}"
        raise ValueError(f"benchmark {benchmark or '?'} problem {problem} has no graded sample (empty row).")
    counts = [(len(row), sum(map(bool, row))) for row in correct]
    mean = lambda values: sum(values) / len(values) if values else float("nan")  # noqa: E731
    passk = {str(2**j): mean([pass_at_k(n, c, 2**j) for n, c in counts]) for j in range(n_samples.bit_length())}
    return {f"avg@{n_samples}": mean([c / n for n, c in counts]), "pass@k": passk, "n_samples": n_samples,
            "num_problems": len(counts)}  # fmt: skip
