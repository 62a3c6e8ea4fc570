r"""`stapo-train`: train with STAPO (or the GRPO baseline without the mask) from a YAML recipe.

    stapo-train --config recipes/demo/stapo.yaml                                      # the CPU demo, offline
    stapo-train --config recipes/demo/stapo.yaml --max_steps 50 --output_dir outputs/try  # the command line wins
    stapo-train --config recipes/Qwen3-8B/stapo.yaml --dry-run --num-processes 16     # the plan, nothing built
    accelerate launch --config_file recipes/accelerate_configs/zero2.yaml -m stapo_trl.cli.train --config RECIPE.yaml

A recipe's keys are the fields of [`~stapo_trl.cli.script_args.STAPOScriptArguments`], [`~stapo_trl.STAPOConfig`]
and [`~trl.ModelConfig`] ([`~stapo_trl.cli.args`]). `trainer: stapo` runs [`~stapo_trl.STAPOTrainer`]; `trainer:
grpo` a plain `GRPOTrainer` on a `GRPOConfig` with STAPOConfig's objective defaults (`loss_type="dapo"`,
`epsilon_high=0.28`, `beta=0.0`): the same run without the mask, where `s2t_*` keys are an error. A run resumes from
the newest complete checkpoint in its `output_dir` (docs/cli.md).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from .errors import InputError, print_line, report_input_errors
from .quiet import quiet_upstream as quiet_upstream_imports


def main(argv: Sequence[str] | None = None) -> None:
    """`stapo-train --config RECIPE.yaml [--FIELD VALUE ...]`, its `--dry-run` ([`~stapo_trl.cli.dry_run`]), `--help`,
    `--help-fields [WORD]` and `--version`.

    Bad input ends the command before any model is built, on every process under `accelerate launch`, with one
    `stapo-train: error: ...` line and exit status 2 ([`~stapo_trl.cli.errors`]); a failure during training keeps its
    traceback (status 1). Ctrl-C, SIGTERM or SIGUSR1 during training saves a checkpoint at the next step boundary and
    prints the resume command, then exits with 128 + the signal's number (a second Ctrl-C quits at once).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--version" in argv:
        from . import version_text

        print(version_text("stapo-train"))
        raise SystemExit(0)
    try:
        with report_input_errors(), quiet_upstream_imports():  # TRL's vLLM-range warning as the trainer loads
            _main(argv)
    except KeyboardInterrupt as e:  # after the checkpoint (stapo_trl.callbacks.SaveOnSignal), or a bare Ctrl-C
        if os.environ.get("RANK", "0") == "0":  # one message per run, not one per process
            print_line(str(e) or "stapo-train: interrupted (outside training: nothing to save).")
        raise SystemExit(128 + getattr(e, "signal", 2)) from None  # 2: SIGINT


def _main(argv: list[str]) -> None:
    if "--dry-run" in argv or "--dry_run" in argv:
        from .dry_run import main as dry_run_main

        raise SystemExit(dry_run_main([a for a in argv if a not in ("--dry-run", "--dry_run")]))
    if argv[:1] == ["compare"]:
        raise InputError(
            "stapo-train",
            "`stapo-train compare` is gone: train each recipe with `stapo-train --config RECIPE.yaml --seed S "
            "--output_dir DIR/ARM/seedS`, then `stapo-plot DIR/ARM_A DIR/ARM_B` (`make compare` does both).",
        )
    if "-h" in argv or "--help" in argv:
        from .args import SHORT_HELP

        print(SHORT_HELP)
        raise SystemExit(0)
    for flag in ("--help-fields", "--help_fields"):
        if flag in argv:
            from .args import fields_help

            word = argv[argv.index(flag) + 1] if argv.index(flag) + 1 < len(argv) else None
            print(fields_help(None if word is None or word.startswith("-") else word))
            raise SystemExit(0)
    try:
        from .args import parse_args

        script_args, training_args, model_args = parse_args(argv)
        from .run import prepare, torch_threads, train  # the training stack (seconds): after parsing

        with torch_threads(script_args.torch_num_threads):
            prepared = prepare(script_args, training_args, model_args)
    except (ValueError, OSError) as e:
        raise InputError("stapo-train", str(e)) from e
    train(script_args, training_args, model_args, prepared)


if __name__ == "__main__":
    main()
