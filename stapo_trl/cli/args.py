"""`stapo-train`'s arguments: a recipe as the defaults of TRL's [`~trl.TrlParser`], the command line winning."""

from __future__ import annotations

import difflib
import os
import re
import sys
import textwrap
from argparse import ArgumentDefaultsHelpFormatter as Fmt

import yaml
from trl import TrlParser

from ..integrations.process_group import import_group_capturing_modules
from .errors import EXIT_STATUS_HELP, print_line


DEMO_RECIPE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "templates", "demo_stapo.yaml")

USAGE = """
  stapo-train --config RECIPE.yaml [--FIELD VALUE ...]            train (the command line overrides the recipe)
  stapo-train --config RECIPE.yaml --dry-run [--num-processes N]  check a recipe and print its plan, build nothing
  accelerate launch --config_file ACCELERATE.yaml -m stapo_trl.cli.train --config RECIPE.yaml"""

SHORT_HELP = f"""usage:{USAGE}

Train with STAPO (or the GRPO baseline without the mask) from a YAML recipe: a file of `field: value` lines (recipes/
has the demo and the paper's runs). Every field can also be given as --FIELD VALUE (or --FIELD-NAME VALUE), which wins.

Common fields (`--help-fields` lists every field with its default and help, `--help-fields WORD` those with WORD):
  --model_name_or_path             a local folder, a Hub id, or builtin:tiny-math (offline)
  --dataset_name                   builtin:tiny-math, a Hub dataset, or a .json/.jsonl/.parquet/.csv file
  --prompt_column --solution_column  the problem and gold-answer columns of a file or Hub dataset
  --reward_funcs                   reward names (math_accuracy) or dotted import paths
  --trainer                        stapo (the S2T mask in the loss) or grpo (plain GRPOTrainer, no mask)
  --output_dir                     checkpoints, metrics.jsonl, figures, the model and its card
  --max_steps --learning_rate --seed  optimizer steps, step size, seed
  --per_device_train_batch_size    completions (not prompts) per process and micro-step
  --num_generations --max_completion_length  completions per prompt, and their length in tokens
  --use_cpu --bf16 --torch_num_threads  device, precision, CPU threads
  --s2t_prob_threshold --s2t_entropy_quantile  tau_p and q of the S2T mask (the paper: 0.002, 0.75)
  --s2t_mode                       low_entropy (STAPO), off, high_entropy, all_low_prob (ablations)
  --eval_before_after              held-out avg@k before and after training, into eval.json

options:
  -h, --help, --version       this help; the versions of stapo_trl, TRL, transformers and torch
  --help-fields [WORD]        every recipe field (or those whose name contains WORD)
  --config RECIPE.yaml        the recipe; the CPU demo's: {DEMO_RECIPE}
  --dry-run                   check the recipe and print its plan (`stapo-train --dry-run --help`)

{textwrap.fill(EXIT_STATUS_HELP, width=100)}"""

RENAMED_KEYS = {  # recipe keys of older TRL / transformers versions
    "torch_dtype": "`dtype` (transformers 5 renamed it)", "no_cuda": "`use_cpu`", "logging_dir": "nothing: "
    "transformers 5 removed it; logs go under `output_dir`", "evaluation_strategy": "`eval_strategy`",
    "max_prompt_length": "nothing: TRL 1.x no longer truncates prompts; filter long prompts out of the dataset",
    "overwrite_output_dir": "nothing: transformers 5 removed it; stapo-train resumes from the last checkpoint in "
    "`output_dir`, so use a fresh `output_dir` to start over",
}  # fmt: skip
GRPO_ONLY_HINT = ("STAPO field(s), and trainer='grpo' builds a plain GRPOTrainer without the S2T mask: remove them, "
                  "or use trainer: stapo (s2t_mode: off keeps the mask's statistics without silencing)")  # fmt: skip
KINDS = {"int": "an integer", "float": "a number", "string_to_bool": "true or false"}


class _RecipeLoader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        lines: dict = {}
        for key_node in (key for key, _ in node.value if key.tag != "tag:yaml.org,2002:merge"):  # not `<<: *base`
            key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
            if isinstance(key, (str, int, float, bool)) and key in lines:
                raise ValueError(f"key {key} is given twice (lines {lines[key]} and {line}): keep one of them")
            lines[key] = line
        return super().construct_mapping(node, deep=deep)


def load_recipe(path: str) -> dict:
    """The recipe `path` as a mapping; `OSError`, or `ValueError` naming the line (not UTF-8 or YAML, a key twice)."""
    if os.path.isdir(path):
        raise IsADirectoryError(f"Recipe {path!r} is a folder: give the path of a recipe YAML file in it.")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Recipe {path!r} does not exist.")
    with open(path, "rb") as f:
        data = f.read()
    try:
        recipe = yaml.load(data.decode("utf-8"), Loader=_RecipeLoader)  # noqa: S506 (a SafeLoader)
    except UnicodeDecodeError as e:
        line, column = data[: e.start].count(b"\n") + 1, e.start - data.rfind(b"\n", 0, e.start)
        raise ValueError(f"Recipe {path!r} is not UTF-8 text: byte 0x{data[e.start]:02x} at line {line}, column "
                         f"{column}. Save it as UTF-8 (an editor's 'encoding' setting).") from None  # fmt: skip
    except yaml.YAMLError as e:
        where = f" (line {m.line + 1}, column {m.column + 1})" if (m := getattr(e, "problem_mark", None)) else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"Recipe {path!r} is not valid YAML{where}: {problem}.") from None
    except ValueError as e:
        raise ValueError(f"Recipe {path!r}: {e}.") from None
    if not isinstance(recipe, dict):
        what = "empty" if recipe is None else f"a YAML {type(recipe).__name__}, not a mapping"
        raise ValueError(f"Recipe {path!r} is {what}: write one `field: value` per line (as {DEMO_RECIPE}).")
    return recipe


class RecipeParser(TrlParser):
    """[`~trl.TrlParser`] of a recipe and a command line: `STAPOConfig`, or for `grpo` GRPOConfig with ours."""

    def __init__(self, grpo: bool = False, recipe: dict | None = None, path: str | None = None, **kwargs):
        from trl import GRPOConfig, ModelConfig

        from ..trainer.config import STAPOConfig
        from .script_args import STAPOScriptArguments

        super().__init__((STAPOScriptArguments, GRPOConfig if grpo else STAPOConfig, ModelConfig), allow_abbrev=False,
                         **kwargs)  # fmt: skip
        self._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")  # `-1e-4`: a number
        if grpo:  # `grpo` differs from `stapo` by the mask alone
            ours, base = STAPOConfig.__dataclass_fields__, GRPOConfig.__dataclass_fields__
            self.set_defaults(**{k: f.default for k, f in ours.items() if k in base and f.default != base[k].default})
        self._old_checkpointing = "--activation_checkpointing" not in self._option_string_actions
        self.recipe = {self._renamed(str(key)): value for key, value in (recipe or {}).items()}
        self.path, self.flags = path, set()

    def _renamed(self, key: str) -> str:  # `gradient_checkpointing` before transformers 5.24
        return "gradient_checkpointing" if key == "activation_checkpointing" and self._old_checkpointing else key

    def parse(self, argv: list[str]) -> tuple:
        """The three arguments from the recipe (its `env:` set) and `argv`; a one-line `ValueError` names the field."""
        from ..trainer.config import STAPOConfig, check_training_values

        argv = ["--" + self._renamed(a[2:]) if a.startswith("--") else a for a in argv]
        self.flags = {self._renamed(a[2:].split("=")[0].replace("-", "_")) for a in argv if a.startswith("--")}
        env = self.recipe.pop("env", None) or {}
        if not isinstance(env, dict):
            raise ValueError(f"recipe key env in {self.path}: give a mapping of environment variables.")
        os.environ.update({str(key): str(value) for key, value in env.items()})
        if unknown := self.set_defaults_with_config(**self.recipe)[::2]:
            raise ValueError(self._unknown([key[2:] for key in unknown], f"recipe {self.path}"))
        namespace, extra = self.parse_known_args(argv)
        if unknown := [a[2:].split("=")[0] for a in extra if a.startswith("--")]:
            raise ValueError(self._unknown(unknown, "the command line"))
        try:
            for key, value in self.recipe.items():  # argparse checks no default
                action = self._option_string_actions.get(f"--{key}")
                if action is None or value is None or key in self.flags:
                    continue
                expects = self._expects(action)
                kind = {"true or false": bool, "an integer": int, "a number": (int, float)}.get(expects, object)
                for item in value if isinstance(value, list) and action.nargs in ("+", "*") else [value]:
                    fits = isinstance(item, str) or isinstance(item, kind) and (kind is bool or type(item) is not bool)
                    if not (fits if action.choices is None else item in action.choices):
                        quote = " (YAML reads an unquoted off/on/no/yes as false/true: quote it)"
                        quote *= action.choices is not None and isinstance(item, bool)
                        raise ValueError(f"{key}={value!r} is not {expects}{quote}.")
            if STAPOConfig not in self.dataclass_types:  # a plain GRPOConfig: STAPOConfig's checks
                check_training_values(namespace)
            return tuple(self.parse_args_into_dataclasses(argv))
        except (ValueError, TypeError) as e:
            raise ValueError(self._where(str(e), getattr(e, "fields", None))) from e

    def _where(self, message: str, fields: list[str] | None = None) -> str:
        """`message` behind the flags or recipe keys of `fields` (default: its leading `field=`, else those named)."""
        if not fields:
            match, known = re.match(r"(\w+)=", message), sorted({*self.recipe, *self.flags})
            fields = [match.group(1)] if match else [k for k in known if re.search(rf"\b{re.escape(k)}\b", message)]
        flags = [f"--{field}" for field in fields if field in self.flags]
        keys = [field for field in fields if field in self.recipe and field not in self.flags]
        in_recipe = f"recipe key{'s' * (len(keys) > 1)} {', '.join(keys)} in {self.path}"
        if flags:
            return f"{' and '.join(flags)}{f' (with {in_recipe})' if keys else ''}: {message}"
        one = f"the value in the recipe, or override it on the command line with --{keys[0]}" if keys else ""
        fix = one if len(keys) == 1 else "the values in the recipe, or override them on the command line"
        return f"{in_recipe}: {message} Fix {fix}." if keys else message

    def _expects(self, action) -> str:
        choices = action.choices and "one of " + ", ".join(map(repr, action.choices))
        return choices or KINDS.get(getattr(action.type, "__name__", None), "a string")

    def _unknown(self, keys: list[str], where: str) -> str:
        known = [a.dest for a in self._actions if a.dest != "help"] + ["config", "dry-run", "num-processes"]
        flag = "--" * (where == "the command line")
        stapo_only = [key for key in keys if key.startswith("s2t_") and "s2t_mode" not in known]
        hints = [f"{', '.join(flag + key for key in stapo_only)}: {GRPO_ONLY_HINT}"] if stapo_only else []
        for key in [key for key in keys if key not in stapo_only]:
            close = difflib.get_close_matches(key, known)
            also = [f for f in close if flag and f in self.recipe and f not in self.flags][:1]
            also = "".join(f" ({f} is a key of the recipe {self.path} too: the flag --{f} overrides it)" for f in also)
            hint = f"did you mean {', '.join(close)}{also}?" if close else "no similar field"
            hints.append(f"{flag}{key}: {f'use {RENAMED_KEYS[key]}' if key in RENAMED_KEYS else hint}")
        body = "; ".join(hints)
        fields = ("" if len(stapo_only) == len(keys) else " Every key must be a field of STAPOScriptArguments, "
                  "STAPOConfig (GRPOConfig + s2t_*) or ModelConfig: correct or remove it (`stapo-train --help-fields` "
                  "lists the fields).")  # fmt: skip
        return f"Unknown key(s) in {where}: {body}{'' if body.endswith('?') else '.'}{fields}"

    def error(self, message):  # one line naming the flag or recipe key, not argparse's usage of hundreds of fields
        match = re.match(r"argument (--[\w-]+)(?:/--[\w-]+)*: (.*)$", message)
        action = self._option_string_actions.get(match.group(1)) if match else None
        if action is None:
            raise ValueError(f"{message}. See `stapo-train --help-fields` for every field.")
        problem = match.group(2).rstrip(".")
        if "choose from" not in problem and "expected one of" not in problem:
            problem += f" ({action.dest} takes {self._expects(action)})"
        named = self._where(f"{problem}.", [action.dest])
        raise ValueError(named + " See `stapo-train --help-fields` for every field." * (action.dest in self.flags))


def recipe_parser(argv: list[str]) -> tuple[RecipeParser, list[str]]:
    """(the parser holding the recipe `--config` names, the rest of `argv`); the trainer picks the config class."""
    argv = list(argv)
    if not argv:
        raise ValueError(f"no recipe: give --config RECIPE.yaml (the CPU demo's: {DEMO_RECIPE}), or every field as "
                         "--FIELD VALUE. `stapo-train --help-fields` lists the fields.")  # fmt: skip
    path, recipe = None, {}
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 == len(argv):
            raise ValueError("--config needs the path of a recipe YAML file.")
        path, argv, recipe = argv[i + 1], argv[:i] + argv[i + 2 :], load_recipe(argv[i + 1])
    given = [a.split("=", 1)[1] for a in argv if a.startswith("--trainer=")]
    given += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--trainer"]
    grpo = (given[-1] if given else recipe.get("trainer", "stapo")) == "grpo"
    return RecipeParser(grpo, recipe, path, prog="stapo-train", usage=USAGE), argv


def parse_args(argv: list[str] | None = None) -> tuple:
    """`argv` as (`STAPOScriptArguments`, `STAPOConfig` or `GRPOConfig`, `ModelConfig`); a one-line `ValueError`."""
    parser, argv = recipe_parser(sys.argv[1:] if argv is None else argv)
    if any(a.split("=")[0] == "--hub_token" for a in argv) and os.environ.get("RANK", "0") == "0":
        print_line("stapo-train: warning: --hub_token on the command line is visible to every user of this machine "
                   "(ps, /proc): set HF_TOKEN or run `hf auth login` instead. The token is written into no file of "
                   "the run.")  # fmt: skip
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # before a config creates the process group
        import_group_capturing_modules()
    return parser.parse(argv)


def fields_help(word: str | None = None) -> str:
    """`stapo-train --help-fields [WORD]`: every field (or those containing `word`), its default and help."""
    parser = RecipeParser(prog="stapo-train", usage=USAGE, formatter_class=Fmt, epilog=EXIT_STATUS_HELP)
    if word:
        word = word.lower().lstrip("-")
        for group in parser._action_groups:
            group._group_actions = [a for a in group._group_actions if word in " ".join(a.option_strings).lower()]
        parser._action_groups = [group for group in parser._action_groups if group._group_actions]
        parser.usage = f"stapo-train --help-fields {word}"
    return parser.format_help()
