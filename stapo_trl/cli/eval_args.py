"""The command line of `stapo-eval`: its parser and the parsing of benchmark and decoding lists."""

from __future__ import annotations

import argparse

from ..evaluation.generation import (
    DECODING_ALIASES,
    DECODINGS,
    DEFAULT_MAX_NEW_TOKENS,
)
from ..evaluation.tasks import (
    BENCHMARKS,
    PAPER_BENCHMARKS,
    get_benchmark_spec,
)
from . import VersionAction
from .errors import EXIT_STATUS_HELP, OneLineErrorParser


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
        parser = OneLineErrorParser(
            prog="stapo-eval",
            description=description,
            formatter_class=_DefaultsHelpFormatter,
            allow_abbrev=False,  # --num_sample must not silently mean --num_samples
            epilog=EXIT_STATUS_HELP,
        )
    parser.add_argument("--model", help="Local path, Hub id or builtin:<name> (e.g. builtin:tiny-math).")
    parser.add_argument("--revision", default=None, help="Hub revision (branch, tag or commit) of --model.")
    parser.add_argument("--version", action=VersionAction)
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
    parser.add_argument(
        "--output",
        default=None,
        help="Results JSON (resumed when it exists). Default: MODEL_DIR/stapo_eval.json for a local model folder, "
        "else outputs/stapo-eval/<model>.json (a Hub id's '/' written as '--'); the path is printed.",
    )
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
