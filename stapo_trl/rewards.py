"""TRL reward functions: binary `math_accuracy_reward` (STAPO Sec. 4.1), `format_reward`, the `REWARDS` registry."""

from __future__ import annotations

import functools
import importlib.util
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
REWARD_NOTE = "In reward function"  # how `checked_reward` names the function and step in an exception's notes
_FORMAT_TAIL_RE = re.compile(r"^(?:\s|\$|\\\]|\\\)|[.!)\]])*$")  # what may follow the final box
_NOT_FINITE = (("NaN", math.isnan, "TRL takes NaN for None (no reward), so they teach nothing"),
    ("inf or -inf", math.isinf, "the advantages of their groups are then not numbers, and those groups teach nothing"),
)  # fmt: skip


def completion_text(completion: Any) -> str:
    """The text of a completion (a string, or chat messages: the last assistant message's text); `""` for None, []."""
    if completion is None or isinstance(completion, str):
        return completion or ""
    messages = [completion] if isinstance(completion, dict) else list(completion)
    content = ([m for m in messages if isinstance(m, dict) and m.get("role") == "assistant"] or messages or [""])[-1]
    content = content.get("content", "") if isinstance(content, dict) else content
    if isinstance(content, list):  # multimodal-style content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else str(content)


def math_accuracy_reward(completions: Sequence[Any], solution: Sequence[Any], **kwargs) -> list[float | None]:
    """1.0 per completion (`B` strings or chat lists) whose answer [`stapo_trl.grading.grade`] finds equal to its gold
    in `solution` (`B` of str, int, float or list), else 0.0 (grader errors logged); `None` for a gold that does not
    parse (logged once). `log_metric` gets `grading/error_ratio`, `timeout_ratio` and `gold_unparseable_ratio`.
    Raises `ValueError` when the lengths differ."""
    if len(completions) != len(solution):
        raise ValueError(f"math_accuracy_reward got {len(completions)} completions but {len(solution)} solutions; "
                         "pass one `solution` per completion (a dataset column named `solution`).")  # fmt: skip
    from .grading import grade

    results = [grade(completion_text(c), gold) for c, gold in zip(completions, solution)]
    no_gold = [(r.error or "").startswith("gold unparseable") for r in results]
    for key in {repr(gold)[:200] for gold, bad in zip(solution, no_gold) if bad} - _warned_golds:
        _warned_golds.add(key)
        logger.warning("math_accuracy_reward: gold answer %s does not parse; reward set to None", key)
    if errors := [r.error for r, bad in zip(results, no_gold) if r.error and not bad]:
        logger.warning("math_accuracy_reward: %d/%d completions hit a grader error (scored 0.0); first: %s",
                       len(errors), len(results), errors[0])  # fmt: skip
    if callable(log_metric := kwargs.get("log_metric")) and results:
        log_metric("grading/error_ratio", len(errors) / len(results))
        log_metric("grading/timeout_ratio", sum(e.startswith("timeout") for e in errors) / len(results))
        log_metric("grading/gold_unparseable_ratio", sum(no_gold) / len(results))
    return [None if bad else float(r.correct) for r, bad in zip(results, no_gold)]


def format_reward(completions: Sequence[Any], **kwargs) -> list[float]:
    r"""1.0 per completion that ENDS with a complete, non-empty `\boxed{}` (then only `$`, `\]`, `.`, ...); else 0."""
    from .grading import find_boxes

    rewards = []
    for text in map(completion_text, completions):
        box, _, end = (find_boxes(text) or [(None, 0, 0)])[-1]
        rewards.append(float(bool(box and box.strip()) and _FORMAT_TAIL_RE.match(text[end:]) is not None))
    return rewards


REWARDS: dict[str, Callable[..., list]] = {"math_accuracy": math_accuracy_reward, "format": format_reward}


class NoRewardWarning(UserWarning):
    """A training step in which no reward function gave any completion a value (`stapo-train` stops on it)."""


def checked_reward(func: Callable) -> Callable:
    """`func` (sync; an async one is returned as is) under TRL's name, checking its result: `TypeError` for anything
    but numbers and `None`s, `ValueError` for another count than one per completion, NaN and inf warned once each with
    their share; an exception raised in `func` gets a note naming the function and the step (from 1)."""
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
                raise (ValueError if numbers else TypeError)(f"Reward function {name} returned "
                    f"{f'{len(rewards)} rewards' if numbers else repr(out)} at step {step}, but {expected} were "
                    "expected (one per prompt-completion pair): return one float per completion, None for one it "
                    "cannot judge.")  # fmt: skip
        except Exception as e:
            e.add_note(f"{REWARD_NOTE} {name} at step {step}.")
            raise
        for kind, test, what in _NOT_FINITE:
            if (count := sum(test(float(r)) for r in rewards if r is not None)) and kind not in warned:
                warned.add(kind)
                logger.warning(f"Reward function {name} returned {kind} for {count} of {len(rewards)} completions "
                               f"({count / len(rewards):.0%}) at step {step}: {what}. Return a finite number, or None "
                               "for a completion it cannot judge (shown once)")  # fmt: skip
        return rewards

    checked.__name__ = name
    return checked


def reward_error_line(error: BaseException) -> str | None:
    """`stapo-train`'s line for an exception a reward function raised, with where (outside stapo_trl); else `None`."""
    if (note := next((n for n in getattr(error, "__notes__", []) if n.startswith(REWARD_NOTE)), None)) is None:
        return None
    if (message := (str(error).splitlines() or [""])[0]).startswith("Reward function "):  # checked_reward's own
        return message
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f"{os.sep}stapo_trl{os.sep}" not in f.filename]
    where = f" ({frames[-1].filename}:{frames[-1].lineno}, in {frames[-1].name})" if frames else ""
    return f"reward function{note.removeprefix(REWARD_NOTE)[:-1]} raised {type(error).__name__}: {message}{where}"


def resolve_reward_names(reward_funcs: Any) -> Any:
    """`reward_funcs` with each [`REWARDS`] name or dotted path resolved and each function [`checked_reward`]; a Hub
    id (with "/") or folder stays as in TRL, another string raises [`get_reward_funcs`]'s `ValueError`."""
    import torch

    if isinstance(reward_funcs, list):
        return [resolve_reward_names(func) for func in reward_funcs]
    if isinstance(reward_funcs, str) and "/" not in reward_funcs and not os.path.isdir(reward_funcs):
        reward_funcs = get_reward_funcs([reward_funcs])[0]
    plain = not callable(reward_funcs) or isinstance(reward_funcs, torch.nn.Module)  # None, a Hub id, a reward model
    return reward_funcs if plain else checked_reward(reward_funcs)


def get_reward_funcs(names: Sequence[str] | str) -> list[Callable[..., list]]:
    """Reward names (a list, or one comma-separated string) as functions: [`REWARDS`] keys or function names, or
    dotted paths `pkg.module.function` importable from `sys.path` or the current folder. Raises `ValueError` (listing
    `sorted(REWARDS)`) for no name, an unknown name, or a path that does not import to a callable."""
    names = names.split(",") if isinstance(names, str) else names
    if not names or not any(str(name).strip() for name in names):
        raise ValueError(f"reward_funcs={names!r} names no reward: give at least one, one of {sorted(REWARDS)} or "
                         "a dotted path `pkg.module.function` (the paper trains on math_accuracy alone).")  # fmt: skip
    by_name, funcs = REWARDS | {f.__name__: f for f in REWARDS.values()}, []
    for name in (raw.strip() for raw in names):
        if name in by_name:
            funcs.append(by_name[name])
            continue
        if not (module_name := name.rpartition(".")[0]):
            raise ValueError(f"Unknown reward {name!r}. Valid names: {sorted(REWARDS)}, or a dotted path "
                             "`pkg.module.function`.")  # fmt: skip
        if os.getcwd() not in sys.path and importlib.util.find_spec(module_name.split(".")[0]) is None:
            sys.path.append(os.getcwd())  # as `python script.py` finds a module in the current folder
        try:
            funcs.append(getattr(importlib.import_module(module_name), name.rpartition(".")[2]))
        except (ImportError, AttributeError) as e:
            raise ValueError(f"Reward {name!r} could not be imported ({e}). Use a dotted path `module.function` "
                             f"importable from the current folder ({os.getcwd()}) or PYTHONPATH, or one of "
                             f"{sorted(REWARDS)}.") from e  # fmt: skip
        if not callable(funcs[-1]):
            raise ValueError(f"Reward {name!r} is not callable. Valid names: {sorted(REWARDS)}.")
    return funcs
