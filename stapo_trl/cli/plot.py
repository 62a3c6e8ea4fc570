"""`stapo-plot`: the figures of `stapo-train` output folders or folders of seeds ([`stapo_trl.cli.figures`])."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from . import VersionAction
from .errors import EXIT_STATUS_HELP, InputError, OneLineErrorParser, report_input_errors
from .figures import plot_output_dirs


def main(argv: Sequence[str] | None = None) -> None:
    """`stapo-plot`: bad input is one `stapo-plot: error: ...` line and status 2, before anything is drawn."""
    description = "Draw reward, entropy and S2T silenced-ratio curves from stapo-train output folders."
    parser = OneLineErrorParser("stapo-plot", description=description, allow_abbrev=False, epilog=EXIT_STATUS_HELP)
    folders = "stapo-train output folders (each with metrics.jsonl), or folders of per-seed output folders."
    parser.add_argument("output_dirs", nargs="+", metavar="OUTPUT_DIR", help=folders)
    out = "A figure file for the training curves (.png, .pdf, .svg, .jpg, .jpeg), or a folder for every figure (no "
    out += "extension); the s2t_*.png go next to the curves. Default: OUTPUT_DIR/training_curves.png for one folder, "
    parser.add_argument("--out", help=out + "./training_curves.png for several.")
    parser.add_argument("--labels", nargs="+", help="Legend labels, one per OUTPUT_DIR (default: folder names).")
    parser.add_argument("--title", help="Figure title.")
    parser.add_argument("--smoothing", type=int, help="Moving-average window in logged steps (default: ~1/20 of run).")
    parser.add_argument("--version", action=VersionAction)
    with report_input_errors():
        args = parser.parse_args(argv)
        logging.basicConfig(level=logging.WARNING, format=f"{parser.prog}: warning: %(message)s")
        try:
            figures = plot_output_dirs(**vars(args))  # output_dirs, out, labels, title, smoothing
        except (ValueError, OSError) as e:
            raise InputError(parser.prog, str(e)) from e
        print("\n".join(f"Wrote {os.path.abspath(figure)}" for figure in figures))


if __name__ == "__main__":
    main()
