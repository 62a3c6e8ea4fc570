"""The arguments of `stapo-train`: `parse_args` (a recipe YAML plus command-line overrides into three dataclasses:
[`~stapo_trl.cli.script_args.STAPOScriptArguments`], [`~stapo_trl.STAPOConfig`], [`~trl.ModelConfig`]) and its parser
([`~stapo_trl.cli.recipe_parser.RecipeParser`]). An unknown key is an error (a typo would otherwise silently leave a
default in place).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

import yaml

from .errors import EXIT_STATUS_HELP


# TRL's config classes (and through them transformers, torch, DeepSpeed: seconds) are imported by the functions that
# need them, after the checks that need no field list, so that `stapo-train --help`, `--version` and a missing or
# broken recipe answer at once.


DESCRIPTION = "`stapo-train`: train with STAPO (or the GRPO baseline without the mask) from a YAML recipe."


USAGE = """
  stapo-train --config RECIPE.yaml [--FIELD VALUE ...]         train (the command line overrides the recipe)
  stapo-train --config RECIPE.yaml --dry-run [--num-processes N]  check a recipe and print its plan, build nothing
  stapo-train compare RECIPE_A.yaml RECIPE_B.yaml [--seeds S ...] [-- --FIELD VALUE ...]
  accelerate launch --config_file ACCELERATE.yaml -m stapo_trl.cli.train --config RECIPE.yaml"""

HELP_FIELDS_INTRO = (
    "--config RECIPE.yaml: a YAML file whose keys are the fields below (recipes/ has the demo and the paper's runs). "
    "Every field can also be given as --FIELD VALUE. `stapo-train --dry-run --help` and `stapo-train compare --help` "
    "describe the other two commands."
)


# The fields most recipes set, for the short `--help` (TRL's config classes are not imported for it; a test checks that
# each is a field). `--help-fields` prints every field with its default and help.
COMMON_FIELDS = (
    ("model", (
        ("model_name_or_path", "a local folder, a Hub id, or builtin:tiny-math (offline)"),
        ("dataset_name", "builtin:tiny-math, a Hub dataset, or a .json/.jsonl/.parquet/.csv file"),
        ("prompt_column, solution_column", "the problem and gold-answer columns of a file or Hub dataset"),
        ("reward_funcs", "reward names (math_accuracy) or dotted import paths"),
    )),
    ("training", (
        ("trainer", "stapo (the S2T mask in the loss) or grpo (the same run without it)"),
        ("output_dir", "checkpoints, metrics.jsonl, figures, the model and its card"),
        ("max_steps, learning_rate, seed", "optimizer steps, step size, seed"),
        ("per_device_train_batch_size", "completions (not prompts) per process and micro-step"),
        ("num_generations, max_completion_length", "completions per prompt, and their length in tokens"),
        ("logging_steps, save_steps, report_to", "metrics.jsonl rows, checkpoints, trackers"),
        ("use_cpu, bf16, torch_num_threads", "device, precision, CPU threads"),
    )),
    ("STAPO", (
        ("s2t_prob_threshold", "tau_p: positive-advantage tokens with p below it are candidates"),
        ("s2t_entropy_quantile", "q: candidates below this entropy quantile are silenced"),
        ("s2t_mode", "low_entropy (STAPO), off, high_entropy, all_low_prob (ablations)"),
    )),
    ("evaluation", (
        ("eval_before_after", "held-out avg@k before and after training, into eval.json"),
    )),
)  # fmt: skip


def short_help() -> str:
    """`stapo-train --help`: the commands, the common recipe fields and the options, without importing TRL (whose config
    classes `--help-fields` needs to list every field: seconds)."""
    intro = (
        "--config RECIPE.yaml: a YAML file of `field: value` lines (recipes/ has the demo and the paper's runs). Every "
        "field can also be given as --FIELD VALUE, which wins over the recipe."
    )
    lines = [f"usage:{USAGE}", "", DESCRIPTION, "", textwrap.fill(intro, width=100)]
    lines += ["", "Common fields (`stapo-train --help-fields` lists all of them, with their defaults and help;"]
    lines += ["`stapo-train --help-fields WORD` those whose name contains WORD):"]
    for group, fields in COMMON_FIELDS:
        lines.append(f"  {group}:")
        lines += [f"    {names:<40} {text}" for names, text in fields]
    lines += [
        "",
        "options:",
        "  -h, --help                 this help, and exit",
        "  --help-fields [WORD]       every recipe field (or those whose name contains WORD), and exit",
        "  --version                  the versions of stapo_trl, TRL, transformers and torch, and exit",
        "  --config RECIPE.yaml       the recipe (recipes/demo/stapo.yaml: the CPU demo)",
        "  --dry-run                  check the recipe and print its plan (`stapo-train --dry-run --help`)",
        "",
        textwrap.fill(EXIT_STATUS_HELP, width=100),
    ]
    return "\n".join(lines)


def fields_help(word: str | None = None, trainer: str = "stapo") -> str:
    """`stapo-train --help-fields [WORD]`: the full parser help (every field of the three argument groups, with its
    default), or only the fields whose name contains `word` (case-insensitive). Imports TRL's config classes."""
    parser = make_parser(trainer=trainer)
    if word:
        word = word.lower().lstrip("-")
        for group in parser._action_groups:
            group._group_actions = [
                action
                for action in group._group_actions
                if any(word in option.lower() for option in action.option_strings if option.startswith("--"))
            ]
        parser._action_groups = [group for group in parser._action_groups if group._group_actions]
        parser.usage = f"stapo-train --help-fields {word}"
    return parser.format_help()


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Field defaults in the help, and the description's examples kept as written."""


def _stapo_objective_defaults() -> dict[str, Any]:
    """The GRPOConfig fields whose default STAPOConfig changes (the paper's objective), with STAPOConfig's values."""
    from trl import GRPOConfig

    from ..config import STAPOConfig

    grpo_fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    return {
        f.name: f.default
        for f in dataclasses.fields(STAPOConfig)
        if f.name in grpo_fields and f.default is not dataclasses.MISSING and f.default != grpo_fields[f.name].default
    }


def make_parser(*, trainer: str = "stapo") -> argparse.ArgumentParser:
    """The `stapo-train` parser: (STAPOScriptArguments, STAPOConfig or GRPOConfig, ModelConfig).

    Args:
        trainer (`str`, *optional*, defaults to `"stapo"`): `"stapo"` parses into [`~stapo_trl.STAPOConfig`];
            `"grpo"` into [`~trl.GRPOConfig`] with STAPOConfig's objective defaults and no `s2t_*` fields.
    """
    from trl import GRPOConfig, ModelConfig

    from ..config import STAPOConfig
    from .recipe_parser import RecipeParser
    from .script_args import TRAINERS, STAPOScriptArguments

    if trainer not in TRAINERS:
        raise ValueError(f"trainer={trainer!r} is not one of {list(TRAINERS)}.")
    config_class = STAPOConfig if trainer == "stapo" else GRPOConfig
    parser = RecipeParser(
        (STAPOScriptArguments, config_class, ModelConfig),
        prog="stapo-train",
        usage=USAGE,
        allow_abbrev=False,  # `--s2t_mod` must not pass for `--s2t_mode`: a typo gets "did you mean" instead
        description=DESCRIPTION + "\n\n" + textwrap.fill(HELP_FIELDS_INTRO, width=100),
        epilog=textwrap.fill(EXIT_STATUS_HELP, width=100),
        formatter_class=_HelpFormatter,
    )
    if trainer == "grpo":
        parser.set_defaults(**_stapo_objective_defaults())
    return parser


def _peek_trainer(argv: Sequence[str]) -> str:
    """`trainer` as the command line or else the recipe sets it (needed to pick the config class before parsing); the
    recipe is read and checked either way ([`load_recipe`])."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    pre.add_argument("--trainer")
    known, _ = pre.parse_known_args(list(argv))
    recipe = load_recipe(known.config) if known.config is not None and os.path.isfile(known.config) else {}
    if known.trainer is not None:
        return known.trainer
    return str(recipe["trainer"]) if recipe.get("trainer") is not None else "stapo"


class _RecipeLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that gives a key twice (PyYAML keeps the last value, silently)."""

    def construct_mapping(self, node, deep=False):
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` merges, it does not repeat a key
                continue
            key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
            if isinstance(key, (str, int, float, bool)) and key in lines:
                raise ValueError(f"key {key} is given twice (lines {lines[key]} and {line}): keep one of them")
            lines[key] = line
        return super().construct_mapping(node, deep=deep)


def load_recipe(path: str) -> dict[str, Any]:
    """The recipe file `path` as a mapping: UTF-8 text, valid YAML, each key given once.

    Raises:
        ValueError: one line naming the file and, where there is one, the line: a byte that is not UTF-8, YAML that
            does not parse, a key given twice, a recipe that is empty or not a mapping.
    """
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise ValueError(
            f"Recipe {path!r} is not UTF-8 text: byte 0x{data[e.start]:02x} at line {line}, column {column}. Save "
            "it as UTF-8 (an editor's 'encoding' setting)."
        ) from None
    try:
        recipe = yaml.load(text, Loader=_RecipeLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"Recipe {path!r} is not valid YAML{where}: {problem}.") from None
    except ValueError as e:
        raise ValueError(f"Recipe {path!r}: {e}.") from None
    if not isinstance(recipe, dict):
        what = "empty" if recipe is None else f"a YAML {type(recipe).__name__}, not a mapping"
        example = "write one `field: value` per line (recipes/demo/stapo.yaml is an example)"
        raise ValueError(f"Recipe {path!r} is {what}: {example}.")
    return recipe


def check_recipe_path(path: str) -> None:
    """Refuse a `--config` path that is not a file: `IsADirectoryError` (a folder), `FileNotFoundError` (nothing)."""
    if os.path.isdir(path):
        raise IsADirectoryError(f"Recipe {path!r} is a folder: give the path of a recipe YAML file in it.")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Recipe {path!r} does not exist.")


def check_recipe_argv(argv: Sequence[str]) -> str:
    """The checks of [`parse_args`] that need no field list, so no TRL import: arguments given, `--config` with a path
    to a file that holds a YAML mapping, and a known `trainer`. Returns the trainer (`"stapo"` unless the command line
    or the recipe sets it).

    Raises:
        ValueError: no arguments, `--config` without a path, a recipe that is not valid YAML (with the line) or not a
            mapping, an unknown trainer.
        FileNotFoundError, IsADirectoryError: the recipe path is not a file.
    """
    argv = list(argv)
    if not argv:
        raise ValueError(
            "no recipe: give --config RECIPE.yaml (the CPU demo: recipes/demo/stapo.yaml), or every field as "
            "--FIELD VALUE. `stapo-train --help-fields` lists the fields."
        )
    if "--config" in argv:
        if argv.index("--config") + 1 == len(argv):
            raise ValueError("--config needs the path of a recipe YAML file.")
        config_path = argv[argv.index("--config") + 1]
        check_recipe_path(config_path)
    trainer = _peek_trainer(argv)
    from .script_args import TRAINERS  # TRL's ScriptArguments: about a second, and no torch

    if trainer not in TRAINERS:
        message = f"trainer={trainer!r} is not one of {list(TRAINERS)}."
        if "--config" in argv and "--trainer" not in argv and not any(a.startswith("--trainer=") for a in argv):
            message = (
                f"recipe key trainer in {config_path}: {message} Fix the value in the recipe, or override it on the "
                "command line with --trainer."
            )
        raise ValueError(message)
    return trainer


def parse_args(argv: Sequence[str] | None = None) -> tuple[Any, Any, Any]:
    """Parse `--config RECIPE.yaml` and command-line overrides into (script_args, training_args, model_args).

    `script_args` is a [`~stapo_trl.cli.script_args.STAPOScriptArguments`], `training_args` an
    [`~stapo_trl.STAPOConfig`] for `trainer: stapo` and a [`~trl.GRPOConfig`] for `trainer: grpo`, `model_args` a
    [`~trl.ModelConfig`]. The checks that need no field list ([`check_recipe_argv`]) come before TRL is imported.

    Raises:
        ValueError: On a recipe that is not valid YAML (with the line), an unknown recipe key (with the closest field
            names), an `s2t_*` key with `trainer: grpo`,
            a `num_generations` that does not divide the generation batch (with the valid values), and every
            check of the config classes' `__post_init__`.
        FileNotFoundError: If the recipe file does not exist.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    trainer = check_recipe_argv(argv)
    parser = make_parser(trainer=trainer)
    if trainer == "grpo":
        s2t_flags = [a.split("=")[0][2:] for a in argv if a.startswith("--s2t_")]
        if s2t_flags:
            raise ValueError(parser._unknown_keys_message(s2t_flags, "the command line"))
    return parser.parse_args_and_config(argv)


def prompt_dataset_kwargs(script_args) -> dict[str, Any]:
    """The arguments of [`~stapo_trl.data.load_prompt_dataset`] a recipe sets (its columns, instruction and DAPO
    stripping), shared by `stapo-train` and the dry run so that both read the same prompts."""
    from ..data import INSTRUCTION  # datasets: kept out of `--help`

    return {
        "dataset_config": script_args.dataset_config,
        "prompt_column": script_args.prompt_column,
        "solution_column": script_args.solution_column,
        "instruction": INSTRUCTION if script_args.instruction is None else script_args.instruction,
        "strip_dapo_instruction": script_args.strip_dapo_instruction,
    }
