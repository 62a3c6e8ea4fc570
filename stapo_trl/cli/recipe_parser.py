"""`RecipeParser`: TRL's `TrlParser` with errors that say what to do (the recipe key and file, the closest field
names, the valid values), and the checks of recipe values that argparse does not make."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import re
import sys
from collections.abc import Sequence

import yaml
from trl import TrlParser

from ..checks.training_values import check_training_values
from ..config import STAPOConfig
from .errors import InputError


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


class UnknownKeysError(ValueError):
    """Keys of the recipe, or flags of the command line, that are no field: the message names each with its closest
    fields; it is never attributed to a recipe key."""


class RecipeParser(TrlParser):
    """[`~trl.TrlParser`] whose errors say what to do: an unknown recipe key gets its closest field names (or the
    field that replaced it), and a `num_generations` that does not divide the generation batch gets the valid values.

    An error about a value the recipe set (and the command line did not override) names the recipe key and the
    file, `recipe key s2t_entropy_quantile in recipes/x.yaml: ...`, whatever found it: argparse's conversion (a wrong
    type), the checks here (a recipe value argparse does not convert or check: a YAML number, list or boolean of the
    wrong type, a value outside the field's choices), or the config classes' `__post_init__` (ranges, the counts and
    the generation batch of [`~stapo_trl.checks.training_values.check_training_values`], the same checks and messages
    as `STAPOConfig(...)` from Python). A value from the command line keeps its `field=value` wording behind its
    `--flag`. An error made by several fields (the generation batch) names the flags and the recipe keys that set
    them.
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
        except UnknownKeysError:
            raise  # names the flag or key itself; a recipe key it resembles is not its cause
        except (ValueError, TypeError) as e:
            message = self._name_the_recipe_key(str(e), getattr(e, "fields", None))
            if message is None:
                raise
            raise ValueError(message) from e

    def _from_recipe(self, key: str) -> bool:
        """Whether the value of field `key` is the recipe's (set there and not overridden on the command line)."""
        return self._recipe_path is not None and key in self._recipe_keys and key not in self._cli_keys

    def _name_the_recipe_key(self, message: str, fields: Sequence[str] | None = None) -> str | None:
        """`message` (an error about a field) with the recipe key and the file when the value came from the recipe,
        with its `--flag` when it came from the command line; `None` when neither applies (or when the message already
        names the file).

        Args:
            message (`str`): the error.
            fields (`Sequence[str]`, *optional*): the fields whose values make the error (a
                [`~stapo_trl.checks.training_values.TrainingValueError`]'s), the reported one first; `None`: the field
                of a message that starts with `field=`.
        """
        match = re.match(r"^(\w+)=", message)
        if fields is None and match:
            fields = (match.group(1),)
        if fields and len(fields) > 1:
            return self._name_the_causes(message, fields)
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

    def _name_the_causes(self, message: str, fields: Sequence[str]) -> str | None:
        """`message`, an error made by several fields' values together, behind the flags and recipe keys that set them
        (`--a and --b (with recipe key c in R): ...`); `None` when every value is a default."""
        flags = [f"--{field}" for field in fields if field in self._cli_keys]
        keys = [field for field in fields if self._from_recipe(field)]
        in_recipe = f"recipe key{'s' * (len(keys) > 1)} {', '.join(keys)} in {self._recipe_path}"
        if flags:
            named = " and ".join([", ".join(flags[:-1]), flags[-1]] if len(flags) > 1 else flags)
            return f"{named}{f' (with {in_recipe})' if keys else ''}: {message}"
        if keys:
            return f"{in_recipe}: {message} Fix the values in the recipe, or override them on the command line."
        return None

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
            raise UnknownKeysError(self._unknown_keys_message(unknown, f"recipe {self._recipe_path}"))
        return remaining

    def _unknown_keys_message(self, keys: list[str], where: str) -> str:
        """The one line for keys that are no field, each with its closest fields: for the command line (`where` is
        `"the command line"`), the unknown flag as typed, and whether a field it resembles is also set by the recipe
        (whose value the right flag would override)."""
        known = [action.dest for action in self._actions if action.dest != "help"]
        known += ["config", "dry-run", "num-processes"]  # read before this parser runs (TrlParser, main)
        on_command_line = where == "the command line"
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
                in_recipe = [field for field in close if self._from_recipe(field)] if on_command_line else []
                also = (
                    f" ({in_recipe[0]} is a key of the recipe {self._recipe_path} too: the flag --{in_recipe[0]} "
                    "overrides it)"
                    if in_recipe
                    else ""
                )
                hint = f"did you mean {', '.join(close)}{also}?" if close else "no similar field"
            lines.append(f"--{key}: {hint}" if on_command_line else f"{key}: {hint}")
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
            raise UnknownKeysError(self._unknown_keys_message(flags, "the command line"))
        self._check_recipe_values(namespace)
        if not any(isinstance(t, type) and issubclass(t, STAPOConfig) for t in self.dataclass_types):
            # A plain GRPOConfig (trainer: grpo) has TRL's checks only: STAPOConfig's own, on the raw values.
            check_training_values(namespace)
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
        return super().parse_args_into_dataclasses(args=args, **kwargs)

    def error(self, message):
        # argparse prints the whole usage (hundreds of GRPOConfig fields) before the message; one line instead.
        match = re.match(r"^argument (--[\w-]+)(?:/--[\w-]+)*: (.*)$", message)
        action = self._option_string_actions.get(match.group(1)) if match else None
        if action is None:
            raise InputError("stapo-train", f"{message}. See `stapo-train --help-fields` for every field.")
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
        raise InputError("stapo-train", f"--{key}: {problem}{takes}. See `stapo-train --help-fields` for every field.")
