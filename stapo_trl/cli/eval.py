"""`stapo-eval`: avg@N and pass@k on the paper's math benchmarks (STAPO Sec. 4), resumed pair by pair (docs/cli.md)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from .. import data
from ..evaluation import generation as gen
from ..evaluation import results, tasks
from ..models import builtin_model_dir, check_model_available, resolve_model_path
from . import VersionAction
from .errors import EXIT_STATUS_HELP, InputError, OneLineErrorParser, report_input_errors


logger = logging.getLogger(__name__)


class _Defaults(argparse.HelpFormatter):
    def _get_help_string(self, action):
        trivial = action.default in (None, False, argparse.SUPPRESS) or "%(default)" in action.help
        return action.help + " (default: %(default)s)" * (not trivial)


def make_parser() -> argparse.ArgumentParser:
    """The `stapo-eval` argument parser (no prefix matching)."""
    add = (parser := OneLineErrorParser(
        prog="stapo-eval", formatter_class=_Defaults, allow_abbrev=False, epilog=EXIT_STATUS_HELP,
        description="Evaluate a model on the STAPO paper's math benchmarks (avg@N, pass@k), or compare two results.",
    )).add_argument  # fmt: skip
    add("--model", help="Local path, Hub id or builtin:<name> (e.g. builtin:tiny-math).")
    add("--revision", help="Hub revision (branch, tag or commit) of --model.")
    add("--version", action=VersionAction)
    add("--benchmarks", default=",".join(tasks.PAPER_BENCHMARKS), help="One or more: " + ",".join(tasks.BENCHMARKS))
    add("--decoding", default="paper", help=f"Comma-separated: {gen.DECODING_NAMES} (paper: t1.0-p1.0,t0.7-p0.9).")
    paper_samples = ", ".join(f"{n} {s.default_samples}" for n, s in tasks.BENCHMARKS.items() if s.in_paper)
    add("--samples", type=int, help=f"Samples per problem (N of avg@N). Default: the paper's, {paper_samples}.")
    add("--max-new-tokens", type=int, default=gen.DEFAULT_MAX_NEW_TOKENS, help="Tokens generated per sample at most.")
    add("--backend", choices=["vllm", "hf"], default="vllm", help="Generation backend.")
    add("--data-dir", help="Local benchmark files <dir>/<name>/test.{jsonl,parquet,json}. Default: the Hub datasets.")
    add("--output", help="Results JSON, resumed when it exists. Default: MODEL_DIR/stapo_eval.json for a local model "
        "folder, else outputs/stapo-eval/<model>.json (a Hub id's '/' as '--'); it is printed.")  # fmt: skip
    add("--limit", type=int, help="Only the first K problems of each benchmark.")
    add("--compare", nargs=2, metavar=("A_JSON", "B_JSON"), help="Compare two results files.")
    add("--seed", type=int, default=0, help="Sample j of problem i is seeded SEED + i * N + j.")
    add("--batch-size", type=int, default=64, help="HF backend: sequences per generate call.")
    add("--threads", type=int, help="torch CPU threads. Default: torch's, one for a built-in tiny model.")
    add("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"], help="Weights dtype.")
    add("--tensor-parallel-size", type=int, default=1, help="vLLM backend: GPUs per model.")
    add("--gpu-memory-utilization", type=float, help="vLLM backend: GPU memory share (CPU backend: CPU memory share). "
        "Default: 0.9 on a GPU, 0.2 on CPU.")  # fmt: skip
    add("--max-model-len", type=int, help="vLLM backend: context length cap.")
    add("--no-chat-template", action="store_true", help="Feed the user message as plain text, even with a template.")
    add("--save-completions", action="store_true", help="Store each completion's text in the per-sample records.")
    return parser


def parse_decoding_list(value: str) -> list[str]:
    """Comma-separated decodings (`paper`: both of the paper's) as names; `ValueError` listing the valid ones."""
    raws = filter(None, map(str.strip, value.split(",")))
    given = [gen.DECODING_ALIASES.get(raw) or [gen.decoding_setting(raw).name] for raw in raws]
    if not (names := list(dict.fromkeys(name for names in given for name in names))):
        raise ValueError(f"No decoding given. Valid decodings: {gen.DECODING_NAMES}.")
    return names


def default_output(model: str, revision: str | None = None) -> Path:
    """`MODEL_DIR/stapo_eval.json` for a writable local folder, else `outputs/stapo-eval/<model>[@<revision>].json`."""
    if os.path.isdir(model) and not model.startswith("builtin:") and os.access(model, os.W_OK):
        return Path(model) / "stapo_eval.json"
    label = model.replace("builtin:", "builtin-").strip("/").replace("/", "--") or "model"
    return Path("outputs") / "stapo-eval" / f"{label}{'@' + revision.replace('/', '--') if revision else ''}.json"


def main(argv: list[str] | None = None) -> int:
    """`stapo-eval`: 0, or an input error in one line and status 2 before the model loads."""
    with report_input_errors():
        args = (parser := make_parser()).parse_args(argv)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            if args.compare:
                print(results.format_comparison(*map(results.load_results, args.compare)))
                return 0
            if not args.model:
                raise ValueError("--model is required (unless --compare A_JSON B_JSON).")
            names = filter(str.strip, args.benchmarks.split(","))
            benchmarks = dict.fromkeys(tasks.get_benchmark_spec(name).name for name in names)
            if not benchmarks:
                raise ValueError(f"No benchmark given. Valid benchmarks: {', '.join(tasks.BENCHMARKS)}.")
            decodings = parse_decoding_list(args.decoding)
            for flag in "samples limit max_new_tokens batch_size threads tensor_parallel_size max_model_len".split():
                if (value := getattr(args, flag)) is not None and value < 1:
                    raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}.")
            if (share := args.gpu_memory_utilization) is not None and not 0 < share <= 1:
                raise ValueError(f"--gpu-memory-utilization must be in (0, 1] (the share of the device's memory vLLM "
                                 f"may use), got {share}; leave it unset for 0.9 on a GPU, 0.2 on CPU.")  # fmt: skip
            if args.data_dir and not Path(args.data_dir).exists():
                raise ValueError(f"--data-dir {args.data_dir} does not exist.")
            check_model_available(args.model, args.revision)
            check_generation_budget(args, args.model)
            data_dir = str(Path(args.data_dir).resolve()) if args.data_dir else None
            output = Path(args.output) if args.output else default_output(args.model, args.revision)
            if output.is_dir():
                raise ValueError(f"--output {output} is a folder: give a file, e.g. {output / 'stapo_eval.json'}.")
            existing = next(p for p in (output.parent, *output.parent.parents) if p.exists())
            if not existing.is_dir():
                raise ValueError(f"--output {output}: {existing} is a file, not a folder: give another path.")
            if not os.access(existing, os.W_OK):
                raise ValueError(f"--output {output}: {existing} cannot be written to: give a path you can write.")
            config = {k: getattr(args, k) for k in "model revision backend samples max_new_tokens limit".split()}
            config |= {"data_dir": data_dir, "seed": args.seed, "instruction": data.INSTRUCTION, "chat_template": not
                       args.no_chat_template, "dtype": args.dtype, "batch_size": args.batch_size}  # fmt: skip
            model_dir = str(builtin_model_dir(args.model)) if args.model.startswith("builtin:") else args.model
            weights = results.describe_model(model_dir, args.revision)["weights"]
            content = results.open_results(output, config | {"threads": args.threads}, weights)
            known = {*content["config"].get("benchmarks", []), *benchmarks}
            content["config"]["benchmarks"] = [b for b in tasks.BENCHMARKS if b in known]
            todo = [(d, b) for d in decodings for b in benchmarks if b not in content["results"].get(d, {})]
            problems = {b: tasks.load_benchmark(b, data_dir, args.limit) for b in dict.fromkeys(b for _, b in todo)}
        except (OSError, ValueError, RuntimeError) as e:
            raise InputError(parser.prog, str(e)) from None
        print(f"Results file: {output}" + ("" if args.output else " (the default; --output to choose another)"))
        if len(todo) < len(decodings) * len(benchmarks):
            logger.info("Skipping the pairs already in %s", output)
        from . import run  # the training stack: after the checks

        generator = None
        for decoding, bench in todo:
            if generator is None:
                generator, model_path = _load_generator(parser, args)
                content["model"] = results.describe_model(model_path, args.revision) | {"name_or_path": args.model}
            with run.torch_threads(args.threads), run.tiny_model_threads(getattr(generator, "model", model_path)):
                _evaluate_pair(args, generator, content, problems[bench], bench, decoding, data_dir)
            results.write_json_atomic(output, content)
        print(results.format_results_table([content]))
        print(f"Results file: {output}")
        return 0


def check_generation_budget(args, model_path: str, positions: int | None = None) -> None:
    """`ValueError` when the model's `positions` (else its config's, `--max-model-len`'s cap) leave no prompt room."""
    positions = positions or data.model_max_positions(model_path, args.revision)
    if args.backend == "vllm" and args.max_model_len is not None:
        positions = min(positions or args.max_model_len, args.max_model_len)
    try:
        data.prompt_token_budget(positions, args.max_new_tokens)
    except ValueError as e:
        raise ValueError(f"--max-new-tokens {args.max_new_tokens}: {e}") from None


def _load_generator(parser, args):
    from safetensors import SafetensorError

    try:
        model_path = resolve_model_path(args.model) if args.model.startswith("builtin:") else args.model
        if args.backend == "vllm":
            vllm = {k: getattr(args, k) for k in "revision dtype seed tensor_parallel_size max_model_len".split()}
            generator = gen.VLLMGenerator(model_path, args.gpu_memory_utilization, **vllm)
        else:
            generator = gen.HFGenerator(model_path, args.revision, args.dtype, batch_size=args.batch_size)
        check_generation_budget(args, model_path, data.model_max_positions(generator))
        if not args.no_chat_template and data.has_chat_template(generator.tokenizer):
            gen.build_prompt_text(generator.tokenizer, "1+1")
    except (OSError, SafetensorError) as e:  # checked before: changed while it loaded
        cause = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
        raise InputError(parser.prog, f"--model {args.model} could not be loaded ({cause}): its files changed while "
                         "it loaded (a checkpoint removed by save_total_limit's rotation, or still being written). "
                         "Evaluate a complete checkpoint, or the run's final model.") from None  # fmt: skip
    except (RuntimeError, ValueError) as e:
        raise InputError(parser.prog, str(e)) from None
    if not args.no_chat_template and not data.has_chat_template(generator.tokenizer):
        fix = data.EVAL_CHAT_TEMPLATE_FIX
        raise InputError(parser.prog, data.chat_template_message(args.model, "stapo-eval's prompts are", fix))
    return generator, model_path


def _evaluate_pair(args, generator, content, problems, bench: str, decoding: str, root: str | None) -> None:
    import torch

    setting, spec = gen.decoding_setting(decoding), tasks.BENCHMARKS[bench]
    n = args.samples or spec.default_samples
    logger.info("Evaluating %s / %s: %d problems x %d samples", bench, decoding, len(problems), n)
    table, records = gen.evaluate_problems(
        generator.generate, generator.tokenizer, problems, n=n, decoding=setting, max_new_tokens=args.max_new_tokens,
        seed=args.seed, use_chat_template=not args.no_chat_template, save_completions=args.save_completions,
        max_positions=data.model_max_positions(generator),
    )  # fmt: skip
    hub = f"hub:{spec.hub_id}" + (f"/{spec.hub_config}" if spec.hub_config else "") + f":{spec.hub_split}"
    local = spec.hub_id if spec.hub_id.startswith("builtin:") else root and tasks.find_benchmark_file(bench, root)
    table |= {"data_source": str(local or hub), "num_problems_loaded": len(problems), "finished_at": results.now(),
              "threads": torch.get_num_threads()}  # fmt: skip
    content["decodings"][decoding] = {"temperature": setting.temperature, "top_p": setting.top_p, "top_k": None}
    content["results"].setdefault(decoding, {})[bench] = table
    content["samples"].extend(records)
    content["summary"], content["updated_at"] = results.summarize(content["results"]), results.now()
    logger.info("%s / %s: avg@%d = %.1f %%, %d grader errors", bench, decoding, n, 100 * table[f"avg@{n}"],
                table["num_grader_errors"])  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
