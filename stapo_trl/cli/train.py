r"""`stapo-train`: train with STAPO (or the GRPO baseline without the mask) from a YAML recipe.

    # The CPU demo (offline, ~2.5 min on 2 cores with the one-time model build): held-out avg@4 ~42 % -> ~66 %.
    stapo-train --config recipes/demo/stapo.yaml
    # Any recipe key can be overridden on the command line; the command line wins over the YAML.
    stapo-train --config recipes/demo/stapo.yaml --max_steps 50 --output_dir outputs/try
    # The same entry point under accelerate (DDP / DeepSpeed / FSDP; vLLM through the GRPOConfig fields):
    accelerate launch --config_file recipes/accelerate_configs/zero2.yaml -m stapo_trl.cli.train --config RECIPE.yaml
    # Both arms of a comparison on the same seeds: one PNG with both runs' curves and a before/after table.
    stapo-train compare recipes/demo/grpo.yaml recipes/demo/stapo.yaml --seeds 0 1 2 [-- --max_steps 100]
    # The common recipe fields (at once); every field with its default and help, or those whose name holds a word.
    stapo-train --help
    stapo-train --help-fields [s2t]

A recipe is a YAML file whose keys are the fields of three argument groups, parsed by [`~trl.TrlParser`]:
[`STAPOScriptArguments`] (trainer, rewards, data, before/after evaluation), [`~stapo_trl.STAPOConfig`] (every
[`~trl.GRPOConfig`] field plus `s2t_*`) and [`~trl.ModelConfig`] (model path, dtype, PEFT). An unknown key is an
error (a typo would otherwise silently leave a default in place).

What a run writes to `output_dir`: checkpoints (`checkpoint-N/`), the final model and tokenizer, `README.md` (model
card), `metrics.jsonl` (every logging step: reward, entropy, `s2t/*`, loss, clip ratios, ...), `training_curves.png`,
`train_results.json`, and with `eval_before_after: true`, `eval.json` (held-out avg@k before and after training; a
rerun into a folder that already holds one writes `eval-step{N}.json` beside it and never replaces it).
A run whose `output_dir` already holds a checkpoint resumes from the last one (set `resume_from_checkpoint` to pick
another; use a fresh `output_dir` to start over).

The two trainers (`trainer:`):
- `stapo`: [`~stapo_trl.STAPOTrainer`] with [`~stapo_trl.STAPOConfig`], the S2T mask in the loss.
- `grpo`: a plain [`~trl.GRPOTrainer`] with a [`~trl.GRPOConfig`] built from the same recipe, and STAPOConfig's
  objective defaults (`loss_type="dapo"`, `epsilon=0.2`, `epsilon_high=0.28`, `beta=0.0`), so that `grpo` is the
  same run without the mask (the paper's JustRL/DAPO baseline), not TRL's default objective. `s2t_*` keys are an
  error with `trainer: grpo` (even at their defaults): a recipe must not look as if it configured a mask it does
  not get. For the mask's bookkeeping without the mask, use `trainer: stapo` with `s2t_mode: off`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from .errors import InputError, print_line, report_input_errors
from .quiet import quiet_upstream as quiet_upstream_imports


# Only light modules above: `--help`, `--version` and the input errors found before parsing the recipe's fields answer
# in well under a second. TRL's config classes (and through them torch and DeepSpeed) are imported by `parse_args` once
# the recipe file has passed its checks, the training stack after parsing.


def main(argv: Sequence[str] | None = None) -> None:
    """`stapo-train [--config RECIPE.yaml] [--key value ...]`, `stapo-train compare ...` or `... --dry-run`; `--help`
    (the common fields), `--help-fields [WORD]` (every field, or those whose name contains WORD) and `--version`.

    A recipe, data or model argument that cannot work (unknown key, a value of the wrong type, out of range or not
    one of the choices, reward, column, model path, `builtin:` name, `num_generations`, ...) ends the command with
    one `stapo-train: error: ...` line and exit status 2 ([`~stapo_trl.cli.errors.InputError`]) before any model
    is built, on every process under `accelerate launch`; a failure during training keeps its traceback (status 1).
    Ctrl-C, SIGTERM or SIGUSR1 during training saves a checkpoint at the next step boundary and prints the resume
    command, then exits with 128 + the signal's number: 130, 143, 138 (a second Ctrl-C quits at once, status 130).
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
    if argv and argv[0] == "compare":
        from .compare import compare  # the training stack: imported after parsing (see below)

        compare(argv[1:])
        return
    if "--dry-run" in argv or "--dry_run" in argv:
        from .dry_run import main as dry_run_main

        # Parse and check the recipe for a process count, print the plan, build nothing (stapo_trl.cli.dry_run).
        raise SystemExit(dry_run_main([a for a in argv if a not in ("--dry-run", "--dry_run")]))
    from .args import fields_help, parse_args, short_help

    if "-h" in argv or "--help" in argv:
        print(short_help())  # the common fields; every field needs TRL's config classes: --help-fields
        raise SystemExit(0)
    if "--help-fields" in argv or "--help_fields" in argv:
        flag = "--help-fields" if "--help-fields" in argv else "--help_fields"
        word = argv[argv.index(flag) + 1] if argv.index(flag) + 1 < len(argv) else None
        print(fields_help(None if word is None or word.startswith("-") else word))
        raise SystemExit(0)
    try:
        script_args, training_args, model_args = parse_args(argv)
        # TRL's trainer, datasets and math-verify (seconds): imported after parsing, so that --help stays fast.
        from .run import prepare, torch_threads, train

        with torch_threads(script_args.torch_num_threads):
            prepared = prepare(script_args, training_args, model_args)
    except (ValueError, OSError) as e:
        raise InputError("stapo-train", str(e)) from e
    train(script_args, training_args, model_args, prepared)


if __name__ == "__main__":
    main()
