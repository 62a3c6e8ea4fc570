"""The datasets of a run, checked when the trainer is built, before any model: one rule for `stapo-train`, its dry run,
the trainer and (for chat templates) `stapo-eval`.

- [`check_prompt_column`]: a dataset is not empty, and has the `prompt` column TRL reads.
- [`check_reward_columns`]: every reward argument is filled by a column or by TRL.
- [`check_chat_template`]: chat-message prompts need a tokenizer with a chat template.

TRL's `GRPOTrainer` calls a reward function as `f(prompts=..., completions=..., completion_ids=..., **columns)`,
where `columns` are every dataset column but `prompt`, `completion` and `completion_ids`, plus `trainer_state`,
`log_extra`, `log_metric` (and `environments` with `environment_factory`). A reward argument without a default that
none of these fills raises a `TypeError` at the first training step, after the model is built and the first batch is
generated. [`check_reward_columns`] finds it at construction instead.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any


# Reward arguments TRL 1.16 fills itself (GRPOTrainer._calculate_rewards), never from a column.
TRL_REWARD_ARGUMENTS = (
    "prompts",
    "completions",
    "completion_ids",
    "trainer_state",
    "log_extra",
    "log_metric",
    "environments",
)
# Dataset columns TRL does not pass to reward functions under their own name: it passes the plural instead.
_PASSED_AS = {"prompt": "prompts", "completion": "completions"}


def missing_column_message(column: str, dataset_name: str, columns: Iterable[str]) -> str:
    """The start of every missing-column error: `Column 'x' not found in dataset 'y'. Available columns: [...].`"""
    return f"Column {column!r} not found in dataset {dataset_name!r}. Available columns: {list(columns)}."


def required_reward_arguments(reward_func: Callable[..., Any]) -> list[str]:
    """The arguments of `reward_func` (a function, `functools.partial` or callable instance) that have no default and
    are not `*args` / `**kwargs`, in order; `[]` when the signature cannot be read (never refused then)."""
    try:
        parameters = inspect.signature(reward_func).parameters.values()
    except (TypeError, ValueError):
        return []
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p.name for p in parameters if p.default is inspect.Parameter.empty and p.kind not in variadic]


def _named_datasets(dataset: Any, dataset_name: str) -> list[tuple[str, Any]]:
    """`[(name, dataset)]`; a dict of datasets (TRL's several eval datasets) gives one entry per key."""
    if dataset is None:
        return []
    if isinstance(dataset, Mapping):
        return [(f"{dataset_name}[{key!r}]", value) for key, value in dataset.items()]
    return [(dataset_name, dataset)]


def check_reward_columns(reward_funcs: Any, dataset: Any, dataset_name: str = "train_dataset") -> None:
    """Raise a `ValueError` if a reward function needs an argument that neither a dataset column nor TRL provides.

    Args:
        reward_funcs (`Callable`, `str`, `torch.nn.Module` or a `list` of them): as `GRPOTrainer`'s `reward_funcs`;
            only plain callables are checked (a reward model reads the text, not the columns).
        dataset ([`~datasets.Dataset`], [`~datasets.IterableDataset`], a `dict` of them, or `None`): the data the
            rewards will see. A dataset whose columns are unknown (`column_names` is `None`, e.g. some streamed
            datasets) is not checked; `None` checks nothing.
        dataset_name (`str`, *optional*, defaults to `"train_dataset"`): how the message names the dataset (the CLI
            passes the recipe's `dataset_name`).

    Raises:
        ValueError: naming the column, the dataset, its columns, and the reward function with the argument, e.g.
            "Column 'solution' not found in dataset 'train_dataset'. Available columns: ['prompt']. The reward
            function 'math_accuracy_reward' needs it: TRL passes each dataset column to the reward argument of the
            same name. Add the column to the dataset, or give the argument a default."
    """
    import torch  # here, not at the top: `stapo_trl.data` imports this module for the message alone
    from trl.trainer.utils import get_callable_name

    funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
    # A reward model (`nn.Module`, or a model id `str`) reads the text, not the columns.
    funcs = [f for f in funcs if callable(f) and not isinstance(f, torch.nn.Module)]
    for name, data in _named_datasets(dataset, dataset_name):
        columns = getattr(data, "column_names", None)  # torch / plain datasets have no column list: not checked
        if columns is None:
            continue
        available = (set(columns) - set(_PASSED_AS)) | set(TRL_REWARD_ARGUMENTS)
        for func in funcs:
            for argument in required_reward_arguments(func):
                if argument in _PASSED_AS:
                    raise ValueError(
                        f"The reward function {get_callable_name(func)!r} takes an argument {argument!r}, which TRL "
                        f"never fills: it passes that column as `{_PASSED_AS[argument]}` (one entry per completion). "
                        f"Rename the argument to `{_PASSED_AS[argument]}`."
                    )
                if argument not in available:
                    raise ValueError(
                        f"{missing_column_message(argument, name, columns)} The reward function "
                        f"{get_callable_name(func)!r} needs it: TRL passes each dataset column to the reward argument "
                        "of the same name. Add the column to the dataset, or give the argument a default."
                    )


def check_prompt_column(dataset: Any, dataset_name: str = "train_dataset", *, prompt_optional: bool = False) -> None:
    """Raise a `ValueError` if `dataset` (or one of a dict of datasets) is empty, or has column names but no `prompt`
    column, which TRL reads the prompts from (a `KeyError` inside TRL at the first step otherwise). Datasets without
    a length or a column list (streamed ones) pass what cannot be known.

    Args:
        dataset ([`~datasets.Dataset`], [`~datasets.IterableDataset`], a `dict` of them, or `None`): the prompts;
            `None` checks nothing.
        dataset_name (`str`, *optional*, defaults to `"train_dataset"`): how the message names the dataset.
        prompt_optional (`bool`, *optional*, defaults to `False`): the `prompt` column may be missing, as with an
            `environment_factory`: TRL 1.16 then starts from an empty user message that the environment's `reset`
            fills (a dataset may carry only the `environment` column that routes each row). Only emptiness is checked.

    Raises:
        ValueError: the dataset is empty, or (unless `prompt_optional`) it has no `prompt` column.
    """
    for name, data in _named_datasets(dataset, dataset_name):
        if hasattr(data, "__len__") and len(data) == 0:
            raise ValueError(
                f"Dataset {name!r} is empty (0 rows): give it prompts, one row each with a 'prompt' column (a string "
                "or a list of chat messages) and the columns the reward functions read."
            )
        columns = getattr(data, "column_names", None)
        if columns is not None and "prompt" not in columns and not prompt_optional:
            raise ValueError(
                f"{missing_column_message('prompt', name, columns)} TRL reads each prompt from a column named "
                "'prompt' (a string or a list of chat messages): rename yours, e.g. dataset.rename_column('question', "
                "'prompt'); or pass an environment_factory whose reset() supplies the prompt."
            )


def has_chat_template(tokenizer: Any) -> bool:
    """Whether `tokenizer` (a tokenizer or a processor) has a chat template to format chat messages with."""
    return bool(getattr(tokenizer, "chat_template", None))


def chat_template_message(model_name: str, what: str, fix: str) -> str:
    """The one line every command prints for chat messages without a chat template: what, which model, the fix."""
    return (
        f"{what} chat messages, but the tokenizer of {model_name!r} has no chat template to format them with "
        f"(tokenizer.chat_template is not set). {fix}"
    )


# The fix each caller names: from Python (training from code), `stapo-train` (its prompts are always chat messages),
# `stapo-eval` (which can also feed the plain text).
CHAT_TEMPLATE_FIX = (
    "Give the tokenizer a template (tokenizer.chat_template = '...', then pass processing_class=tokenizer or save it "
    "into the model folder), or pass prompts as plain strings. The built-in builtin:gemma3-270m adds Gemma's."
)
CLI_CHAT_TEMPLATE_FIX = (
    "Use a model whose tokenizer has one (builtin:gemma3-270m adds Gemma's to google/gemma-3-270m), or set "
    "tokenizer.chat_template and save_pretrained it into the model folder."
)
EVAL_CHAT_TEMPLATE_FIX = CLI_CHAT_TEMPLATE_FIX[:-1] + "; or pass --no-chat-template to feed the plain problem text."


def first_example(dataset: Any) -> Any:
    """The first example of a dataset (map-style or iterable), or `None` when there is none or it cannot be read."""
    try:
        return dataset[0] if hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__") else next(iter(dataset))
    except (IndexError, KeyError, StopIteration, TypeError):
        return None


def check_chat_template(tokenizer: Any, dataset: Any, model_name: str, dataset_name: str = "train_dataset",
                        fix: str = CHAT_TEMPLATE_FIX) -> None:  # fmt: skip
    """Raise a `ValueError` if `dataset`'s prompts are chat messages and `tokenizer` has no chat template.

    TRL formats chat-message prompts with `apply_chat_template`; without a template it fails at the first training
    step ("tokenizer.chat_template is not set"), after the model is built and the run files are opened. A base model
    such as google/gemma-3-270m has none.

    Args:
        tokenizer: the tokenizer (or processor) the trainer will use.
        dataset ([`~datasets.Dataset`], a `dict` of datasets, or `None`): the prompts; the first example of each
            tells whether they are chat messages ([`~trl.data_utils.is_conversational`]).
        model_name (`str`): how the message names the model.
        dataset_name (`str`, *optional*, defaults to `"train_dataset"`): how the message names the dataset.
        fix (`str`, *optional*): the last sentence of the message: what to do (the CLI names its own fix).

    Raises:
        ValueError: one line, [`chat_template_message`].
    """
    from trl.data_utils import is_conversational

    if has_chat_template(tokenizer):
        return
    for name, data in _named_datasets(dataset, dataset_name):
        example = first_example(data)
        if isinstance(example, dict) and "prompt" in example and is_conversational(example):
            raise ValueError(chat_template_message(model_name, f"The prompts of {name!r} are", fix))
