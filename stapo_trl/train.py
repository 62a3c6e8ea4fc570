r"""`stapo-train`: train with STAPO (or the GRPO baseline without the mask) from a YAML recipe.

    # The CPU demo (offline, ~2.5 min on 2 cores with the one-time model build): held-out avg@4 ~42 % -> ~66 %.
    stapo-train --config recipes/demo/stapo.yaml
    # Any recipe key can be overridden on the command line; the command line wins over the YAML.
    stapo-train --config recipes/demo/stapo.yaml --max_steps 50 --output_dir outputs/try
    # The same entry point under accelerate (DDP / DeepSpeed / FSDP; vLLM through the GRPOConfig fields):
    accelerate launch --config_file recipes/accelerate_configs/zero2.yaml -m stapo_trl.train --config RECIPE.yaml
    # Both arms of a comparison on the same seeds: one PNG with both runs' curves and a before/after table.
    stapo-train compare recipes/demo/grpo.yaml recipes/demo/stapo.yaml --seeds 0 1 2 [-- --max_steps 100]

A recipe is a YAML file whose keys are the fields of three argument groups, parsed by [`~trl.TrlParser`]:
[`STAPOScriptArguments`] (trainer, rewards, data, before/after evaluation), [`~stapo_trl.STAPOConfig`] (every
[`~trl.GRPOConfig`] field plus `s2t_*`) and [`~trl.ModelConfig`] (model path, dtype, PEFT). An unknown key is an
error (a typo would otherwise silently leave a default in place).

What a run writes to `output_dir`: checkpoints (`checkpoint-N/`), the final model and tokenizer, `README.md` (model
card), `metrics.jsonl` (every logging step: reward, entropy, `s2t/*`, loss, clip ratios, ...), `training_curves.png`,
`train_results.json`, and with `eval_before_after: true`, `eval.json` (held-out avg@k before and after training).
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

import argparse
import contextlib
import dataclasses
import difflib
import json
import logging
import math
import os
import sys
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from trl import ModelConfig, ScriptArguments, TrlParser

from .process_group import import_group_capturing_modules


import_group_capturing_modules()  # before parsing creates the process group (trainer: grpo too); see process_group.py
logger = logging.getLogger(__name__)

TRAINERS = ("stapo", "grpo")
EVAL_FILENAME = "eval.json"
CURVES_FILENAME = "training_curves.png"

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


@dataclass
class STAPOScriptArguments(ScriptArguments):
    """
    Script arguments of `stapo-train`: which trainer, which rewards, which data, and the before/after evaluation.

    The inherited `dataset_name`, `dataset_config`, `dataset_train_split` and `dataset_test_split` select the data;
    `dataset_streaming` is not supported. Everything about the optimisation is in [`~stapo_trl.STAPOConfig`].

    Args:
        trainer (`str`, *optional*, defaults to `"stapo"`):
            `"stapo"` ([`~stapo_trl.STAPOTrainer`]) or `"grpo"` (a plain [`~trl.GRPOTrainer`], the same objective
            without the S2T mask; `s2t_*` keys are then an error).
        reward_funcs (`list[str]`, *optional*, defaults to `["math_accuracy"]`):
            Reward functions: names of `stapo_trl.rewards.REWARDS` or dotted import paths (`my_pkg.rewards.fn`).
            The default is the paper's binary rule-based reward alone (last `\\boxed{}` verified against the gold
            answer, STAPO Sec. 4.1); the paper uses no format reward. Weights: `reward_weights`.
        prompt_column (`str`, *optional*, defaults to `"problem"`):
            Column holding the problem text (or a chat). Ignored for `builtin:` datasets.
        solution_column (`str`, *optional*, defaults to `"answer"`):
            Column holding the gold answer; dotted names reach into struct columns (`reward_model.ground_truth`).
            Ignored for `builtin:` datasets.
        instruction (`str`, *optional*):
            Text appended to every problem (training and evaluation). `None`: the paper's suffix asking for
            step-by-step reasoning and the final answer in `\\boxed{}` (`stapo_trl.data.INSTRUCTION`); `""`: none.
        strip_dapo_instruction (`bool`, *optional*, defaults to `False`):
            Remove DAPO-Math-17k's own "Answer: $Answer" instruction from every problem before appending
            `instruction` (`stapo_trl.data.remove_dapo_instruction`; a no-op on problems without it).
        max_prompt_tokens (`int`, *optional*):
            Drop the training prompts longer than this many tokens (chat template included); the paper caps prompts
            at 1,024. TRL 1.x no longer truncates prompts. `None`: no limit.
        max_train_samples (`int`, *optional*):
            Keep only the first N training problems (before `max_prompt_tokens` filtering).
        eval_before_after (`bool`, *optional*, defaults to `False`):
            Measure held-out avg@k on `dataset_test_split` before and after training (transformers `generate`,
            sampled) and write `eval.json`. For benchmark numbers use `stapo-eval`.
        eval_num_problems (`int`, *optional*, defaults to `200`):
            Number of held-out problems (the first N of the test split).
        eval_num_samples (`int`, *optional*, defaults to `4`):
            k: completions sampled per problem; avg@k is the mean accuracy over all of them.
        eval_temperature (`float`, *optional*, defaults to `1.0`):
            Sampling temperature of the evaluation (the paper's first decoding setting is 1.0 / top-p 1.0).
        eval_top_p (`float`, *optional*, defaults to `1.0`):
            Top-p of the evaluation sampling.
        eval_max_new_tokens (`int`, *optional*):
            Generation budget of the evaluation; `None` means `max_completion_length`.
        eval_batch_size (`int`, *optional*, defaults to `64`):
            Problems per `generate` call (each yields k completions).
        benchmark_eval (`str`, *optional*):
            A benchmark evaluated periodically during training by [`~stapo_trl.eval.BenchmarkEvalCallback`] (a
            `stapo_trl.benchmarks.BENCHMARKS` name: `aime24`, `math500`, ..., or `tiny-math`), logged as
            `eval/<benchmark>/avg@k` and `pass@k` into the log history and `metrics.jsonl`. Sampling as the
            before/after evaluation (`eval_temperature`, `eval_top_p`, `eval_max_new_tokens`). `None`: off. Not with
            DeepSpeed ZeRO-3 or FSDP (the callback generates on rank 0).
        benchmark_eval_data_dir (`str`, *optional*):
            Folder with local benchmark files (`None`: the Hub, or the built-in task).
        benchmark_eval_steps (`int`, *optional*):
            Evaluation period in optimizer steps; `None`: `eval_steps`, else `logging_steps`.
        benchmark_eval_samples (`int`, *optional*, defaults to `4`):
            k: samples per problem.
        benchmark_eval_limit (`int`, *optional*, defaults to `32`):
            Only the first N problems of the benchmark.
        torch_num_threads (`int`, *optional*):
            CPU threads of torch (`torch.set_num_threads`, also exported as `OMP_NUM_THREADS` to child processes);
            `None` keeps torch's default. The CPU demo uses 1: a tiny model's operations are too small to gain from
            threads, and when other processes share the cores, OpenMP threads waiting on each other make 2 threads
            up to 20x slower than 1.
    """

    trainer: Literal["stapo", "grpo"] = field(
        default="stapo",
        metadata={
            "help": "'stapo' (STAPOTrainer, S2T mask in the loss) or 'grpo' (plain GRPOTrainer, the same objective "
            "defaults without the mask; s2t_* keys are then an error).",
            "choices": list(TRAINERS),
        },
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: ["math_accuracy"],
        metadata={
            "help": "Reward functions: names of stapo_trl.rewards.REWARDS or dotted import paths. Default: the "
            "paper's binary math-accuracy reward alone (no format reward). Weights: reward_weights."
        },
    )
    prompt_column: str = field(
        default="problem",
        metadata={"help": "Column with the problem text (or a chat). Ignored for builtin: datasets."},
    )
    solution_column: str = field(
        default="answer",
        metadata={
            "help": "Column with the gold answer (dotted names reach into struct columns, e.g. "
            "'reward_model.ground_truth'). Ignored for builtin: datasets."
        },
    )
    instruction: str | None = field(
        default=None,
        metadata={
            "help": "Text appended to every problem. Default (None): the paper's step-by-step / \\boxed{} suffix "
            "(stapo_trl.data.INSTRUCTION). Empty string: no instruction."
        },
    )
    strip_dapo_instruction: bool = field(
        default=False,
        metadata={
            "help": "Remove DAPO-Math-17k's own 'Answer: $Answer' instruction from every problem before appending "
            "`instruction` (no-op on problems without it)."
        },
    )
    max_prompt_tokens: int | None = field(
        default=None,
        metadata={
            "help": "Drop training prompts longer than this many tokens (chat template included; paper: 1024). TRL "
            "no longer truncates prompts. None: no limit."
        },
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Keep only the first N training problems (None: all)."}
    )
    eval_before_after: bool = field(
        default=False,
        metadata={
            "help": "Measure held-out avg@k on dataset_test_split before and after training (sampled with "
            "transformers generate) and write eval.json."
        },
    )
    eval_num_problems: int = field(
        default=200, metadata={"help": "Held-out problems evaluated (first N of the split)."}
    )
    eval_num_samples: int = field(default=4, metadata={"help": "k: completions sampled per held-out problem (avg@k)."})
    eval_temperature: float = field(default=1.0, metadata={"help": "Evaluation sampling temperature (paper: 1.0)."})
    eval_top_p: float = field(default=1.0, metadata={"help": "Evaluation top-p (paper: 1.0)."})
    eval_max_new_tokens: int | None = field(
        default=None, metadata={"help": "Evaluation generation budget (None: max_completion_length)."}
    )
    eval_batch_size: int = field(default=64, metadata={"help": "Held-out problems per generate call."})
    benchmark_eval: str | None = field(
        default=None,
        metadata={
            "help": "Benchmark evaluated periodically during training (a stapo_trl.benchmarks.BENCHMARKS name, e.g. "
            "aime24, math500, tiny-math), logged as eval/<benchmark>/avg@k. None: off. Not with ZeRO-3 / FSDP."
        },
    )
    benchmark_eval_data_dir: str | None = field(
        default=None, metadata={"help": "Folder with local benchmark files (None: the Hub or the built-in task)."}
    )
    benchmark_eval_steps: int | None = field(
        default=None,
        metadata={"help": "Benchmark evaluation period in optimizer steps (None: eval_steps, else logging_steps)."},
    )
    benchmark_eval_samples: int = field(default=4, metadata={"help": "k: benchmark samples per problem."})
    benchmark_eval_limit: int | None = field(
        default=32, metadata={"help": "Only the first N benchmark problems (None: all)."}
    )
    torch_num_threads: int | None = field(
        default=None,
        metadata={
            "help": "CPU threads of torch (torch.set_num_threads; also OMP_NUM_THREADS for child processes). None: "
            "torch's default. The CPU demo uses 1 (tiny ops gain nothing from threads; shared cores thrash)."
        },
    )


# ---------------------------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------------------------


class RecipeParser(TrlParser):
    """[`~trl.TrlParser`] whose errors say what to do: an unknown recipe key gets its closest field names (or the
    field that replaced it), and a `num_generations` that does not divide the generation batch gets the valid values.
    """

    def set_defaults_with_config(self, **kwargs) -> list[str]:
        remaining = super().set_defaults_with_config(**kwargs)
        unknown = [item[2:] for item in remaining[::2]]  # TrlParser returns ["--key", "value", ...]
        if unknown:
            raise ValueError(self._unknown_keys_message(unknown, "the recipe"))
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
            lines.append(f"  {key}: {hint}")
        return (
            f"Unknown key(s) in {where}:\n"
            + "\n".join(lines)
            + "\nEvery key must be a field of STAPOScriptArguments, "
            "STAPOConfig (GRPOConfig + s2t_*) or ModelConfig; see `stapo-train --help`."
        )

    def parse_args_into_dataclasses(self, args=None, **kwargs):
        # Checked on the raw values, before the config dataclasses exist: TRL's own check (GRPOConfig.__post_init__)
        # says only "must be divisible".
        namespace, extra = self.parse_known_args(args=args)
        flags = [item[2:] for item in extra if item.startswith("--")]
        if flags and not kwargs.get("return_remaining_strings"):
            raise ValueError(self._unknown_keys_message(flags, "the command line"))
        check_generation_batch(namespace)
        if getattr(namespace, "max_steps", None) == 0:  # transformers would run one step and report max_steps 0
            raise ValueError(
                "max_steps=0 trains nothing: give a positive number of optimizer steps, or -1 (the default) to train "
                "for num_train_epochs epochs."
            )
        return super().parse_args_into_dataclasses(args=args, **kwargs)

    def error(self, message):
        # argparse prints the whole usage (hundreds of GRPOConfig fields) before the message; print only the message.
        self.exit(2, f"stapo-train: error: {message}\nSee `stapo-train --help` for every field.\n")


USAGE = """
  stapo-train --config RECIPE.yaml [--FIELD VALUE ...]         train (the command line overrides the recipe)
  stapo-train --config RECIPE.yaml --dry-run [--num-processes N]  check a recipe and print its plan, build nothing
  stapo-train compare RECIPE_A.yaml RECIPE_B.yaml [--seeds S ...] [-- --FIELD VALUE ...]
  accelerate launch --config_file ACCELERATE.yaml -m stapo_trl.train --config RECIPE.yaml"""

HELP_FIELDS_INTRO = (
    "--config RECIPE.yaml: a YAML file whose keys are the fields below (recipes/ has the demo and the paper's runs). "
    "Every field can also be given as --FIELD VALUE. `stapo-train --dry-run --help` and `stapo-train compare --help` "
    "describe the other two commands."
)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Field defaults in the help, and the description's examples kept as written."""


def check_generation_batch(namespace: argparse.Namespace) -> None:
    """Fail with the valid `num_generations` values when it does not divide the generation batch.

    The generation batch (completions generated at once) is `generation_batch_size` if set, else
    `per_device_train_batch_size x processes x steps_per_generation` (`steps_per_generation` defaults to
    `gradient_accumulation_steps`); it must hold whole groups of `num_generations` completions per prompt.
    """
    num_generations = namespace.num_generations
    if num_generations is None or num_generations < 2:  # None: TRL's default; < 2: TRL's own message is clear
        return
    num_processes = int(os.environ.get("WORLD_SIZE", "1"))
    if namespace.generation_batch_size is not None:
        generation_batch = namespace.generation_batch_size
        how = f"generation_batch_size = {generation_batch}"
    else:
        steps = namespace.steps_per_generation or namespace.gradient_accumulation_steps
        generation_batch = namespace.per_device_train_batch_size * num_processes * steps
        how = (
            f"per_device_train_batch_size {namespace.per_device_train_batch_size} x {num_processes} process(es) x "
            f"steps_per_generation {steps} = {generation_batch} completions"
        )
    if generation_batch % num_generations == 0:
        return
    valid = [d for d in range(2, generation_batch + 1) if generation_batch % d == 0]
    raise ValueError(
        f"num_generations={num_generations} does not divide the generation batch ({how}): each prompt needs a "
        f"whole group of num_generations completions. Valid num_generations for this batch: {valid}. Or change "
        "per_device_train_batch_size / steps_per_generation so that the generation batch is a multiple of "
        "num_generations."
    )


def _stapo_objective_defaults() -> dict[str, Any]:
    """The GRPOConfig fields whose default STAPOConfig changes (the paper's objective), with STAPOConfig's values."""
    from trl import GRPOConfig

    from .config import STAPOConfig

    grpo_fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    return {
        f.name: f.default
        for f in dataclasses.fields(STAPOConfig)
        if f.name in grpo_fields and f.default is not dataclasses.MISSING and f.default != grpo_fields[f.name].default
    }


def make_parser(subparsers: argparse._SubParsersAction | None = None, *, trainer: str = "stapo") -> TrlParser:
    """The `stapo-train` parser: (STAPOScriptArguments, STAPOConfig or GRPOConfig, ModelConfig).

    Args:
        subparsers (`argparse._SubParsersAction`, *optional*):
            Register as the `stapo` sub-command of a parent CLI instead of building a standalone parser.
        trainer (`str`, *optional*, defaults to `"stapo"`):
            `"stapo"` parses into [`~stapo_trl.STAPOConfig`]; `"grpo"` into [`~trl.GRPOConfig`] with STAPOConfig's
            objective defaults and no `s2t_*` fields.
    """
    if trainer not in TRAINERS:
        raise ValueError(f"trainer={trainer!r} is not one of {list(TRAINERS)}.")
    if trainer == "stapo":
        from .config import STAPOConfig as config_class
    else:
        from trl import GRPOConfig as config_class
    dataclass_types = (STAPOScriptArguments, config_class, ModelConfig)
    if subparsers is not None:
        parser = subparsers.add_parser("stapo", help="Train with STAPO from a recipe", dataclass_types=dataclass_types)
    else:
        parser = RecipeParser(
            dataclass_types,
            prog="stapo-train",
            usage=USAGE,
            description=__doc__.split("\n\n")[0] + "\n\n" + textwrap.fill(HELP_FIELDS_INTRO, width=100),
            formatter_class=_HelpFormatter,
        )
    if trainer == "grpo":
        parser.set_defaults(**_stapo_objective_defaults())
    return parser


def _peek_trainer(argv: Sequence[str]) -> str:
    """`trainer` as the command line or else the recipe sets it (needed to pick the config class before parsing)."""
    import yaml

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    pre.add_argument("--trainer")
    known, _ = pre.parse_known_args(list(argv))
    if known.trainer is not None:
        return known.trainer
    if known.config is not None and os.path.isfile(known.config):
        with open(known.config) as f:
            try:
                recipe = yaml.safe_load(f)
            except yaml.YAMLError as e:
                mark = getattr(e, "problem_mark", None)
                where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
                problem = getattr(e, "problem", None) or str(e).splitlines()[0]
                raise ValueError(f"Recipe {known.config!r} is not valid YAML{where}: {problem}.") from None
        if isinstance(recipe, dict) and recipe.get("trainer") is not None:
            return str(recipe["trainer"])
    return "stapo"


def parse_args(argv: Sequence[str] | None = None) -> tuple[STAPOScriptArguments, Any, ModelConfig]:
    """Parse `--config RECIPE.yaml` and command-line overrides into (script_args, training_args, model_args).

    `training_args` is an [`~stapo_trl.STAPOConfig`] for `trainer: stapo` and a [`~trl.GRPOConfig`] for
    `trainer: grpo`.

    Raises:
        ValueError: On a recipe that is not valid YAML (with the line), an unknown recipe key (with the closest field
            names), an `s2t_*` key with `trainer: grpo`,
            a `num_generations` that does not divide the generation batch (with the valid values), and every
            check of the config classes' `__post_init__`.
        FileNotFoundError: If the recipe file does not exist.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        raise ValueError(
            "no recipe: give --config RECIPE.yaml (the CPU demo: recipes/demo/stapo.yaml), or every field as "
            "--FIELD VALUE. `stapo-train --help` lists the fields."
        )
    if "--config" in argv:
        if argv.index("--config") + 1 == len(argv):
            raise ValueError("--config needs the path of a recipe YAML file.")
        config_path = argv[argv.index("--config") + 1]
        if not os.path.isfile(config_path):
            raise FileNotFoundError(f"Recipe {config_path!r} does not exist.")
    trainer = _peek_trainer(argv)
    if trainer not in TRAINERS:
        raise ValueError(f"trainer={trainer!r} is not one of {list(TRAINERS)}.")
    parser = make_parser(trainer=trainer)
    if trainer == "grpo":
        s2t_flags = [a.split("=")[0][2:] for a in argv if a.startswith("--s2t_")]
        if s2t_flags:
            raise ValueError(parser._unknown_keys_message(s2t_flags, "the command line"))
    return parser.parse_args_and_config(argv)


# ---------------------------------------------------------------------------------------------------------------
# Held-out evaluation (before / after training)
# ---------------------------------------------------------------------------------------------------------------


def evaluate_avg_at_k(
    model,
    tokenizer,
    prompts: Sequence[list[dict[str, str]]],
    solutions: Sequence[str],
    *,
    k: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    batch_size: int = 64,
    seed: int = 0,
    accelerator=None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> dict[str, float]:
    """Held-out avg@k and pass@k of a model, sampling `k` completions per problem with transformers `generate`.

    Problems are split across processes (every process must call this); the counts are gathered, so every process
    returns the same numbers. Sampling uses its own seeded RNG stream (`seed` + process index), so evaluating does
    not change the training's random numbers. Completions are graded with [`~stapo_trl.grading.is_correct`] (last
    `\\boxed{}` against the gold answer), the same grader as the training reward.

    Args:
        model ([`~transformers.PreTrainedModel`]): An unwrapped model (see `trl.models.utils.unwrap_model_for_generation`).
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): With a chat template and a pad token.
        prompts (`Sequence[list[dict]]`): Conversational prompts.
        solutions (`Sequence[str]`): Gold answers, one per prompt.
        k (`int`): Completions per problem.
        temperature (`float`), top_p (`float`), max_new_tokens (`int`): Sampling settings (top-k is off).
        batch_size (`int`, *optional*, defaults to `64`): Problems per `generate` call.
        seed (`int`, *optional*, defaults to `0`): Seed of the sampling.
        accelerator ([`~accelerate.Accelerator`], *optional*): To split the problems across processes.
        chat_template_kwargs (`dict`, *optional*): Extra `apply_chat_template` arguments (as in training).

    Returns:
        `dict[str, float]`: `avg@k` (mean accuracy over all completions, in [0, 1]), `pass@k` (fraction of problems
        with at least one correct completion) and `num_problems`.
    """
    import torch

    from .grading import is_correct

    indices = list(range(len(prompts)))
    process_index = 0
    if accelerator is not None and accelerator.num_processes > 1:
        process_index = accelerator.process_index
        # Padded (the last problem repeated) so that every process makes the same number of `generate` calls: a
        # sharded model (FSDP) communicates in every forward. Duplicates are dropped after the gather.
        with accelerator.split_between_processes(indices, apply_padding=True) as local_indices:
            indices = list(local_indices)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    num_correct: list[tuple[int, int]] = []  # (problem index, correct completions out of k)
    fork_devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=fork_devices), torch.no_grad():
        torch.manual_seed(seed + process_index)
        for start in range(0, len(indices), batch_size):
            chunk = indices[start : start + batch_size]
            texts = [
                tokenizer.apply_chat_template(
                    prompts[i], tokenize=False, add_generation_prompt=True, **(chat_template_kwargs or {})
                )
                for i in chunk
            ]
            batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
            batch = batch.to(device)
            output = model.generate(
                **batch,
                do_sample=True,
                temperature=temperature,
                top_p=top_p,
                top_k=0,
                max_new_tokens=max_new_tokens,
                num_return_sequences=k,
                pad_token_id=tokenizer.pad_token_id,
            )  # (len(chunk) * k, prompt_len + new_len), the k samples of a problem are consecutive
            completions = tokenizer.batch_decode(output[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
            for j, i in enumerate(chunk):
                num_correct.append((i, sum(is_correct(c, solutions[i]) for c in completions[j * k : (j + 1) * k])))
    model.train(was_training)
    if accelerator is not None and accelerator.num_processes > 1:
        from accelerate.utils import gather_object

        num_correct = gather_object(num_correct)
    correct_by_problem = dict(num_correct)  # drops the padding duplicates
    num_problems = len(prompts)
    return {
        f"avg@{k}": sum(correct_by_problem.values()) / (k * num_problems) if num_problems else float("nan"),
        f"pass@{k}": sum(c > 0 for c in correct_by_problem.values()) / num_problems if num_problems else float("nan"),
        "num_problems": num_problems,
    }


def _evaluate_trainer_model(trainer, script_args, eval_dataset, max_new_tokens: int) -> dict[str, float]:
    from trl.models.utils import unwrap_model_for_generation

    with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model:
        return evaluate_avg_at_k(
            model,
            trainer.processing_class,
            eval_dataset["prompt"],
            eval_dataset["solution"],
            k=script_args.eval_num_samples,
            temperature=script_args.eval_temperature,
            top_p=script_args.eval_top_p,
            max_new_tokens=max_new_tokens,
            batch_size=script_args.eval_batch_size,
            seed=trainer.args.seed,
            accelerator=trainer.accelerator,
            chat_template_kwargs=trainer.args.chat_template_kwargs,
        )


# ---------------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class PreparedRun:
    """Everything `train` needs that can be checked without building a model (see [`prepare`])."""

    reward_funcs: list
    model_path: str
    train_dataset: Any
    test_dataset: Any | None
    eval_dataset: Any | None  # the before/after evaluation problems (first eval_num_problems of the test split)
    benchmark_callback: Any | None  # a stapo_trl.eval.BenchmarkEvalCallback, when `benchmark_eval` is set
    seconds: float = 0.0  # wall time of `prepare` (a first `builtin:` model build included)


def _is_builtin_or_local(name: str | None) -> bool:
    return bool(name) and (name.startswith("builtin:") or os.path.exists(name))


def prepare(script_args: STAPOScriptArguments, training_args, model_args: ModelConfig) -> PreparedRun:
    """Validate the run and load what is cheap to load, before any model is built.

    In order: the reward names, the model argument (checked, not loaded), the dataset (train split, and the test
    split when it is needed: before/after evaluation or `eval_strategy`), its columns, the in-training benchmark name,
    the model path (a `builtin:` model is built into its cache here on first use), then the `max_prompt_tokens`
    filter (with the model's tokenizer).
    Every failure is one exception with one message.

    Raises:
        ValueError: Unknown reward name, no `dataset_name`, `dataset_streaming`, missing column, unknown `builtin:`.
        FileNotFoundError: A model or dataset path that does not exist.
    """
    from .data import INSTRUCTION, load_prompt_dataset
    from .rewards import get_reward_funcs

    start = time.perf_counter()
    reward_funcs = get_reward_funcs(script_args.reward_funcs)

    if not model_args.model_name_or_path:
        raise ValueError("model_name_or_path is not set: give a Hub id, a local model directory or builtin:tiny-math.")
    from .builtin import check_model_name_or_path, resolve_model_path

    check_model_name_or_path(model_args.model_name_or_path)  # a wrong path fails here, before any data is loaded
    if script_args.dataset_name is None:
        raise ValueError(
            "dataset_name is not set: give builtin:tiny-math, a local .json/.jsonl/.parquet file or a Hub dataset id."
        )
    if script_args.dataset_streaming:
        raise ValueError("dataset_streaming=True is not supported by stapo-train: set it to false.")
    instruction = INSTRUCTION if script_args.instruction is None else script_args.instruction
    load_kwargs = {
        "dataset_config": script_args.dataset_config,
        "prompt_column": script_args.prompt_column,
        "solution_column": script_args.solution_column,
        "instruction": instruction,
        "strip_dapo_instruction": script_args.strip_dapo_instruction,
    }
    train_dataset = load_prompt_dataset(
        script_args.dataset_name,
        split=script_args.dataset_train_split,
        limit=script_args.max_train_samples,
        **load_kwargs,
    )
    test_dataset = eval_dataset = None
    if script_args.eval_before_after or training_args.eval_strategy != "no":
        test_dataset = load_prompt_dataset(
            script_args.dataset_name, split=script_args.dataset_test_split, **load_kwargs
        )
        if script_args.eval_before_after:
            eval_dataset = test_dataset.select(range(min(script_args.eval_num_problems, len(test_dataset))))

    benchmark_callback = None
    if script_args.benchmark_eval is not None:
        from .eval import BenchmarkEvalCallback

        benchmark_callback = BenchmarkEvalCallback(  # checks the benchmark name; the problems load at the first eval
            script_args.benchmark_eval,
            data_dir=script_args.benchmark_eval_data_dir,
            samples=script_args.benchmark_eval_samples,
            every_n_steps=script_args.benchmark_eval_steps,
            limit=script_args.benchmark_eval_limit,
            max_new_tokens=script_args.eval_max_new_tokens or training_args.max_completion_length,
            temperature=script_args.eval_temperature,
            top_p=script_args.eval_top_p,
            batch_size=script_args.eval_batch_size,
            seed=training_args.seed,
        )

    # Last: a `builtin:` model is built (about 30 s, once) when it is not cached yet.
    model_path = resolve_model_path(model_args.model_name_or_path)
    # Issue 11: prompts longer than max_prompt_tokens or than the model's positions minus max_completion_length are
    # dropped with one warning line (the rule stapo-eval applies too: stapo_trl.prompt_length).
    from transformers import AutoConfig

    from .prompt_length import model_max_positions, prompt_token_budget, report_dropped

    max_positions = model_max_positions(
        AutoConfig.from_pretrained(
            model_path, revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code
        )
    )
    budget = prompt_token_budget(max_positions, training_args.max_completion_length, script_args.max_prompt_tokens)
    if budget is not None:
        from transformers import AutoTokenizer

        from .data import filter_long_prompts

        tokenizer = AutoTokenizer.from_pretrained(
            model_path, revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code
        )
        total = len(train_dataset)
        train_dataset = filter_long_prompts(train_dataset, tokenizer, budget, training_args.chat_template_kwargs)
        report_dropped(
            total,
            len(train_dataset),
            budget,
            what="training prompts",
            max_positions=max_positions,
            max_new_tokens=training_args.max_completion_length,
        )
    return PreparedRun(
        reward_funcs,
        model_path,
        train_dataset,
        test_dataset,
        eval_dataset,
        benchmark_callback,
        time.perf_counter() - start,
    )


def _checkpoint_step(checkpoint: str) -> int | None:
    """The `global_step` recorded in a checkpoint's `trainer_state.json`, or `None` if it cannot be read."""
    try:
        with open(os.path.join(checkpoint, "trainer_state.json"), encoding="utf-8") as f:
            return int(json.load(f)["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _summarize_s2t(rows: list[dict[str, Any]]) -> dict[str, float]:
    ratios = [r["s2t/silenced_ratio"] for r in rows if r.get("s2t/silenced_ratio") is not None]
    if not ratios:
        return {}
    return {
        "mean_silenced_ratio": sum(ratios) / len(ratios),
        "fraction_of_logging_steps_with_silencing": sum(r > 0 for r in ratios) / len(ratios),
        "num_silenced": sum(r.get("s2t/num_silenced") or 0 for r in rows),
    }


def train(
    script_args: STAPOScriptArguments,
    training_args,
    model_args: ModelConfig,
    prepared: PreparedRun | None = None,
    *,
    end_training: bool = True,
) -> dict[str, Any]:
    """Run one training from parsed arguments (what `stapo-train` does after parsing).

    Args:
        script_args, training_args, model_args: what [`parse_args`] returns.
        prepared ([`PreparedRun`], *optional*): what [`prepare`] returns; `None` calls it here.
        end_training (`bool`, *optional*, defaults to `True`): finish the trackers and destroy the process group at
            the end (`Trainer.end`); `False` when more trainings follow in this process (`stapo-train compare`).

    Returns:
        `dict[str, Any]`: `output_dir`, `global_step`, `eval` (the content of `eval.json`, or `None`) and `s2t`
        (mean silenced ratio and friends over the logging steps; empty for `trainer: grpo`).
    """
    with torch_threads(script_args.torch_num_threads):
        return _train(script_args, training_args, model_args, prepared, end_training)


@contextlib.contextmanager
def torch_threads(num_threads: int | None):
    """Run the block with `torch.set_num_threads(num_threads)` and `OMP_NUM_THREADS` set (a `builtin:` model is
    built in a child process), restoring both after, for in-process callers; `None` changes nothing."""
    if num_threads is None:
        yield
        return
    import torch

    previous = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(num_threads)
    os.environ["OMP_NUM_THREADS"] = str(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous[0])
        if previous[1] is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = previous[1]


def _train(script_args, training_args, model_args, prepared: PreparedRun | None, end_training: bool) -> dict[str, Any]:
    import datasets
    import transformers
    from transformers import set_seed
    from transformers.trainer_callback import TrainerState
    from transformers.trainer_utils import get_last_checkpoint
    from trl import GRPOTrainer, get_peft_config, get_quantization_config

    from .diagnostic_plots import plot_diagnostics
    from .metrics_log import MetricsLogCallback, read_metrics
    from .plots import plot_training_curves

    ###############
    # Setup logging
    ###############
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.enable_default_handler()
    transformers.utils.logging.enable_explicit_format()

    # Set seed for reproducibility
    set_seed(training_args.seed)

    logger.info(f"Script parameters {script_args}")
    logger.info(f"Training parameters {training_args}")
    logger.info(f"Model parameters {model_args}")

    ###########################################################
    # Validate and load data, rewards, model path (no model yet)
    ###########################################################
    run = prepared if prepared is not None else prepare(script_args, training_args, model_args)
    timings: dict[str, float] = {"prepare": run.seconds}

    ############################
    # Resume from last checkpoint
    ############################
    last_checkpoint = None
    if os.path.isdir(training_args.output_dir):
        last_checkpoint = get_last_checkpoint(training_args.output_dir)
    checkpoint = training_args.resume_from_checkpoint or last_checkpoint
    if last_checkpoint is not None and training_args.resume_from_checkpoint is None:
        logger.warning(f"Checkpoint found in {training_args.output_dir}: resuming training from {last_checkpoint}.")
    # A checkpoint already at max_steps: `Trainer.train` would run one step past it (transformers 5.24), so training
    # is skipped and the checkpoint is what gets saved and evaluated (this also finishes a run that stopped after its
    # last checkpoint but before saving the final model).
    already_trained = None
    if checkpoint is not None and training_args.max_steps > 0:
        done = _checkpoint_step(checkpoint)
        if done is not None and done >= training_args.max_steps:
            already_trained = checkpoint
            logger.warning(
                f"{checkpoint} is at step {done} >= max_steps={training_args.max_steps}: training is already complete, "
                "nothing is trained. The checkpoint is saved as the final model (and evaluated). To train anew use "
                "another output_dir; to continue, raise max_steps."
            )

    ###############################
    # Model and trainer construction
    ###############################
    model_init_kwargs = {
        "revision": model_args.model_revision,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
    }
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = model_init_kwargs

    if script_args.trainer == "stapo":
        from .trainer import STAPOTrainer as trainer_class
    else:
        trainer_class = GRPOTrainer
    trainer = trainer_class(
        model=run.model_path,
        reward_funcs=run.reward_funcs,
        args=training_args,
        train_dataset=run.train_dataset,
        eval_dataset=run.test_dataset if training_args.eval_strategy != "no" else None,
        callbacks=[MetricsLogCallback()],
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
    )
    if script_args.trainer == "stapo":
        from .diagnostics import SpuriousTokenLogger

        trainer.add_callback(SpuriousTokenLogger(trainer))  # spurious_tokens.jsonl (+ a wandb/trackio table)
    if run.benchmark_callback is not None:
        run.benchmark_callback.attach(trainer)  # registers it and logs eval/<benchmark>/* through the trainer
    is_main = trainer.accelerator.is_main_process
    output_dir = training_args.output_dir
    eval_max_new_tokens = script_args.eval_max_new_tokens or training_args.max_completion_length

    ##########################
    # Evaluate before training
    ##########################
    eval_record = None
    if script_args.eval_before_after:
        trainer.accelerator.print(f"Evaluating the initial model on {len(run.eval_dataset)} held-out problems ...")
        start = time.perf_counter()
        before = _evaluate_trainer_model(trainer, script_args, run.eval_dataset, eval_max_new_tokens)
        timings["eval_before"] = time.perf_counter() - start

    ###############
    # Training loop
    ###############
    if already_trained is None:
        trainer.accelerator.print(f"Training with {trainer_class.__name__} ...")
        start = time.perf_counter()
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        timings["train"] = time.perf_counter() - start
        # `None`: a metric with no defined value (TRL's mean of all-NaN values) since the last logging step.
        metrics = {key: value for key, value in train_result.metrics.items() if value is not None}
        metrics["train_samples"] = len(run.train_dataset)
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
    else:
        trainer._load_from_checkpoint(already_trained)  # weights (or adapter) only; no optimizer step
        trainer.state = TrainerState.load_from_json(os.path.join(already_trained, "trainer_state.json"))
    trainer.save_state()

    ##################################
    # Save model and create model card
    ##################################
    trainer.save_model(output_dir)
    trainer.accelerator.print(f"Model and tokenizer saved to {output_dir}.")
    if is_main:
        card_dataset = None if _is_builtin_or_local(script_args.dataset_name) else script_args.dataset_name
        trainer.create_model_card(
            model_name=os.path.basename(os.path.normpath(output_dir)),
            dataset_name=card_dataset,
            tags=["stapo_trl", script_args.trainer],
        )
        # Restore the KV cache for fast inference (training turns it off).
        trainer.model.config.use_cache = True
        trainer.model.config.save_pretrained(output_dir)

    rows = read_metrics(output_dir) if is_main and os.path.isfile(os.path.join(output_dir, "metrics.jsonl")) else []
    if is_main and rows:
        label = f"{script_args.trainer} (seed {training_args.seed})"
        plot_training_curves({label: [rows]}, os.path.join(output_dir, CURVES_FILENAME), title=output_dir)
        plot_diagnostics([output_dir], output_dir, labels=[label])
    s2t_summary = _summarize_s2t(rows)

    #########################
    # Evaluate after training
    #########################
    if script_args.eval_before_after:
        trainer.accelerator.print("Evaluating the trained model ...")
        start = time.perf_counter()
        after = _evaluate_trainer_model(trainer, script_args, run.eval_dataset, eval_max_new_tokens)
        timings["eval_after"] = time.perf_counter() - start
        k = script_args.eval_num_samples
        eval_record = {
            "metric": f"avg@{k}",
            "accuracy_before": before[f"avg@{k}"],
            "accuracy_after": after[f"avg@{k}"],
            f"pass@{k}_before": before[f"pass@{k}"],
            f"pass@{k}_after": after[f"pass@{k}"],
            "k": k,
            "temperature": script_args.eval_temperature,
            "top_p": script_args.eval_top_p,
            "top_k": None,
            "max_new_tokens": eval_max_new_tokens,
            "num_problems": before["num_problems"],
            "dataset": script_args.dataset_name,
            "split": script_args.dataset_test_split,
            "seed": training_args.seed,
            "trainer": script_args.trainer,
            "global_step": trainer.state.global_step,
        }
        if is_main:
            with open(os.path.join(output_dir, EVAL_FILENAME), "w") as f:
                json.dump(eval_record, f, indent=2)

    if is_main:
        print(f"\n=== {script_args.trainer} run finished: {output_dir} (step {trainer.state.global_step}) ===")
        if s2t_summary:
            print(
                f"S2T: mean silenced ratio {s2t_summary['mean_silenced_ratio']:.2e} over logging steps, tokens "
                f"silenced at {100 * s2t_summary['fraction_of_logging_steps_with_silencing']:.0f} % of them."
            )
        if eval_record is not None:
            print(
                f"Held-out {eval_record['metric']} on {eval_record['num_problems']} problems (T={eval_record['temperature']}, "
                f"top_p={eval_record['top_p']}, {eval_max_new_tokens} new tokens): "
                f"before {100 * eval_record['accuracy_before']:.1f} % -> after {100 * eval_record['accuracy_after']:.1f} %"
            )
        print("Wall time (s): " + ", ".join(f"{name} {value:.0f}" for name, value in timings.items()))

    #############
    # Push to Hub
    #############
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name, tags=["stapo_trl", script_args.trainer])
        trainer.accelerator.print(f"Model pushed to the Hub: https://huggingface.co/{trainer.hub_model_id}.")

    # Finish the trackers and destroy the process group (nothing may communicate after this)
    if end_training:
        trainer.end()

    return {
        "output_dir": output_dir,
        "global_step": trainer.state.global_step,
        "eval": eval_record,
        "s2t": s2t_summary,
        "seconds": {name: round(value, 1) for name, value in timings.items()},
    }


# ---------------------------------------------------------------------------------------------------------------
# stapo-train compare
# ---------------------------------------------------------------------------------------------------------------

COMPARE_CURVES = (
    ("reward", "reward (mean over completions)", "linear"),
    ("entropy", "policy entropy (nats / token)", "linear"),
    ("s2t/silenced_ratio", "S2T silenced-token ratio (log)", "log"),
)


def _run_label(recipe: str, taken: set[str]) -> str:
    label = os.path.splitext(os.path.basename(recipe))[0]
    if label in taken:
        label = os.path.basename(os.path.dirname(os.path.abspath(recipe))) + "-" + label
    while label in taken:
        label += "'"
    return label


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return f"{100 * mean:.1f} ± {100 * std:.1f}"


def compare(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """`stapo-train compare RECIPE_A RECIPE_B [--seeds ...] [--output-dir DIR] [-- OVERRIDES]`.

    Trains both recipes on every seed (in this process, one after the other; `OVERRIDES` go to every run), with the
    before/after evaluation on, into `DIR/<recipe name>/seed<N>`. Writes `DIR/compare.png` (reward, entropy and
    silenced ratio over steps: mean over seeds with a min/max band) and `DIR/compare.json`, and prints the
    accuracy table. Finished runs are not redone (each run resumes from its last checkpoint).
    """
    from .diagnostic_plots import plot_diagnostics
    from .metrics_log import read_metrics
    from .plots import plot_training_curves

    argv = list(sys.argv[2:] if argv is None else argv)
    overrides: list[str] = []
    if "--" in argv:
        overrides = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    parser = argparse.ArgumentParser(
        prog="stapo-train compare",
        description="Train two recipes on the same seeds; plot both runs' curves in one PNG and print held-out "
        "accuracy before/after. Arguments after `--` override keys of both recipes (e.g. -- --max_steps 100).",
    )
    parser.add_argument(
        "recipes", nargs=2, metavar="RECIPE", help="Two recipe YAML files (e.g. grpo.yaml stapo.yaml)."
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="Seeds to run each recipe on.")
    parser.add_argument("--output-dir", default="outputs/compare", help="Root folder of the runs and the figure.")
    args = parser.parse_args(argv)

    labels: dict[str, str] = {}
    for recipe in args.recipes:
        labels[recipe] = _run_label(recipe, set(labels.values()))
    # Parse every run first, so that a bad recipe or override fails before the first training starts.
    planned = []
    try:
        for recipe in args.recipes:
            for seed in args.seeds:
                run_dir = os.path.join(args.output_dir, labels[recipe], f"seed{seed}")
                run_argv = [
                    "--config",
                    recipe,
                    "--eval_before_after",
                    "true",
                    "--seed",
                    str(seed),
                    "--output_dir",
                    run_dir,
                ]
                planned.append((labels[recipe], seed, parse_args(run_argv + overrides)))
    except (ValueError, OSError) as e:
        raise SystemExit(f"stapo-train compare: error: {e}") from e
    results: dict[str, list[dict[str, Any]]] = {label: [] for label in labels.values()}
    for i, (label, seed, parsed) in enumerate(planned):
        print(f"\n### compare: {label} seed {seed} -> {parsed[1].output_dir}")
        result = train(*parsed, end_training=i == len(planned) - 1)
        result["seed"] = seed
        results[label].append(result)

    runs = {label: [read_metrics(r["output_dir"]) for r in label_results] for label, label_results in results.items()}
    out = os.path.join(args.output_dir, "compare.png")
    title = " vs ".join(runs) + f" (seeds {', '.join(map(str, args.seeds))})"
    plot_training_curves(runs, out, curves=COMPARE_CURVES, title=title)
    run_dirs = [(f"{label} seed {r['seed']}", r["output_dir"]) for label, rs in results.items() for r in rs]
    plot_diagnostics([d for _, d in run_dirs], args.output_dir, labels=[name for name, _ in run_dirs])

    k_metric = next((r["eval"]["metric"] for rs in results.values() for r in rs if r["eval"]), "avg@k")
    header = f"{'run':<12} {'seed':>5} {k_metric + ' before':>14} {k_metric + ' after':>14} {'silenced ratio':>15}"
    lines = [header, "-" * len(header)]
    summary: dict[str, Any] = {"figure": out, "seeds": args.seeds, "runs": {}}
    for label, label_results in results.items():
        befores, afters = [], []
        for r in label_results:
            ev, s2t = r["eval"] or {}, r["s2t"]
            ratio = f"{s2t['mean_silenced_ratio']:.2e}" if s2t else "-"
            before, after = ev.get("accuracy_before"), ev.get("accuracy_after")
            if before is not None:
                befores.append(before)
                afters.append(after)
            lines.append(f"{label:<12} {r['seed']:>5} {_percent(before):>14} {_percent(after):>14} {ratio:>15}")
        lines.append(f"{label:<12} {'mean':>5} {_mean_std(befores):>14} {_mean_std(afters):>14}")
        summary["runs"][label] = [
            {"seed": r["seed"], "output_dir": r["output_dir"], "eval": r["eval"], "s2t": r["s2t"]}
            for r in label_results
        ]
    table = "\n".join(lines)
    print(f"\nHeld-out accuracy (%), {k_metric}, mean ± std over seeds:\n{table}\nFigure: {out}")
    with open(os.path.join(args.output_dir, "compare.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


# ---------------------------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    """`stapo-train [--config RECIPE.yaml] [--key value ...]`, `stapo-train compare ...` or `... --dry-run`.

    A recipe, data or model argument that cannot work (unknown key, reward, column, model path, `builtin:` name,
    `num_generations`, ...) ends the command with one `stapo-train: error: ...` message (exit status 1) before any
    model is built; errors during training keep their traceback.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "compare":
        compare(argv[1:])
        return
    if "--dry-run" in argv or "--dry_run" in argv:
        # Parse and check the recipe for a process count, print the plan, build nothing (stapo_trl.dry_run).
        from .dry_run import main as dry_run_main

        raise SystemExit(dry_run_main([a for a in argv if a not in ("--dry-run", "--dry_run")]))
    try:
        script_args, training_args, model_args = parse_args(argv)
        with torch_threads(script_args.torch_num_threads):
            prepared = prepare(script_args, training_args, model_args)
    except (ValueError, OSError) as e:
        raise SystemExit(f"stapo-train: error: {e}") from e
    train(script_args, training_args, model_args, prepared)


if __name__ == "__main__":
    main()
