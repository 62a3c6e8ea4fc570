"""Prompt datasets: the built-in tiny-math task and Hub / local files, mapped to conversational prompts."""

from __future__ import annotations

# The paper's prompt suffix (STAPO Sec. 4.1): step-by-step reasoning, final answer in \boxed{}.
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def format_prompt(problem: str, instruction: str | None = INSTRUCTION) -> list[dict[str, str]]:
    """One user turn: the problem followed by the instruction (None or "" = no instruction).

    Used for training prompts and evaluation prompts alike, so both see the same format.
    """
    content = problem if not instruction else f"{problem}\n{instruction}"
    return [{"role": "user", "content": content}]
