"""`STAPOScriptArguments`: the recipe fields of neither `STAPOConfig` nor `ModelConfig`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from trl import ScriptArguments

from ..data import INSTRUCTION
from ..evaluation.tasks import get_benchmark_spec


def _help_from_docstring(cls):
    """Give each field its docstring entry as its `--help-fields` text."""
    for entry in re.split(r"\n {8}(?=\w+ \(`)", cls.__doc__.split("    Args:")[1])[1:]:
        field_ = cls.__dataclass_fields__[entry.split(" ", 1)[0]]
        text = re.sub(r"\[`~?([\w.]+)`\]", r"`\1`", " ".join(entry.split("): ", 1)[1].split()))
        field_.metadata = MappingProxyType({**field_.metadata, "help": text[:1].upper() + text[1:]})
    return cls


@_help_from_docstring
@dataclass
class STAPOScriptArguments(ScriptArguments):
    """Script arguments of `stapo-train`: trainer, rewards, data, evaluation. The inherited `dataset_name`,
    `dataset_config`, `dataset_train_split` and `dataset_test_split` select the data (no `dataset_streaming`).

    Args:
        trainer (`str`, *optional*, defaults to `"stapo"`): `"stapo"` (`s2t_mode: "off"`: the baseline) or `"grpo"`.
        reward_funcs (`list[str]`, *optional*, defaults to `["math_accuracy"]`): `REWARDS` names or dotted paths.
        prompt_column (`str`, *optional*, defaults to `"problem"`): the problem (or chat) column; not for `builtin:`.
        solution_column (`str`, *optional*, defaults to `"answer"`): the gold-answer column (`a.b`: a struct's field).
        instruction (`str`, *optional*): appended to every problem; `None`: the paper's `\\boxed{}` suffix; `""`: none.
        strip_dapo_instruction (`bool`, *optional*, defaults to `False`): remove DAPO-Math-17k's "Answer: $Answer".
        max_prompt_tokens (`int`, *optional*): drop longer training prompts (unset: positions - max_completion_length).
        max_train_samples (`int`, *optional*): keep only the first N training problems.
        eval_before_after (`bool`, *optional*, defaults to `False`): held-out avg@k before and after, into `eval.json`.
        eval_num_problems (`int`, *optional*, defaults to `200`): the first N problems of the test split.
        eval_num_samples (`int`, *optional*, defaults to `4`): k, completions sampled per problem.
        eval_temperature (`float`, *optional*, defaults to `1.0`): sampling temperature of the evaluation.
        eval_top_p (`float`, *optional*, defaults to `1.0`): top-p of the evaluation sampling.
        eval_max_new_tokens (`int`, *optional*): generation budget of the evaluation; `None`: `max_completion_length`.
        eval_batch_size (`int`, *optional*, defaults to `64`): problems per `generate` call (each yields k).
        benchmark_eval (`str`, *optional*): a benchmark (`aime24`, ..., `tiny-math`) TRL's evaluation samples.
        benchmark_eval_data_dir (`str`, *optional*): folder of local benchmark files (`None`: the Hub, or built in).
        benchmark_eval_steps (`int`, *optional*): `eval_steps` (`None`: `eval_steps`, else `logging_steps`).
        benchmark_eval_samples (`int`, *optional*, defaults to `4`): k per problem; it divides the global eval batch.
        benchmark_eval_limit (`int`, *optional*, defaults to `32`): the first N problems; N x k fills whole batches.
        torch_num_threads (`int`, *optional*): CPU threads of torch and `OMP_NUM_THREADS` (the CPU demo: 1).
    """

    trainer: Literal["stapo", "grpo"] = "stapo"
    reward_funcs: list[str] = field(default_factory=lambda: ["math_accuracy"])
    prompt_column: str = "problem"
    solution_column: str = "answer"
    instruction: str | None = None
    strip_dapo_instruction: bool = False
    max_prompt_tokens: int | None = None
    max_train_samples: int | None = None
    eval_before_after: bool = False
    eval_num_problems: int = 200
    eval_num_samples: int = 4
    eval_temperature: float = 1.0
    eval_top_p: float = 1.0
    eval_max_new_tokens: int | None = None
    eval_batch_size: int = 64
    benchmark_eval: str | None = None
    benchmark_eval_data_dir: str | None = None
    benchmark_eval_steps: int | None = None
    benchmark_eval_samples: int = 4
    benchmark_eval_limit: int | None = 32
    torch_num_threads: int | None = None

    def __post_init__(self):
        if self.dataset_streaming:
            raise ValueError("dataset_streaming=True is not supported by stapo-train: set it to false.")
        for column, what in (("prompt_column", "problem"), ("solution_column", "gold answer")):
            if not getattr(self, column) and not str(self.dataset_name).startswith("builtin:"):
                raise ValueError(f"{column}='' is empty: name the dataset column that holds the {what}.")
        if self.benchmark_eval is not None:
            self.benchmark_eval = get_benchmark_spec(self.benchmark_eval).name
        skip = "or set eval_before_after: false to skip the evaluation"
        fixes = {"eval_num_problems": skip, "eval_num_samples": skip, "torch_num_threads": "the CPU demo uses 1; "
                 "unset: default", "benchmark_eval_steps": "or unset", "benchmark_eval_samples": "samples per problem",
                 "benchmark_eval_limit": "or unset"}  # fmt: skip
        for name, fix in fixes.items():
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1 ({fix}).")

    def dataset_kwargs(self) -> dict:
        """The [`~stapo_trl.data.load_prompt_dataset`] arguments this recipe sets (`instruction=None`: the paper's)."""
        names = ("dataset_config", "prompt_column", "solution_column", "instruction", "strip_dapo_instruction")
        instruction = INSTRUCTION if self.instruction is None else self.instruction
        return {name: getattr(self, name) for name in names} | {"instruction": instruction}
