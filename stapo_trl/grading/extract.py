r"""Box extraction: the LAST complete `\boxed{...}` / `\fbox{...}` of a completion (STAPO Sec. 4.1: the final
answer is in `\boxed{}`). Standard library only."""

from __future__ import annotations

import re


_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def _match_braces(text: str, start: int) -> int | None:
    """Index just past the `}` closing the `{` at `text[start]`, or `None` when unbalanced."""
    depth = 0
    i = start
    while i < len(text):
        c = text[i]
        if c == "\\":  # skip escaped characters such as \{ and \}
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def find_boxes(text: str) -> list[tuple[str | None, int, int]]:
    """All `\\boxed`/`\\fbox` occurrences as (content or None when unterminated, start, end)."""
    boxes = []
    for m in _BOX_RE.finditer(text):
        i = m.end()
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == "{":
            end = _match_braces(text, i)
            boxes.append((None if end is None else text[i + 1 : end - 1], m.start(), end or len(text)))
        elif i > m.end() and i < len(text):  # brace-less form: "\boxed 5"
            tok = re.match(r"[^\s$]+", text[i:])
            boxes.append((tok.group(0), m.start(), i + tok.end()) if tok else (None, m.start(), len(text)))
        else:
            boxes.append((None, m.start(), len(text)))
    return boxes


def extract_boxed_answer(text: str | None) -> str | None:
    r"""Content of the LAST `\boxed{...}` or `\fbox{...}` of `text` (nested braces handled).

    Args:
        text (`str` or `None`):
            A completion or a gold answer.

    Returns:
        `str` or `None`: the content between the braces, stripped; `None` when there is no box, when the last
        box is unterminated (a truncated generation: an earlier box does not count then), or when it is empty.

    Example:
        >>> extract_boxed_answer(r"so \boxed{1} no, \boxed{\frac{1}{3}}.")
        '\\frac{1}{3}'
    """
    if not text:
        return None
    boxes = find_boxes(text)
    if not boxes or boxes[-1][0] is None:
        return None
    content = boxes[-1][0].strip()
    return content or None


def _last_boxes(text: str, k: int) -> list[str] | None:
    """Contents of the last `k` boxes when all are complete, else None."""
    boxes = find_boxes(text)
    if len(boxes) < k or any(b[0] is None for b in boxes[-k:]):
        return None
    return [b[0].strip() for b in boxes[-k:]]
