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

1. Validates the arguments (unknown benchmark or decoding: the error lists the valid ones; a model folder that holds
   no whole model, or a checkpoint that is not complete; a `--max-new-tokens` that leaves the model, per its
   `config.json`, no position for a prompt) and loads every benchmark through
   [`stapo_trl.evaluation.tasks.load_benchmark`] before any model is loaded.
2. Reads `--output` when it exists ([`default_output`] otherwise; the path is printed first and last): finished
   (benchmark, decoding) pairs are skipped, other benchmarks or decodings added; a file written with other settings
   (model, backend, samples, max new tokens, limit, data dir, seed, prompt) is refused with the differences, and so is
   a path that cannot be written.
3. For each remaining pair: builds the prompts exactly as training does ([`stapo_trl.data.format_prompt`] through the
   tokenizer's chat template when it has one, tokenized without extra special tokens, as TRL does), samples N
   completions per problem, grades each with [`stapo_trl.grading.grade`], and rewrites the results file atomically
   (temporary file + rename).
4. Prints a Markdown table laid out like the paper's (rows: model/decoding; columns: benchmarks + Avg); a cell that
   averages fewer problems than the benchmark has (prompts too long for the model dropped) says `(n/N)`.

Decoding details: sampling with `top_k` disabled (vLLM's default; transformers would otherwise apply its default
`top_k=50`), no repetition penalty. The HF backend is seeded per (benchmark, decoding) pair, so re-runs reproduce.
Avg = mean of avg@N over the six paper benchmarks present in the file (marked `*` when fewer than six).
"""

from __future__ import annotations

import logging
import os
import sys
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from safetensors import SafetensorError

from ..checks.dataset import EVAL_CHAT_TEMPLATE_FIX, chat_template_message, has_chat_template
from ..evaluation.generation import DECODINGS, HFGenerator, evaluate_problems
from ..evaluation.results import (
    RESULTS_FORMAT_VERSION,
    check_resumable,
    describe_model,
    format_comparison,
    format_results_table,
    library_versions,
    load_results,
    now,
    summarize,
    write_json_atomic,
)
from ..evaluation.tasks import BENCHMARKS, BenchmarkProblem, find_benchmark_file, load_benchmark
from ..evaluation.vllm_generation import VLLMGenerator
from ..models import check_model_available, resolve_model_path
from ..preflight import config_max_positions, model_max_positions, prompt_token_budget
from .errors import InputError, report_input_errors
from .eval_args import make_parser, parse_benchmark_list, parse_decoding_list


logger = logging.getLogger(__name__)


def _instruction() -> str | None:
    from ..data import INSTRUCTION  # datasets is slow to import: kept out of `--help` and `--compare`

    return INSTRUCTION


def _pair_seed(seed: int, benchmark: str, decoding: str) -> int:
    return (seed + zlib.crc32(f"{benchmark}/{decoding}".encode())) % (2**31 - 1)


DEFAULT_RESULTS_NAME = "stapo_eval.json"  # next to a local model
DEFAULT_RESULTS_DIR = (
    Path("outputs") / "stapo-eval"
)  # for a Hub id or a builtin: name (or a model folder not writable)


def default_output(model: str, revision: str | None = None) -> Path:
    """Where `stapo-eval` writes its results without `--output`: a place that belongs to the model.

    - a local model folder (a `stapo-train` output folder, a checkpoint) that can be written to:
      `MODEL_DIR/stapo_eval.json`, beside the run's own `eval.json`;
    - a Hub id, a `builtin:` name (its folder is a shared cache) or a folder that cannot be written to:
      `outputs/stapo-eval/<model>.json` in the current folder, `/` written as `--` as in the Hugging Face cache
      (`Qwen/Qwen3-1.7B-Base` -> `outputs/stapo-eval/Qwen--Qwen3-1.7B-Base.json`), with `@<revision>` when given.

    Args:
        model (`str`): `--model` as given.
        revision (`str`, *optional*): `--revision`.

    Returns:
        `Path`: the results file.
    """
    if os.path.isdir(model) and not model.startswith("builtin:") and os.access(model, os.W_OK):
        return Path(model) / DEFAULT_RESULTS_NAME
    label = model.replace("builtin:", "builtin-").strip("/").replace("/", "--") or "model"
    if revision:
        label += "@" + revision.replace("/", "--")
    return DEFAULT_RESULTS_DIR / f"{label}.json"


def _check_output(output: Path) -> None:
    """Refuse a results path that cannot be written, before any model is loaded (the file is written after the first
    benchmark).

    Raises:
        ValueError: `output` is a folder, or its folder cannot be created or written to.
    """
    if output.is_dir():
        raise ValueError(f"--output {output} is a folder: give a file, e.g. {output / DEFAULT_RESULTS_NAME}.")
    folder = output.parent
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"--output {output}: {existing} is a file, not a folder: give another path.")
    if not os.access(existing, os.W_OK):
        raise ValueError(f"--output {output}: {existing} cannot be written to: give a path you can write.")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `stapo-eval` (see the module docstring).

    Args:
        argv (`Sequence[str]` or `None`): arguments without the program name; `None` reads `sys.argv`.

    Returns:
        `int`: 0 on success. An input error (an argument, benchmark file, results file or model that cannot work)
        raises [`~stapo_trl.cli.errors.InputError`]: exit status 2 and one `stapo-eval: error: ...` line (with the
        valid values where there is a list of them), before any model is loaded; a failure during the evaluation
        keeps its traceback (status 1).
    """
    with report_input_errors():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)

    def fail(message: str) -> NoReturn:
        raise InputError(parser.prog, message)  # one line, no usage block

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    if args.compare:
        try:
            a, b = (load_results(p) for p in args.compare)
            print(format_comparison(a, b))
        except (OSError, ValueError) as e:
            fail(str(e))
        return 0

    try:  # validate everything before loading a model
        benchmarks, decodings, samples, data_dir = _validate(args)
    except (ValueError, OSError) as e:
        fail(str(e))
    output = Path(args.output) if args.output else default_output(args.model, args.revision)
    try:
        _check_output(output)
        data = _open_results(args, output, data_dir, benchmarks)
    except (ValueError, OSError) as e:
        fail(str(e))
    print(f"Results file: {output}" + ("" if args.output else " (the default; --output to choose another)"))

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

    from ..trainer import tiny_model_threads  # torch: not for --help and errors

    generator = None
    for decoding_name, bench in todo:
        if generator is None:
            try:  # a real built-in model is converted here on first use; its GGUF checksum is verified first
                model_path = resolve_model_path(args.model) if args.model.startswith("builtin:") else args.model
                check_generation_budget(args, model_path)  # a built-in model built just now: before it is loaded
            except (ValueError, OSError) as e:
                fail(str(e))
            try:
                generator = _make_generator(args, model_path)
                prompt_token_budget(model_max_positions(generator), args.max_new_tokens)  # room left for a prompt
            except (OSError, SafetensorError) as e:  # checked whole above: removed or rewritten while loading
                fail(
                    f"--model {args.model} could not be loaded ({type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
                    "): its files changed while it loaded (a checkpoint removed by save_total_limit's rotation, or "
                    "still being written). Evaluate a complete checkpoint, or the run's final model."
                )
            except RuntimeError as e:
                fail(str(e))
            except ValueError as e:  # --max-new-tokens at or above the model's positions (a small model)
                fail(f"--max-new-tokens {args.max_new_tokens}: {e}")
            if not args.no_chat_template and not has_chat_template(generator.tokenizer):  # as training refuses
                fail(chat_template_message(args.model, "stapo-eval's prompts are", EVAL_CHAT_TEMPLATE_FIX))
            data["model"] = describe_model(model_path, args.revision) | {"name_or_path": args.model}
        with tiny_model_threads(model_path):  # one thread for a tiny model, as training
            _evaluate_pair(args, generator, data, problems[bench], bench, decoding_name, samples[bench], data_dir)
        write_json_atomic(output, data)
    if not todo:
        logger.info("Nothing to do: every (benchmark, decoding) pair is already in %s", output)
    print(format_results_table([data]))
    print(f"Results file: {output}")
    return 0


def _validate(args) -> tuple[list[str], list[str], dict[str, int], str | None]:
    """(benchmarks, decodings, samples per benchmark, resolved data dir) of valid arguments.

    Raises:
        ValueError, OSError: one message naming the argument (and the valid values where there is a list).
    """
    if not args.model:
        raise ValueError("--model is required (unless --compare A_JSON B_JSON).")
    benchmarks = parse_benchmark_list(args.benchmarks)
    decodings = parse_decoding_list(args.decoding)
    for flag, value in (
        ("--samples", args.samples),
        ("--limit", args.limit),
        ("--max-new-tokens", args.max_new_tokens),
        ("--batch-size", args.batch_size),
        ("--tensor-parallel-size", args.tensor_parallel_size),
        ("--max-model-len", args.max_model_len),
    ):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}.")
    share = args.gpu_memory_utilization
    if share is not None and not 0 < share <= 1:
        raise ValueError(
            f"--gpu-memory-utilization must be in (0, 1] (the share of the device's memory vLLM may use), got "
            f"{share}; leave it unset for 0.9 on a GPU, 0.2 on CPU."
        )
    samples = {b: args.samples or BENCHMARKS[b].default_samples for b in benchmarks}
    data_dir = str(Path(args.data_dir).resolve()) if args.data_dir else None
    if data_dir is not None and not Path(data_dir).exists():
        raise ValueError(f"--data-dir {args.data_dir} does not exist.")
    # A missing local directory, or a Hub id neither cached nor reachable, fails here: before data or model loading.
    check_model_available(args.model, args.revision)
    check_generation_budget(args, args.model)
    return benchmarks, decodings, samples, data_dir


def check_generation_budget(args, model_path: str) -> None:
    """Refuse a `--max-new-tokens` that leaves no position for a prompt, from the model's `config.json` (and vLLM's
    `--max-model-len`), before the model is loaded; nothing is refused when the positions cannot be read yet (a
    `builtin:` model not built: checked again once it is).

    Raises:
        ValueError: "--max-new-tokens N: max_new_tokens=N leaves no room for a prompt: the model has P positions ...".
    """
    positions = config_max_positions(model_path, args.revision)
    if args.backend == "vllm" and args.max_model_len is not None:
        positions = min(positions or args.max_model_len, args.max_model_len)
    try:
        prompt_token_budget(positions, args.max_new_tokens)
    except ValueError as e:
        raise ValueError(f"--max-new-tokens {args.max_new_tokens}: {e}") from None


def _open_results(args, output: Path, data_dir: str | None, benchmarks: list[str]) -> dict[str, Any]:
    """The results file to fill: `output` when it exists and was written with the same settings, else a new one.

    Raises:
        ValueError: `output` is not a results file, or was written with other settings (the differences listed).
    """
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
        data = load_results(output)
        check_resumable(data, config, output)
        logger.info("Resuming %s", output)
    else:
        data = {
            "format_version": RESULTS_FORMAT_VERSION,
            "created_at": now(),
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
    return data


def _evaluate_pair(args, generator, data, problems, bench, decoding_name, n, data_dir) -> None:
    """Evaluate one (benchmark, decoding) pair into `data` (results, samples, summary)."""
    decoding = DECODINGS[decoding_name]
    logger.info("Evaluating %s / %s: %d problems x %d samples", bench, decoding_name, len(problems), n)
    table, records = evaluate_problems(
        generator.generate,
        generator.tokenizer,
        problems,
        n=n,
        decoding=decoding,
        max_new_tokens=args.max_new_tokens,
        seed=_pair_seed(args.seed, bench, decoding_name),
        instruction=_instruction(),
        use_chat_template=not args.no_chat_template,
        save_completions=args.save_completions,
        max_positions=model_max_positions(generator),
    )
    table["data_source"] = _data_source(bench, data_dir)
    table["num_problems_loaded"] = len(problems)  # before prompts too long for the model are dropped
    table["finished_at"] = now()
    data["decodings"][decoding_name] = {"temperature": decoding.temperature, "top_p": decoding.top_p, "top_k": None}
    data["results"].setdefault(decoding_name, {})[bench] = table
    data["samples"].extend(records)
    data["summary"] = summarize(data["results"])
    data["updated_at"] = now()
    logger.info(
        "%s / %s: avg@%d = %.1f %%, %d grader errors",
        bench,
        decoding_name,
        n,
        100 * table[f"avg@{n}"],
        table["num_grader_errors"],
    )


def _data_source(bench: str, data_dir: str | None) -> str:
    spec = BENCHMARKS[bench]
    if spec.hub_id.startswith("builtin:"):
        return spec.hub_id
    if data_dir is None:
        return f"hub:{spec.hub_id}" + (f"/{spec.hub_config}" if spec.hub_config else "") + f":{spec.hub_split}"
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


if __name__ == "__main__":
    sys.exit(main())
