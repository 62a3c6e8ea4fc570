"""`RecipeParser`: TRL's `TrlParser` with errors that say what to do (the recipe key and file, the closest field
names, the valid values), and the checks of recipe values that argparse does not make."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import re
import sys

import yaml
from trl import TrlParser

from .errors import InputError
from .geometry import BatchGeometry


# Recipe keys that older TRL / transformers versions accepted, with what to write instead (the pins of setup.cfg).
RENAMED_KEYS = {
    "torch_dtype": "`dtype` (transformers 5 renamed it)",
    "no_cuda": "`use_cpu`",
    "evaluation_strategy": "`eval_strategy`",
    "max_prompt_length": "nothing: TRL 1.x no longer truncates prompts; filter long prompts out of the dataset",
    "overwrite_output_dir": "nothing: transformers 5 removed it; stapo-train resumes from the last checkpoint in "
    "`output_dir`, so use a fresh `output_dir` to start over",
    "logging_dir": "nothing: transformers 5 removed it; logs go under `output_dir`",
}


class RecipeParser(TrlParser):
    """[`~trl.TrlParser`] whose errors say what to do: an unknown recipe key gets its closest field names (or the
    field that replaced it), and a `num_generations` that does not divide the generation batch gets the valid values.

    An error about a value the recipe set (and the command line did not override) names the recipe key and the
    file, `recipe key s2t_entropy_quantile in recipes/x.yaml: ...`, whatever found it: argparse's conversion (a wrong
    type), the checks here (a recipe value argparse does not convert or check: a YAML number, list or boolean of the
    wrong type, a value outside the field's choices; ranges), or the config classes' `__post_init__` (ranges). A
    value from the command line keeps its `--flag` / `field=value` wording.
    """

    _recipe_path: str | None = None
    _recipe_keys: frozenset[str] = frozenset()  # every key of the recipe file (after the checkpointing rename)
    _cli_keys: frozenset[str] = frozenset()  # fields given on the command line (they win over the recipe)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # A value such as `-1e-4` is a number, not an option (argparse's own pattern misses the exponent, so
        # `--learning_rate -1e-4` read "expected one argument"). No field's flag looks like a number.
        self._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")

    def parse_args_and_config(self, args=None, *pargs, **kwargs):
        args = list(sys.argv[1:] if args is None else args)
        self._recipe_path, self._recipe_keys = None, frozenset()
        if "--config" in args and args.index("--config") + 1 < len(args):
            self._recipe_path = args[args.index("--config") + 1]
            with contextlib.suppress(OSError, yaml.YAMLError):  # TrlParser reports a broken file
                with open(self._recipe_path, encoding="utf-8") as f:
                    recipe = yaml.safe_load(f)
                if isinstance(recipe, dict):
                    self._recipe_keys = frozenset(self._checkpointing_key(str(key)) for key in recipe)
        self._cli_keys = frozenset(
            self._checkpointing_key(a[2:].split("=", 1)[0].replace("-", "_")) for a in args if a.startswith("--")
        )
        try:
            return super().parse_args_and_config(args, *pargs, **kwargs)
        except (ValueError, TypeError) as e:
            message = self._name_the_recipe_key(str(e))
            if message is None:
                raise
            raise ValueError(message) from e

    def _from_recipe(self, key: str) -> bool:
        """Whether the value of field `key` is the recipe's (set there and not overridden on the command line)."""
        return self._recipe_path is not None and key in self._recipe_keys and key not in self._cli_keys

    def _name_the_recipe_key(self, message: str) -> str | None:
        """`message` (an error about a field) with the recipe key and the file when the value came from the recipe,
        with its `--flag` when it came from the command line; `None` when neither applies (or when the message already
        names the file)."""
        match = re.match(r"^(\w+)=", message)
        if match and match.group(1) in self._cli_keys:  # the stapo_trl convention: `field=value ...`; a flag's value
            return f"--{match.group(1)}: {message}"
        if self._recipe_path is None or self._recipe_path in message:
            return None
        fix = "Fix the value in the recipe, or override it on the command line with --{key}."
        if match:
            key = match.group(1)
            if not self._from_recipe(key):
                return None
            return f"recipe key {key} in {self._recipe_path}: {message} " + fix.format(key=key)
        fields = {action.dest for action in self._actions}
        mentioned = [
            key
            for key in sorted(self._recipe_keys)
            if (key in fields or key == "env")
            and self._from_recipe(key)
            and re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", message)
        ]
        if not mentioned:
            return None
        return f"{message} (recipe key(s) {', '.join(mentioned)} in {self._recipe_path})"

    def _action(self, dest: str) -> argparse.Action | None:
        """The `--dest` option of a field (not its `--no_dest` complement)."""
        return self._option_string_actions.get(f"--{dest}")

    @staticmethod
    def _value_type(action: argparse.Action) -> type | None:
        """`int`, `float` or `bool` for a field of that type (argparse's converter, or TRL's wrappers of it: they keep
        its `__name__`), else `None`."""
        return {"int": int, "float": float, "string_to_bool": bool}.get(getattr(action.type, "__name__", None))

    @classmethod
    def _expects(cls, action: argparse.Action) -> str:
        """What a field takes, in words: its choices, or its type."""
        kind = cls._value_type(action)
        if action.choices:
            what = "one of " + ", ".join(repr(c) for c in action.choices)
        else:
            what = {int: "an integer", float: "a number", bool: "true or false"}.get(kind, "a string")
        return f"a list of {what.removeprefix('a ').removeprefix('an ')}s" if action.nargs in ("+", "*") else what

    def _check_recipe_values(self, namespace: argparse.Namespace) -> None:
        """The type and choices of every value the recipe set: argparse converts and checks only command-line values
        (a recipe string is converted, never checked against the choices; a YAML number, list or boolean reaches the
        config classes as it is).

        Raises:
            ValueError: `field=value is ...`, with what the field takes.
        """
        for key in sorted(self._recipe_keys):
            action = self._action(key)
            if action is None or not self._from_recipe(key) or not hasattr(namespace, key):
                continue
            value = getattr(namespace, key)
            if value is None:
                continue
            values = value if isinstance(value, list) and action.nargs in ("+", "*") else [value]
            for item in values:
                problem, kind = None, self._value_type(action)
                if isinstance(item, (list, dict)):
                    if kind is not None or action.choices:
                        problem = f"is a YAML {'list' if isinstance(item, list) else 'mapping'}"
                elif action.choices and item not in action.choices:
                    problem = "is not one of the choices"
                    if isinstance(item, bool):  # `s2t_mode: off` reads as False
                        problem += " (YAML reads an unquoted off/on/no/yes as false/true: quote the value)"
                elif kind is int and (isinstance(item, bool) or not isinstance(item, int)):
                    problem = "is not an integer"
                elif kind is float and (isinstance(item, bool) or not isinstance(item, (int, float))):
                    problem = "is not a number"
                elif kind is bool and not isinstance(item, bool):
                    problem = "is not true or false"
                if problem is not None:
                    raise ValueError(f"{key}={value!r} {problem}: {key} takes {self._expects(action)}.")

    def _checkpointing_key(self, key: str) -> str:
        """`activation_checkpointing` (transformers >= 5.24's name, used by the recipes) as `gradient_checkpointing`
        on a transformers that predates it (5.19, the vLLM environment), so the same recipe parses on the whole
        supported range."""
        if key == "activation_checkpointing" and not any(a.dest == key for a in self._actions):
            return "gradient_checkpointing"
        return key

    def set_defaults_with_config(self, **kwargs) -> list[str]:
        kwargs = {self._checkpointing_key(key): value for key, value in kwargs.items()}
        remaining = super().set_defaults_with_config(**kwargs)
        unknown = [item[2:] for item in remaining[::2]]  # TrlParser returns ["--key", "value", ...]
        if unknown:
            raise ValueError(self._unknown_keys_message(unknown, f"recipe {self._recipe_path}"))
        return remaining

    def _unknown_keys_message(self, keys: list[str], where: str) -> str:
        known = [action.dest for action in self._actions if action.dest != "help"]
        known += ["config", "dry-run", "num-processes"]  # read before this parser runs (TrlParser, main)
        lines = []
        for key in keys:
            if key.startswith("s2t_") and "s2t_prob_threshold" not in known:
                hint = (
                    "it is a STAPO field, and trainer='grpo' builds a plain GRPOTrainer without the S2T mask: remove "
                    "it, or use trainer: stapo (s2t_mode: off keeps the mask's statistics without silencing)"
                )
            elif key in RENAMED_KEYS:
                hint = f"use {RENAMED_KEYS[key]}"
            else:
                close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
                hint = f"did you mean {', '.join(close)}?" if close else "no similar field"
            lines.append(f"{key}: {hint}")
        body = "; ".join(lines)
        return (
            f"Unknown key(s) in {where}: {body}{'' if body.endswith('?') else '.'} Every key must be a field of "
            "STAPOScriptArguments, STAPOConfig (GRPOConfig + s2t_*) or ModelConfig: correct or remove it "
            "(`stapo-train --help` lists the fields)."
        )

    def parse_args_into_dataclasses(self, args=None, **kwargs):
        # Checked on the raw values, before the config dataclasses exist: TRL's own check (GRPOConfig.__post_init__)
        # says only "must be divisible".
        if args is not None:
            args = ["--" + self._checkpointing_key(a[2:]) if a.startswith("--") else a for a in args]
        namespace, extra = self.parse_known_args(args=args)
        flags = [item[2:] for item in extra if item.startswith("--")]
        if flags and not kwargs.get("return_remaining_strings"):
            raise ValueError(self._unknown_keys_message(flags, "the command line"))
        self._check_recipe_values(namespace)
        check_counts(namespace)
        check_generation_batch(namespace)
        for name in ("eval_num_problems", "eval_num_samples"):
            value = getattr(namespace, name, None)
            if value is not None and value < 1:
                raise ValueError(
                    f"{name}={value} must be >= 1 (or set eval_before_after: false to skip the evaluation)."
                )
        threads = getattr(namespace, "torch_num_threads", None)
        if threads is not None and threads < 1:
            raise ValueError(
                f"torch_num_threads={threads} must be >= 1 (the CPU demo uses 1), or unset for torch's default."
            )
        max_steps = getattr(namespace, "max_steps", None)
        if max_steps is not None and (max_steps == 0 or max_steps < -1):  # transformers reads <= 0 as "use epochs"
            raise ValueError(
                f"max_steps={max_steps} is not a number of optimizer steps: give a positive number, or -1 (the "
                "default) to train for num_train_epochs epochs."
            )
        return super().parse_args_into_dataclasses(args=args, **kwargs)

    def error(self, message):
        # argparse prints the whole usage (hundreds of GRPOConfig fields) before the message; one line instead.
        match = re.match(r"^argument (--[\w-]+)(?:/--[\w-]+)*: (.*)$", message)
        action = self._option_string_actions.get(match.group(1)) if match else None
        if action is None:
            raise InputError("stapo-train", f"{message}. See `stapo-train --help` for every field.")
        key, problem = action.dest, match.group(2).rstrip(".")
        takes = (
            ""
            if "choose from" in problem or "expected one of" in problem
            else f" ({key} takes {self._expects(action)})"
        )
        if self._from_recipe(key):  # argparse converts recipe strings too, and reports them as `--key`
            raise InputError(
                "stapo-train",
                f"recipe key {key} in {self._recipe_path}: {problem}{takes}. Fix the value in the recipe, or "
                f"override it on the command line with --{key}.",
            )
        raise InputError("stapo-train", f"--{key}: {problem}{takes}. See `stapo-train --help` for every field.")


def check_counts(namespace: argparse.Namespace) -> None:
    """Fail on counts and settings that upstream checks only once the model is built (or never): batch sizes and
    accumulation below 1, fewer than 2 generations per prompt, a negative learning rate, an unknown `report_to`.

    Raises:
        ValueError: `field=value ...`, with the allowed values and the paper's setting.
    """
    for name, what in (
        ("per_device_train_batch_size", "completions per process per micro-step; the CPU demo uses 16"),
        ("gradient_accumulation_steps", "micro-steps per optimizer update; the CPU demo uses 1"),
    ):
        value = getattr(namespace, name, None)
        if value is not None and value < 1:
            raise ValueError(f"{name}={value} must be >= 1 ({what}).")
    for name in ("steps_per_generation", "generation_batch_size"):
        value = getattr(namespace, name, None)
        if value is not None and value < 1:
            raise ValueError(f"{name}={value} must be >= 1, or unset (None) for TRL's default.")
    num_generations = getattr(namespace, "num_generations", None)
    if num_generations is not None and num_generations < 2:
        raise ValueError(
            f"num_generations={num_generations} must be >= 2: GRPO's advantage compares the completions of one prompt "
            "(the paper uses 8)."
        )
    learning_rate = getattr(namespace, "learning_rate", None)
    if learning_rate is not None and learning_rate < 0:
        raise ValueError(f"learning_rate={learning_rate} must be >= 0 (the paper uses 1e-6, the CPU demo 1e-4).")
    report_to = getattr(namespace, "report_to", None)
    if report_to is not None:
        from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

        allowed = ["none", "all", *INTEGRATION_TO_CALLBACK]
        unknown = [name for name in ([report_to] if isinstance(report_to, str) else report_to) if name not in allowed]
        if unknown:
            raise ValueError(f"report_to={report_to!r}: {', '.join(map(repr, unknown))} is not one of {allowed}.")


def check_generation_batch(namespace: argparse.Namespace) -> None:
    """Fail with the valid `num_generations` values when it does not divide the generation batch.

    The generation batch (completions generated at once) is `generation_batch_size` if set, else
    `per_device_train_batch_size x processes x steps_per_generation` (`steps_per_generation` defaults to
    `gradient_accumulation_steps`); it must hold whole groups of `num_generations` completions per prompt
    ([`~stapo_trl.cli.geometry.BatchGeometry`]).

    Raises:
        ValueError: naming the batch, its arithmetic and the valid `num_generations`.
    """
    num_generations = namespace.num_generations
    if num_generations is None or num_generations < 2:  # None: TRL's default; < 2: TRL's own message is clear
        return
    geometry = BatchGeometry(
        per_device_train_batch_size=namespace.per_device_train_batch_size,
        num_processes=int(os.environ.get("WORLD_SIZE", "1")),
        gradient_accumulation_steps=namespace.gradient_accumulation_steps,
        num_generations=num_generations,
        steps_per_generation=namespace.steps_per_generation,
        generation_batch_size=namespace.generation_batch_size,
    )
    if geometry.holds_whole_groups:
        return
    if namespace.generation_batch_size is not None:
        how = f"generation_batch_size = {geometry.generation_batch}"
    else:
        how = (
            f"per_device_train_batch_size {geometry.per_device_train_batch_size} x {geometry.num_processes} "
            f"process(es) x steps_per_generation {geometry.micro_steps_per_generation} = {geometry.generation_batch} "
            "completions"
        )
    raise ValueError(
        f"num_generations={num_generations} does not divide the generation batch ({how}): each prompt needs a "
        f"whole group of num_generations completions. Valid num_generations for this batch: "
        f"{geometry.valid_num_generations()}. Or change per_device_train_batch_size / steps_per_generation so that "
        "the generation batch is a multiple of num_generations."
    )
