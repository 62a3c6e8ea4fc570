"""`stapo-plot`: PNG figures from the `metrics.jsonl` (and `spurious_tokens.jsonl`) files that `stapo-train` writes.

    stapo-plot outputs/demo-stapo                                  # -> outputs/demo-stapo/training_curves.png
    stapo-plot outputs/demo-grpo outputs/demo-stapo --out cmp.png  # runs overlaid
    stapo-plot outputs/compare/grpo outputs/compare/stapo          # folders of seeds: mean with a min/max band

The figures are drawn by [`stapo_trl.runfiles.plots.plot_output_dirs`] and [`stapo_trl.runfiles.diagnostic_plots.plot_diagnostics`].
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence

from ..runfiles.diagnostic_plots import load_token_records, plot_diagnostics
from ..runfiles.metrics_log import load_run
from ..runfiles.plots import figure_out_kind, plot_output_dirs
from . import VersionAction
from .errors import EXIT_STATUS_HELP, InputError, OneLineErrorParser, report_input_errors


def make_parser(subparsers: argparse._SubParsersAction | None = None) -> argparse.ArgumentParser:
    """The `stapo-plot` parser (standalone, or the `plot` sub-command of `subparsers`)."""
    description = "Draw reward, entropy and S2T silenced-ratio curves from stapo-train output folders."
    if subparsers is not None:
        parser = subparsers.add_parser("plot", help=description, description=description)
    else:
        parser = OneLineErrorParser(
            prog="stapo-plot", description=description, allow_abbrev=False, epilog=EXIT_STATUS_HELP
        )
    parser.add_argument(
        "output_dirs",
        nargs="+",
        metavar="OUTPUT_DIR",
        help="stapo-train output folders (each with metrics.jsonl), or folders of per-seed output folders.",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="A figure file for the training curves (.png, .pdf, .svg, .jpg, .jpeg), or a folder for every figure (a "
        "path without an extension; the diagnostic s2t_*.png always go next to the curves); another extension is "
        "refused. Default: OUTPUT_DIR/training_curves.png for one folder, ./training_curves.png for several.",
    )
    parser.add_argument(
        "--labels", nargs="+", default=None, help="Legend labels, one per OUTPUT_DIR (default: folder names)."
    )
    parser.add_argument("--title", default=None, help="Figure title.")
    parser.add_argument("--version", action=VersionAction)
    parser.add_argument(
        "--smoothing",
        type=int,
        default=None,
        help="Moving-average window in logged steps (default: ~1/20 of the run).",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """`stapo-plot OUTPUT_DIR [OUTPUT_DIR ...] [--out FILE.png|FOLDER] [--labels ...] [--title ...] [--smoothing N]`.

    A folder without a run (no `metrics.jsonl`, or one without a logged step), or an argument that cannot work,
    raises [`~stapo_trl.cli.errors.InputError`]: one `stapo-plot: error: ...` line and exit status 2, before anything
    is drawn. Lines of `metrics.jsonl` or `spurious_tokens.jsonl` that cannot be read are left out with one warning
    per file that gives their line numbers.
    """
    with report_input_errors():
        _main(argv)


def _main(argv: Sequence[str] | None) -> None:
    parser = make_parser()
    args = parser.parse_args(argv)
    if not logging.getLogger().handlers:  # the run files' warnings (stapo_trl.runfiles.metrics_log), one line each
        logging.basicConfig(level=logging.WARNING, format=f"{parser.prog}: warning: %(message)s")
    if args.smoothing is not None and args.smoothing < 1:
        raise InputError(
            parser.prog, f"--smoothing {args.smoothing}: the moving-average window must be >= 1 logged step."
        )
    if args.labels is not None and len(args.labels) != len(args.output_dirs):
        raise InputError(
            parser.prog,
            f"--labels: got {len(args.labels)} label(s) for {len(args.output_dirs)} OUTPUT_DIR(s): give one label per "
            "folder, or none (the folder names).",
        )
    try:  # every input read before anything is drawn: a broken run folder is an input error, not a drawing failure
        if args.out is not None:
            figure_out_kind(args.out)
        for output_dir in args.output_dirs:
            load_run(output_dir, require_steps=True)
            load_token_records(output_dir)
    except (ValueError, OSError) as e:
        raise InputError(parser.prog, str(e)) from e
    out = plot_output_dirs(args.output_dirs, args.out, labels=args.labels, title=args.title, smoothing=args.smoothing)
    figures = plot_diagnostics(args.output_dirs, os.path.dirname(os.path.abspath(out)), labels=args.labels)
    for figure in [out, *figures]:
        print(f"Wrote {os.path.abspath(figure)}")


if __name__ == "__main__":
    main()
