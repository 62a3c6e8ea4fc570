"""`stapo-train`: train with STAPO (or the GRPO baseline) from a YAML recipe; `--help` lists the usages."""

from __future__ import annotations

import importlib
import os
import signal
import sys

from . import version_text
from .errors import InputError, print_line, quiet_upstream, report_input_errors


def main(argv: list[str] | None = None) -> None:
    """`stapo-train`: bad input is one error line (status 2) before any model; a stop signal exits 128 + its number."""
    argv = list(sys.argv[1:] if argv is None else argv)
    run: dict = {}  # output_dir, then the checkpoint resumed: for an interrupt's last line
    try:
        with report_input_errors(), quiet_upstream():
            if "--version" in argv:
                print(version_text("stapo-train"))
                raise SystemExit(0)
            if "--dry-run" in argv or "--dry_run" in argv:
                raise SystemExit(importlib.import_module(".dry_run", __package__).main(argv))
            if argv[:1] == ["compare"]:
                raise InputError("stapo-train", "`stapo-train compare` is gone: train each recipe with `stapo-train "
                                 "--config RECIPE.yaml --seed S --output_dir DIR/ARM/seedS`, then `stapo-plot "
                                 "DIR/ARM_A DIR/ARM_B` (`make compare` does both).")  # fmt: skip
            from .args import SHORT_HELP, fields_help, parse_args

            fields = [i for i, a in enumerate(argv) if a in ("--help-fields", "--help_fields")]
            if "-h" in argv or "--help" in argv or fields:
                word = [w for w in argv[fields[0] + 1 : fields[0] + 2] if not w.startswith("-")] if fields else []
                print(fields_help(*word) if fields else SHORT_HELP)
                raise SystemExit(0)
            try:
                script_args, training_args, model_args = parse_args(argv)
                run["output_dir"] = training_args.output_dir
                from .run import prepare, torch_threads, train  # the training stack: after parsing

                with torch_threads(script_args.torch_num_threads):
                    prepared = prepare(script_args, training_args, model_args)
            except (ValueError, OSError) as e:
                raise InputError("stapo-train", str(e)) from e
            run["checkpoint"] = prepared.checkpoint
            train(script_args, training_args, model_args, prepared)
    except KeyboardInterrupt as e:  # after SaveOnSignal's checkpoint, or a bare Ctrl-C
        signal.signal(signal.SIGINT, lambda *_: os._exit(130))  # one more Ctrl-C: gone, this line stays the last
        if os.environ.get("RANK", "0") == "0":
            print_line(str(e) if getattr(e, "checkpoint", None) else interrupted_line(argv, **run))
        raise SystemExit(128 + getattr(e, "signal", 2)) from None  # 2: SIGINT


def interrupted_line(argv: list[str], output_dir: str | None = None, **resumed) -> str:
    """The last line of a run interrupted outside a stop signal's save: what it saved and how to resume."""
    from ..run_folder.checkpoints import newest_complete_checkpoint
    from .run import resume_command

    newest = newest_complete_checkpoint(output_dir)[0] if output_dir else None
    if newest is None:
        return "stapo-train: interrupted: nothing saved."
    saved = "checkpoint" in resumed and os.path.realpath(newest) != os.path.realpath(resumed["checkpoint"] or "")
    what = "checkpoint saved to" if saved else "nothing saved by this run; the newest checkpoint is"
    return f"stapo-train: interrupted: {what} {newest}. Resume with the same command: {resume_command(argv)}"


if __name__ == "__main__":
    main()
