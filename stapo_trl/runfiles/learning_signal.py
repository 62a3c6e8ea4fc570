"""One warning when the first logging steps of a run had nothing to learn from: [`NoLearningSignalCallback`].

GRPO learns from the reward differences inside each prompt's group of completions: a group whose completions all got
the same reward has advantage 0 for every completion, so it adds nothing to the loss. When every group of the first
logging steps is like that (TRL logs `frac_reward_zero_std` = 1), or a reward function gave every completion the same
value, the loss and the gradient norm are 0 at every step and nothing says why. The usual causes are the prompt
format (plain-text prompts skip the chat template; a model asked in a wording it never saw), a reward that never
fires, or a reward reading the wrong column. The callback names what it saw and these causes once, and for a
`builtin:` model the prompt format it was trained on ([`BUILTIN_PROMPT_FORMATS`]).

The product trainers add it in `train()`, on the CLI and in scripts alike; the warning is a `logging` warning of this
module's logger (stderr by default).
"""

from __future__ import annotations

import logging
from typing import Any

from transformers import TrainerCallback

from ..models.names import BUILTIN_PREFIX
from .metrics_log import TRAIN_SUMMARY_KEYS
from .model_card import base_model_name


logger = logging.getLogger(__name__)

_TINY_MATH_FORMAT = (
    "{name} was trained on one prompt format only: a two-digit addition asked as one chat message, "
    "[{'role': 'user', 'content': '47+38\\nPlease reason step by step, and put your final answer within "
    "\\\\boxed{}.'}] (stapo_trl.data.format_prompt('47+38')), answered as '7+8=15, write 5 carry 1; 4+3+1=8; "
    "\\\\boxed{85}'. Plain-text prompts, other wordings or other problems get no correct answer from it"
)
# What each `builtin:` model was trained on: the likeliest cause when one of them never earns a reward.
BUILTIN_PROMPT_FORMATS = {
    "tiny-math": _TINY_MATH_FORMAT + "; its tokenizer only knows the words of that task.",
    "tiny-math-h64": _TINY_MATH_FORMAT + "; its tokenizer only knows the words of that task.",
    "smollm2-135m-math": _TINY_MATH_FORMAT + " (it was SFT-warmed on that format for 20 steps only).",
    "tiny-random": "builtin:tiny-random has random weights: it answers nothing correctly, whatever the prompt. Use "
    "builtin:tiny-math (SFT-warmed) to see learning.",
    "smollm2-135m": "builtin:smollm2-135m is an instruct model (chat messages, with its chat template); as shipped it "
    "solves almost no two-digit addition at temperature 1: builtin:smollm2-135m-math is SFT-warmed on tiny-math.",
    "gemma3-270m": "builtin:gemma3-270m is a base model: its chat template was added and it was never trained on it; "
    "it rarely ends with a \\boxed{} answer.",
}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value else None


class NoLearningSignalCallback(TrainerCallback):
    """Warn once when the first `num_rows` training log rows had no learning signal.

    Two findings, read from each training row (TRL's GRPO metrics; rows without `frac_reward_zero_std` are skipped):

    - every prompt group had zero reward spread in every row (`frac_reward_zero_std` = 1), so every advantage was 0;
    - a reward function gave every completion the same value (`rewards/<name>/std` = 0 in every row, the same
      `rewards/<name>/mean`): it never fired, or always did; or only `None` (TRL logs no mean: NaN or `None`).

    The decision is taken at the `num_rows`-th training row, or when training ends with fewer rows (the end-of-training
    row carries the metrics of the steps since the last logging step). The message names what was seen and the likely
    causes: the prompt format (said precisely for plain-text prompts and for `builtin:` models), the reward function,
    its columns. Main process only.

    Args:
        trainer ([`~trl.GRPOTrainer`]): the trainer (its dataset, model and reward functions name the causes).
        num_rows (`int`, *optional*, defaults to `3`): training log rows to decide on.
    """

    def __init__(self, trainer, num_rows: int = 3):
        self.trainer = trainer
        self.num_rows = num_rows
        self.rows: list[dict[str, Any]] = []
        self.decided = False
        self.message: str | None = None  # the warning given, if any

    def on_train_begin(self, args, state, control, **kwargs):
        self.rows, self.decided = [], False  # a resumed or repeated train() decides on its own first rows

    def on_log(self, args, state, control, logs=None, **kwargs):
        if (
            self.decided
            or not state.is_world_process_zero
            or not logs
            or _number(logs.get("frac_reward_zero_std")) is None
        ):
            return
        self.rows.append({k: v for k, v in logs.items() if k not in TRAIN_SUMMARY_KEYS} | {"step": state.global_step})
        if len(self.rows) >= self.num_rows or "train_runtime" in logs:
            self._decide()

    def on_train_end(self, args, state, control, **kwargs):
        if not self.decided and self.rows and state.is_world_process_zero:
            self._decide()

    def _decide(self) -> None:
        self.decided = True
        rows = self.rows
        all_zero_spread = all(_number(r.get("frac_reward_zero_std")) == 1.0 for r in rows)
        constant = {}  # reward name -> the one value it gave ("None": TRL logged no mean, it returned only None)
        for name in getattr(self.trainer, "reward_func_names", []):
            means = [_number(r.get(f"rewards/{name}/mean")) for r in rows]
            stds = [_number(r.get(f"rewards/{name}/std")) for r in rows]
            if None not in means and all(s == 0.0 for s in stds) and len(set(means)) == 1:
                constant[name] = f"{means[0]:g}"
            elif all(f"rewards/{name}/mean" in r and m is None for r, m in zip(rows, means)):
                constant[name] = "None"
        if not all_zero_spread and not constant:
            return
        self.message = self._message(rows, all_zero_spread, constant)
        logger.warning(self.message)

    def _message(self, rows: list[dict[str, Any]], all_zero_spread: bool, constant: dict[str, str]) -> str:
        steps = f"step {rows[0]['step']}" if len(rows) == 1 else f"steps {rows[0]['step']}-{rows[-1]['step']}"
        where = (
            f"the first {len(rows)} logging steps ({steps})" if len(rows) > 1 else f"the first logging step ({steps})"
        )
        values = ", ".join(f"{name} gave {value}" for name, value in constant.items())
        if all_zero_spread or set(constant) == set(self.trainer.reward_func_names):
            spread = "no reward function gave two completions different values"
            if all_zero_spread:
                spread = "every prompt group had zero reward spread (frac_reward_zero_std = 1: all completions of a "
                spread += "prompt got the same reward)"
            text = f"No learning signal. In {where}, {spread}, so every advantage was 0 and the loss and gradient "
            text += "were 0: nothing was learned"
            text += f"; the reward functions gave every completion the same value ({values})." if constant else "."
        else:
            text = (
                f"A reward function gave every completion the same value in {where} ({values}): it adds nothing to "
                "the advantages, only the other reward functions are learned from."
            )
        causes = [self._prompt_cause(), self._reward_cause(constant), self._column_cause()]
        return f"{text} Likely causes: " + " ".join(f"({i}) {cause}" for i, cause in enumerate(causes, 1))

    def _prompt_cause(self) -> str:
        text = (
            "The prompt format: prompts the model was not trained on (another wording or chat template) get no "
            "correct answer."
        )
        dataset = getattr(self.trainer, "train_dataset", None)
        try:
            first = dataset[0]["prompt"] if dataset is not None else None
        except (KeyError, IndexError, TypeError, NotImplementedError):
            first = None
        if isinstance(first, str) and getattr(self.trainer.processing_class, "chat_template", None):
            text += (
                " Your prompts are plain text, so TRL does not apply the model's chat template; a chat model expects "
                "[{'role': 'user', 'content': ...}] messages."
            )
        model_path = getattr(getattr(self.trainer.model, "config", None), "_name_or_path", None)
        name = base_model_name(model_path).removeprefix(BUILTIN_PREFIX) if model_path else None
        if name in BUILTIN_PROMPT_FORMATS:
            text += " " + BUILTIN_PROMPT_FORMATS[name].replace("{name}", BUILTIN_PREFIX + name)
        return text

    @staticmethod
    def _reward_cause(constant: dict[str, str]) -> str:
        names = ", ".join(constant) if constant else "the reward function"
        return (
            f"The reward: check that {names} can give different values, by calling it on a few completions of your "
            "own (a right and a wrong one); a task too hard for the model at first (every completion wrong) looks "
            "the same."
        )

    def _column_cause(self) -> str:
        dataset = getattr(self.trainer, "train_dataset", None)
        columns = [c for c in (getattr(dataset, "column_names", None) or []) if c != "prompt"]
        passed = f" (here: {', '.join(columns)})" if columns else ""
        return (
            "The columns: TRL passes every dataset column but `prompt` to the reward functions by name"
            f"{passed}; check that the one your reward reads (e.g. `solution`) holds the answers of the same rows."
        )
