"""The datasets of a run, checked when a trainer is built, before any model: what `GRPOTrainer` would otherwise fail on
at its first step, after generating. TRL calls a reward as `f(prompts=, completions=, completion_ids=, **columns)`
with every column but `prompt`, plus `trainer_state`, `log_extra`, `log_metric` (and `environments`)."""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from typing import Any


TRL_REWARD_ARGUMENTS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments")  # fmt: skip
_PASSED_AS = {"prompt": "prompts", "completion": "completions"}  # columns TRL passes under the plural
CHAT_TEMPLATE_FIX = (
    "Give the tokenizer a template (tokenizer.chat_template = '...', then pass processing_class=tokenizer or save it "
    "into the model folder), or pass prompts as plain strings."
)
CLI_CHAT_TEMPLATE_FIX = (
    "Use a model whose tokenizer has one (builtin:gemma3-270m adds Gemma's), or set tokenizer.chat_template and "
    "save_pretrained it into the model folder."
)
EVAL_CHAT_TEMPLATE_FIX = CLI_CHAT_TEMPLATE_FIX[:-1] + "; or pass --no-chat-template to feed the plain problem text."


def missing_column_message(column: str, dataset_name: str, columns) -> str:
    return f"Column {column!r} not found in dataset {dataset_name!r}. Available columns: {list(columns)}."


def _named(dataset: Any, dataset_name: str) -> list[tuple[str, Any]]:
    """`[(name, dataset)]`; a dict of datasets (several eval datasets) gives one entry per key."""
    if isinstance(dataset, Mapping):
        return [(f"{dataset_name}[{key!r}]", value) for key, value in dataset.items()]
    return [] if dataset is None else [(dataset_name, dataset)]


def check_reward_columns(reward_funcs: Any, dataset: Any, dataset_name: str = "train_dataset") -> None:
    """Raise a `ValueError` naming the column, the dataset and the reward when a reward function (a plain callable; a
    reward model reads the text) has an argument without a default that no column of `dataset` nor TRL fills.
    Datasets without a column list (some streamed ones) are not checked."""
    import torch
    from trl.trainer.utils import get_callable_name

    funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
    funcs = [f for f in funcs if callable(f) and not isinstance(f, torch.nn.Module)]
    for name, data in _named(dataset, dataset_name):
        if (columns := getattr(data, "column_names", None)) is None:
            continue
        available = (set(columns) - set(_PASSED_AS)) | set(TRL_REWARD_ARGUMENTS)
        for func in funcs:
            try:
                parameters = inspect.signature(func).parameters.values()
            except (TypeError, ValueError):
                continue
            variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
            for argument in [p.name for p in parameters if p.default is p.empty and p.kind not in variadic]:
                if argument in _PASSED_AS:
                    raise ValueError(
                        f"The reward function {get_callable_name(func)!r} takes an argument {argument!r}, which TRL "
                        f"never fills: it passes that column as `{_PASSED_AS[argument]}`. Rename the argument."
                    )
                if argument not in available:
                    raise ValueError(
                        f"{missing_column_message(argument, name, columns)} The reward function "
                        f"{get_callable_name(func)!r} needs it: TRL passes each dataset column to the reward argument "
                        "of the same name. Add the column to the dataset, or give the argument a default."
                    )


def check_prompt_column(dataset: Any, dataset_name: str = "train_dataset", *, prompt_optional: bool = False) -> None:
    """Raise a `ValueError` when `dataset` (or one of a dict of them) is empty, or has columns but no `prompt`
    (unless `prompt_optional`: an `environment_factory`'s `reset()` supplies the prompt)."""
    for name, data in _named(dataset, dataset_name):
        if hasattr(data, "__len__") and len(data) == 0:
            raise ValueError(
                f"Dataset {name!r} is empty (0 rows): give it prompts, one row each with a 'prompt' column."
            )
        columns = getattr(data, "column_names", None)
        if columns is not None and "prompt" not in columns and not prompt_optional:
            raise ValueError(
                f"{missing_column_message('prompt', name, columns)} TRL reads each prompt from a column named 'prompt' "
                "(a string or chat messages): rename yours, e.g. dataset.rename_column('question', 'prompt'); or pass an "
                "environment_factory whose reset() supplies the prompt."
            )


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def chat_template_message(model_name: str, what: str, fix: str) -> str:
    return f"{what} chat messages, but the tokenizer of {model_name!r} has no chat template to format them with. {fix}"


def render_chat_template(tokenizer, messages, **template_kwargs) -> str:
    """`messages` through `tokenizer`'s chat template, with the generation prompt, as text; a `ValueError` naming the
    template's file where jinja refuses it (it does not parse, its sandbox stopped an unsafe access, it raised)."""
    from jinja2 import TemplateError

    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **template_kwargs)
    except TemplateError as e:
        folder = str(getattr(tokenizer, "name_or_path", ""))
        files = [os.path.join(folder, f) for f in ("chat_template.jinja", "tokenizer_config.json")]
        where = next(filter(os.path.isfile, files), f"of {folder!r}")
        reason = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
        raise ValueError(f"The chat template {where} cannot be applied ({reason}): fix or replace it.") from None


def check_chat_template(
    tokenizer, dataset, model_name: str, dataset_name="train_dataset", fix=CHAT_TEMPLATE_FIX, template_kwargs=None
):
    """Raise a `ValueError` when `dataset`'s prompts are chat messages and `tokenizer` has no chat template, or one
    that jinja refuses on the first prompt ([`render_chat_template`])."""
    from trl.data_utils import is_conversational

    for name, data in _named(dataset, dataset_name):
        try:
            example = data[0] if hasattr(data, "__getitem__") and hasattr(data, "__len__") else next(iter(data))
        except (IndexError, KeyError, StopIteration, TypeError):
            continue
        if isinstance(example, dict) and "prompt" in example and is_conversational(example):
            if not has_chat_template(tokenizer):
                raise ValueError(chat_template_message(model_name, f"The prompts of {name!r} are", fix))
            render_chat_template(tokenizer, example["prompt"], **(template_kwargs or {}))
