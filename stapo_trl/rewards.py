r"""Reward functions in TRL's convention, `(completions, solution, **kwargs) -> list[float | None]`, one value per
completion, as [`~trl.GRPOTrainer`] calls them (its other keywords, dataset columns included, arrive in `**kwargs`).

The [STAPO](https://huggingface.co/papers/2602.15620) recipe (Sec. 4.1) trains on a binary rule-based reward,
`math_accuracy_reward`, graded by [`stapo_trl.grading`]; `format_reward` is an optional shaping term. `REWARDS` is
the registry; [`get_reward_funcs`] resolves its names or dotted import paths.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import math
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any


logger = logging.getLogger(__name__)

_warned_golds: set[str] = set()


def completion_text(completion: Any) -> str:
    """The text of one completion in TRL's standard (`str`) or conversational format (chat messages, a content
    string or `{"type": "text", "text": ...}` parts): the content of the last assistant message (the last message
    when none has the assistant role); `""` for `None` or no message."""
    if completion is None or isinstance(completion, str):
        return completion or ""
    messages = [completion] if isinstance(completion, dict) else list(completion)
    if not messages:
        return ""
    assistant = [m for m in messages if isinstance(m, dict) and m.get("role") == "assistant"]
    content = (assistant or messages)[-1]
    content = content.get("content", "") if isinstance(content, dict) else content
    if isinstance(content, list):  # multimodal-style content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else str(content)


def math_accuracy_reward(completions: Sequence[Any], solution: Sequence[Any], **kwargs) -> list[float | None]:
    r"""Binary correctness of the last `\boxed{}` answer, as [`stapo_trl.grading.grade`] decides it: 1.0 or 0.0.

    In the shape of TRL's `accuracy_reward`: a gold answer that does not parse gets `None` (TRL drops it from the
    reward sum), never 0 or 1, and is logged once per gold. A grader error, a timeout or an answer refused as too large
    to evaluate scores 0.0 and is logged. With TRL's `log_metric`, the batch's fractions in [0, 1] are logged as
    `grading/error_ratio` (errors other than unparseable golds), `grading/timeout_ratio` (the part of them that ran
    out of time or was refused) and `grading/gold_unparseable_ratio`.

    Args:
        completions (`Sequence`): `B` completions, strings or chat-message lists.
        solution (`Sequence`): `B` gold answers (`str`, `int`, `float` or list for multi-answer golds), the
            dataset's `solution` column repeated per generation by TRL.
        **kwargs: ignored, except `log_metric` (`Callable[[str, float], None]`).

    Returns:
        `list[float | None]`: length `B`.

    Raises:
        ValueError: `completions` and `solution` differ in length.
    """
    if len(completions) != len(solution):
        raise ValueError(
            f"math_accuracy_reward got {len(completions)} completions but {len(solution)} solutions; pass one "
            "`solution` per completion (a dataset column named `solution`)."
        )
    from .grading import grade  # math-verify and SymPy: imported by the first reward call

    results = [grade(completion_text(c), gold) for c, gold in zip(completions, solution)]
    no_gold = [r.error is not None and r.error.startswith("gold unparseable") for r in results]
    for key in {repr(gold)[:200] for gold, bad in zip(solution, no_gold) if bad} - _warned_golds:
        _warned_golds.add(key)
        logger.warning("math_accuracy_reward: gold answer %s does not parse; reward set to None", key)
    errors = [r.error for r, bad in zip(results, no_gold) if r.error and not bad]
    if errors:
        logger.warning(
            "math_accuracy_reward: %d/%d completions hit a grader error (scored 0.0); first: %s",
            *(len(errors), len(results), errors[0]),
        )
    log_metric = kwargs.get("log_metric")
    if callable(log_metric) and results:
        log_metric("grading/error_ratio", len(errors) / len(results))
        log_metric("grading/timeout_ratio", sum(e.startswith("timeout") for e in errors) / len(results))
        log_metric("grading/gold_unparseable_ratio", sum(no_gold) / len(results))
    return [None if bad else float(r.correct) for r, bad in zip(results, no_gold)]


# After the final box only closing math delimiters, punctuation and whitespace may follow.
_FORMAT_TAIL_RE = re.compile(r"^(?:\s|\$|\\\]|\\\)|[.!)\]])*$")


def format_reward(completions: Sequence[Any], **kwargs) -> list[float]:
    r"""1.0 when a completion ENDS with its answer in a complete, non-empty `\boxed{...}` (the last box; only
    whitespace, `$`, `\]`, `\)`, `.`, `!`, `)` or `]` after it), else 0.0; the answer's correctness is not checked.

    Returns:
        `list[float]`: one value in {0.0, 1.0} per completion of `completions` (`B` strings or chat-message lists).
    """
    from .grading import find_boxes

    rewards = []
    for text in map(completion_text, completions):
        last = (find_boxes(text) or [(None, 0, 0)])[-1]
        rewards.append(float(bool(last[0] and last[0].strip()) and _FORMAT_TAIL_RE.match(text[last[2] :]) is not None))
    return rewards


REWARDS: dict[str, Callable[..., list]] = {"math_accuracy": math_accuracy_reward, "format": format_reward}
"""The single reward registry: name -> function (`--reward_funcs` values)."""


REWARD_NOTE = "In reward function"  # how `checked_reward` names the function and step in an exception's notes


class NoRewardWarning(UserWarning):
    """A training step in which no reward function gave any completion a value (every value `None` or NaN): it has no
    learning signal. `stapo-train` stops on it (`warnings.simplefilter("error", NoRewardWarning)` does the same)."""


def checked_reward(func: Callable) -> Callable:
    """`func` (a sync reward function; an async one is returned as is) checking what it returns, named as TRL names
    `func`: anything but one number or `None` per completion raises (TRL would train on a str's characters, a dict's
    keys); NaN (TRL's `None`) and `inf` or `-inf` (its group's advantages are then not numbers) are warned once each,
    with their share. An exception raised in `func` keeps its traceback, with a note naming the function and the step,
    counted from 1 (`stapo-train` prints it as one line: [`reward_error_line`]).

    Raises (when the result is called):
        TypeError: `func` returned no sequence of numbers and `None`s.
        ValueError: `func` returned another count than one per completion (TRL's error, with the step).
    """
    from trl.trainer.utils import get_callable_name

    if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__):
        return func
    name, warned = get_callable_name(func), set()

    @functools.wraps(func)
    def checked(*args, **kwargs):
        state, expected = kwargs.get("trainer_state"), len(kwargs["completions"])
        step = state.global_step + 1 if hasattr(state, "global_step") else "?"  # the step being trained, from 1
        try:
            out = func(*args, **kwargs)
            rewards = None if isinstance(out, (str, Mapping)) or not isinstance(out, Iterable) else list(out)
            numbers = rewards is not None and all(r is None or hasattr(r, "__float__") for r in rewards)  # 0-d tensors
            if not numbers or len(rewards) != expected:
                raise (ValueError if numbers else TypeError)(
                    f"Reward function {name} returned {f'{len(rewards)} rewards' if numbers else repr(out)} at step "
                    f"{step}, but {expected} were expected (one per prompt-completion pair): return one float per "
                    "completion, None for one it cannot judge."
                )
        except Exception as e:
            e.add_note(f"{REWARD_NOTE} {name} at step {step}.")
            raise
        values = [float(r) for r in rewards if r is not None]
        for kind, count, what in (
            ("NaN", sum(map(math.isnan, values)), "TRL takes NaN for None (no reward), so they teach nothing"),
            ("inf or -inf", sum(map(math.isinf, values)), "the advantages of their groups are then not numbers, and "
             "those groups teach nothing"),
        ):  # fmt: skip
            if count and kind not in warned:
                warned.add(kind)
                logger.warning(
                    f"Reward function {name} returned {kind} for {count} of {len(rewards)} completions "
                    f"({count / len(rewards):.0%}) at step {step}: {what}. Return a finite number, or None for a "
                    "completion it cannot judge (shown once)"
                )
        return rewards

    checked.__name__ = name
    return checked


def reward_error_line(error: BaseException) -> str | None:
    """The one line `stapo-train` prints for an exception raised in a reward function ([`checked_reward`]'s note
    names it and the step), with where it was raised outside stapo_trl; `None` for another exception."""
    note = next((n for n in getattr(error, "__notes__", []) if n.startswith(REWARD_NOTE)), None)
    if note is None:
        return None
    message = (str(error).splitlines() or [""])[0]
    if message.startswith("Reward function "):  # checked_reward's own error names the function and step
        return message
    frames = [f for f in traceback.extract_tb(error.__traceback__) if os.sep + "stapo_trl" + os.sep not in f.filename]
    where = f" ({frames[-1].filename}:{frames[-1].lineno}, in {frames[-1].name})" if frames else ""
    return (
        f"reward function{note.removeprefix(REWARD_NOTE).rstrip('.')} raised {type(error).__name__}: {message}{where}"
    )


def resolve_reward_names(reward_funcs: Any) -> Any:
    """`reward_funcs` as given to `STAPOTrainer`, with each string that names a stapo_trl reward ([`REWARDS`], e.g.
    `"math_accuracy"`) replaced by its function, and each function checked ([`checked_reward`]). Other strings stay
    Hub reward-model ids, as in TRL; a string without "/" that is not a local path and not a registered name raises,
    since TRL would take it for a Hub id and retry the network for a minute.

    Raises:
        ValueError: an unregistered name that is not a Hub id (no "/") nor a local folder; the message lists
            `sorted(REWARDS)`.
    """
    import torch

    if isinstance(reward_funcs, list):
        return [resolve_reward_names(func) for func in reward_funcs]
    if isinstance(reward_funcs, str) and "/" not in reward_funcs and not os.path.isdir(reward_funcs):
        reward_funcs = get_reward_funcs([reward_funcs])[0]
    if not callable(reward_funcs) or isinstance(reward_funcs, torch.nn.Module):  # None, a Hub id, a reward model
        return reward_funcs
    return checked_reward(reward_funcs)


def _import_from_here(module_name: str):
    """`importlib.import_module(module_name)`, also from the current folder, as `python script.py` and `python -m` find
    a module there (an installed command such as `stapo-train` does not have the folder on `sys.path`)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        here = os.getcwd()
        if e.name != module_name.split(".")[0] or here in sys.path:
            raise
        sys.path.append(here)
        return importlib.import_module(module_name)


def get_reward_funcs(names: Sequence[str] | str) -> list[Callable[..., list]]:
    """Resolve reward names into callables, in the order given: registry keys of [`REWARDS`] (or a function's own
    name, `math_accuracy_reward`), or dotted import paths `pkg.module.function` found on `sys.path` or in the current
    folder; a single string may be comma-separated.

    Raises:
        ValueError: no name (`[]`, `None`), an unknown name, or a dotted path that does not import to a callable; the
            message lists `sorted(REWARDS)`.
    """
    if isinstance(names, str):
        names = names.split(",")
    if not names or not any(str(name).strip() for name in names):
        raise ValueError(
            f"reward_funcs={names!r} names no reward: give at least one, one of {sorted(REWARDS)} or a dotted path "
            "`pkg.module.function` (the paper trains on math_accuracy alone)."
        )
    by_func_name = {f.__name__: f for f in REWARDS.values()}
    funcs = []
    for raw in names:
        name = raw.strip()
        if name in REWARDS or name in by_func_name:
            funcs.append(REWARDS.get(name) or by_func_name[name])
        elif "." in name:
            module_name, _, attr = name.rpartition(".")
            try:
                func = getattr(_import_from_here(module_name), attr)
            except (ImportError, AttributeError) as e:
                raise ValueError(
                    f"Reward {name!r} could not be imported ({e}). Use a dotted path `module.function` importable "
                    f"from the current folder ({os.getcwd()}) or PYTHONPATH, or one of {sorted(REWARDS)}."
                ) from e
            if not callable(func):
                raise ValueError(f"Reward {name!r} is not callable. Valid names: {sorted(REWARDS)}.")
            funcs.append(func)
        else:
            raise ValueError(
                f"Unknown reward {name!r}. Valid names: {sorted(REWARDS)}, or a dotted path `pkg.module.function`."
            )
    return funcs


__all__ = [
    "REWARDS",
    "NoRewardWarning",
    "checked_reward",
    "completion_text",
    "format_reward",
    "get_reward_funcs",
    "math_accuracy_reward",
]
