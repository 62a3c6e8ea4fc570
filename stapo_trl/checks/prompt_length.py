"""One rule for prompts longer than the model can take, shared by `stapo-eval` and `stapo-train`.

A prompt of P tokens with a generation budget of G tokens needs P + G positions. When P + G exceeds the model's
positions (`max_position_embeddings`), generation runs anyway, silently and slowly, past what the model was
trained on. The rule: the prompt budget is `max_positions - G` (and at most `max_prompt_tokens` when that is set);
longer prompts are dropped before generating, with one warning line that gives the count and names
`max_prompt_tokens`; when no prompt is left, it is an error.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any


logger = logging.getLogger(__name__)

_POSITION_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def model_max_positions(model_or_config: Any) -> int | None:
    """The number of positions a model can attend over, read from its config.

    Args:
        model_or_config: a `transformers` model, its `PretrainedConfig`, a `dict`, an [`~stapo_trl.evaluation.generation.HFGenerator`]
            (its `.model`) or a vLLM `LLM` (its `max_model_len`).

    Returns:
        `int` or `None`: the first positive integer among `max_model_len` (vLLM), `max_position_embeddings`,
        `n_positions`, `max_sequence_length`, `seq_length`; `None` when there is none.
    """
    engine = getattr(getattr(model_or_config, "llm", model_or_config), "llm_engine", None)
    model_config = getattr(engine, "model_config", None)
    if isinstance(getattr(model_config, "max_model_len", None), int):
        return model_config.max_model_len
    obj = getattr(model_or_config, "model", model_or_config)
    config = getattr(obj, "config", obj)
    for name in _POSITION_FIELDS:
        value = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def config_max_positions(name_or_path: str, revision: str | None = None) -> int | None:
    """The positions of a model read from its `config.json` without loading it ([`model_max_positions`]): a local
    model folder, a built `builtin:` model, or a Hub id in the local Hugging Face cache.

    Args:
        name_or_path (`str`): a model argument.
        revision (`str`, *optional*): the Hub revision of a Hub id.

    Returns:
        `int` or `None`: the positions; `None` when no `config.json` can be read here (a `builtin:` model not yet
        built, a Hub id not cached, an adapter folder) or it names none.
    """
    import json
    import os

    path = None
    if name_or_path.startswith("builtin:"):
        from ..models.names import builtin_model_dir

        try:
            path = builtin_model_dir(name_or_path.removeprefix("builtin:")) / "config.json"
        except (KeyError, ValueError):
            return None
    elif os.path.isdir(os.path.expanduser(name_or_path)):
        path = os.path.join(os.path.expanduser(name_or_path), "config.json")
    else:
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(name_or_path, "config.json", revision=revision)
        except Exception:  # noqa: BLE001 (an invalid repo id: nothing cached)
            cached = None
        path = cached if isinstance(cached, str) else None
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, TypeError, ValueError):
        return None
    return model_max_positions(config) if isinstance(config, dict) else None


def prompt_token_budget(
    max_positions: int | None, max_new_tokens: int, max_prompt_tokens: int | None = None
) -> int | None:
    """The longest prompt, in tokens, that still leaves `max_new_tokens` positions for the completion.

    Args:
        max_positions (`int` or `None`): the model's positions ([`model_max_positions`]); `None`: unknown.
        max_new_tokens (`int`): the generation budget (`max_new_tokens` / `max_completion_length`), in tokens.
        max_prompt_tokens (`int`, *optional*): a user cap on prompt tokens.

    Returns:
        `int` or `None`: `min(max_positions - max_new_tokens, max_prompt_tokens)` over the known terms; `None` when
        neither is known (no limit).

    Raises:
        ValueError: `max_new_tokens` >= `max_positions` (no room for any prompt), or `max_prompt_tokens` < 1.
    """
    if max_prompt_tokens is not None and max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens must be a positive number of tokens, got {max_prompt_tokens!r}.")
    budgets = [] if max_prompt_tokens is None else [max_prompt_tokens]
    if max_positions is not None:
        if max_new_tokens >= max_positions:
            raise ValueError(
                f"max_new_tokens={max_new_tokens} leaves no room for a prompt: the model has {max_positions} "
                f"positions (prompt + completion); lower the generation budget below {max_positions}."
            )
        budgets.append(max_positions - max_new_tokens)
    return min(budgets) if budgets else None


def count_prompt_tokens(prompt_texts: Sequence[str], tokenizer) -> list[int]:
    """Token counts of already-rendered prompt texts (chat template applied), without adding special tokens.

    Args:
        prompt_texts (`Sequence[str]`): P prompts, as given to the generator.
        tokenizer: a `transformers` tokenizer.

    Returns:
        `list[int]`: P counts.
    """
    return [len(ids) for ids in tokenizer(list(prompt_texts), add_special_tokens=False)["input_ids"]]


def keep_short_prompts(
    lengths: Sequence[int],
    budget: int | None,
    *,
    what: str = "prompts",
    max_positions: int | None = None,
    max_new_tokens: int | None = None,
) -> list[int]:
    """Indices of the prompts within `budget` tokens; warns once (one line) when some are dropped.

    Args:
        lengths (`Sequence[int]`): P prompt lengths in tokens.
        budget (`int` or `None`): from [`prompt_token_budget`]; `None` keeps everything.
        what (`str`): what the prompts are, for the messages (`"math500 prompts"`, `"training prompts"`).
        max_positions (`int`, *optional*), max_new_tokens (`int`, *optional*): quoted in the messages.

    Returns:
        `list[int]`: the kept indices, in order.

    Raises:
        ValueError: every prompt is longer than `budget` (nothing left to generate from).
    """
    if budget is None:
        return list(range(len(lengths)))
    keep = [i for i, n in enumerate(lengths) if n <= budget]
    report_dropped(
        len(lengths), len(keep), budget, what=what, max_positions=max_positions, max_new_tokens=max_new_tokens
    )
    return keep


def report_dropped(
    total: int,
    kept: int,
    budget: int,
    *,
    what: str = "prompts",
    max_positions: int | None = None,
    max_new_tokens: int | None = None,
) -> None:
    """The one warning line (some prompts dropped) or error (none left) of the rule; silent when none was dropped.

    Args:
        total (`int`), kept (`int`): prompt counts before and after dropping.
        budget (`int`): the prompt budget in tokens; the other arguments as in [`keep_short_prompts`].

    Raises:
        ValueError: `kept` is 0 while `total` is not.
    """
    dropped = total - kept
    if not dropped:
        return
    why = (
        f" (the model's {max_positions} positions minus {max_new_tokens} for the completion)"
        if max_positions is not None and max_new_tokens is not None
        else ""
    )
    if not kept:
        raise ValueError(
            f"All {total} {what} are longer than {budget} tokens{why}; nothing is left to generate from: raise "
            "max_prompt_tokens, use a model with more positions, a smaller generation budget, or shorter prompts."
        )
    logger.warning(
        "Dropped %d of %d %s longer than %d tokens%s (max_prompt_tokens: the prompt budget).",
        dropped,
        total,
        what,
        budget,
        why,
    )


__all__ = [
    "config_max_positions",
    "count_prompt_tokens",
    "keep_short_prompts",
    "model_max_positions",
    "prompt_token_budget",
    "report_dropped",
]
