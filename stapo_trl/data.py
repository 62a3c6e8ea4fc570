"""Prompt datasets: the built-in tiny-math task and Hub / local files, mapped to the two columns TRL's `GRPOTrainer`
and this package's rewards read, `prompt` (`[{"role": "user", "content": problem + "\\n" + instruction}]`,
[`format_prompt`]) and `solution` (the gold answer as a string, e.g. `"85"`), plus a file's or Hub dataset's other
columns, unchanged (TRL passes every column to the reward functions by name).

The built-in task (`builtin:tiny-math`) is two-digit addition written out column by column, small enough for a
140k-parameter model on a CPU to learn in seconds while keeping the paper's output format (a final `\\boxed{}`):

    problem:    47+38
    completion: 7+8=15, write 5 carry 1; 4+3+1=8; \\boxed{85}
    solution:   85
"""

from __future__ import annotations

import functools
import hashlib
import logging
import operator
import os
import random
import re
from collections.abc import Callable
from typing import Any

import datasets

from .checks import missing_column_message
from .run_files import json_lines


logger = logging.getLogger(__name__)


# The paper's prompt suffix (STAPO Sec. 4.1): step-by-step reasoning, final answer in \boxed{}.
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def format_prompt(problem: str, instruction: str | None = INSTRUCTION) -> list[dict[str, str]]:
    """One user turn: the problem followed by the instruction (None or "" = no instruction); training and evaluation
    prompts alike, so both see the same format."""
    content = problem if not instruction else f"{problem}\n{instruction}"
    return [{"role": "user", "content": content}]


# DAPO-Math-17k (and its deduplicated copies) wraps every problem in its own answer-format instruction, asking for a
# last line "Answer: $Answer", which contradicts the paper's \boxed{} suffix. Its fixed head and tail:
_DAPO_INSTRUCTION_HEAD = re.compile(
    r"^\s*Solve the following math problem step by step\. The last line of your response should be of the form "
    r"Answer: \$Answer \(without quotes\) where \$Answer is the answer to the problem\.\s*"
)
_DAPO_INSTRUCTION_TAIL = re.compile(r'\s*Remember to put your answer on its own line after "Answer:"\.?\s*$')


def remove_dapo_instruction(problem: str) -> str:
    """The bare problem of a DAPO-Math-17k prompt: its "Answer: $Answer" head and tail removed; unchanged otherwise.

    `remove_dapo_instruction('Solve the following math problem step by step. The last line of your response should be
    of the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\\n\\nWhat is 1+1?\\n\\n
    Remember to put your answer on its own line after "Answer:".') == "What is 1+1?"`
    """
    return _DAPO_INSTRUCTION_TAIL.sub("", _DAPO_INSTRUCTION_HEAD.sub("", problem, count=1), count=1)


def filter_long_prompts(
    dataset: datasets.Dataset,
    tokenizer,
    max_prompt_tokens: int,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> datasets.Dataset:
    """Drop the rows whose prompt, rendered with the chat template and the generation prompt, exceeds a token budget
    (the paper caps prompts at 1,024 tokens, veRL's `filter_overlong_prompts`; TRL 1.x no longer truncates prompts).

    Args:
        dataset ([`~datasets.Dataset`]): with a conversational `prompt` column (as [`load_prompt_dataset`] returns).
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): the policy's tokenizer, with a chat template.
        max_prompt_tokens (`int`): the largest prompt length kept, in tokens.
        chat_template_kwargs (`dict`, *optional*): extra `apply_chat_template` arguments, as in training.

    Returns:
        [`~datasets.Dataset`]: the rows with at most `max_prompt_tokens` prompt tokens.
    """
    if max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens={max_prompt_tokens!r} must be a positive number of tokens.")

    def short_enough(batch: dict[str, list]) -> list[bool]:
        kwargs = {
            "tokenize": True,
            "add_generation_prompt": True,
            "return_dict": False,
            **(chat_template_kwargs or {}),
        }
        return [len(row) <= max_prompt_tokens for row in tokenizer.apply_chat_template(batch["prompt"], **kwargs)]

    kept = dataset.filter(short_enough, batched=True, desc=f"Dropping prompts longer than {max_prompt_tokens} tokens")
    logger.info("max_prompt_tokens=%d: kept %d of %d prompts.", max_prompt_tokens, len(kept), len(dataset))
    return kept


# -- The built-in tiny-math task ---------------------------------------------------------------------------------

# Operands are two-digit numbers, so there are 90 * 90 = 8,100 ordered problems; the default split uses them all.
_OPERANDS = range(10, 100)
NUM_TINY_MATH_PROBLEMS = len(_OPERANDS) ** 2


def tiny_math_problem(a: int, b: int) -> str:
    """Raw problem text of the tiny-math task, e.g. `"47+38"`."""
    return f"{a}+{b}"


def tiny_math_completion(a: int, b: int) -> str:
    """The worked column addition of `a` and `b` (`int`s in [10, 99]), ending in the boxed sum, as a `str` (no
    end-of-sequence token). The format is the same for every problem (`carry 0` included), so a tiny model learns it
    quickly: `tiny_math_completion(47, 38) == "7+8=15, write 5 carry 1; 4+3+1=8; \\boxed{85}"` and
    `tiny_math_completion(21, 34) == "1+4=5, write 5 carry 0; 2+3+0=5; \\boxed{55}"`.
    """
    units = a % 10 + b % 10
    carry = units // 10
    tens = a // 10 + b // 10 + carry
    units_step = f"{a % 10}+{b % 10}={units}, write {units % 10} carry {carry}"
    tens_step = f"{a // 10}+{b // 10}+{carry}={tens}"
    return f"{units_step}; {tens_step}; \\boxed{{{a + b}}}"


def make_tiny_math_dataset(num_train: int = 7800, num_test: int = 300, seed: int = 0) -> datasets.DatasetDict:
    """The built-in tiny-math task: two-digit addition with the carry written out as worked steps. All 8,100 pairs
    `(a, b)` with `10 <= a, b <= 99` are shuffled with `random.Random(seed)`; the first `num_test` become the test
    split and the next `num_train` the train split, so the splits never share a problem and the same seed always gives
    the same datasets.

    Args:
        num_train (`int`, *optional*, defaults to `7800`): number of training problems.
        num_test (`int`, *optional*, defaults to `300`): number of held-out problems.
        seed (`int`, *optional*, defaults to `0`): seed of the shuffle that picks and orders the problems.

    Returns:
        [`~datasets.DatasetDict`]: Splits `"train"` and `"test"`, each with the columns `prompt` (conversational,
        [`format_prompt`] of the problem), `solution` (the gold sum as a string, e.g. `"85"`), `completion` (the
        worked steps, the SFT target) and `problem` (the raw problem text, e.g. `"47+38"`).

    Raises:
        ValueError: If a size is negative or `num_train + num_test` exceeds the 8,100 distinct problems.
    """
    if num_train < 0 or num_test < 0:
        raise ValueError(f"num_train and num_test must be >= 0, got num_train={num_train}, num_test={num_test}.")
    if num_train + num_test > NUM_TINY_MATH_PROBLEMS:
        raise ValueError(
            f"num_train + num_test = {num_train + num_test} exceeds the {NUM_TINY_MATH_PROBLEMS} distinct two-digit "
            "addition problems; lower num_train or num_test."
        )
    pairs = [(a, b) for a in _OPERANDS for b in _OPERANDS]
    random.Random(seed).shuffle(pairs)
    splits = {"test": pairs[:num_test], "train": pairs[num_test : num_test + num_train]}

    def to_dataset(pairs: list[tuple[int, int]]) -> datasets.Dataset:
        problems = [tiny_math_problem(a, b) for a, b in pairs]
        solutions = [str(a + b) for a, b in pairs]
        columns = {"prompt": [format_prompt(problem) for problem in problems], "solution": solutions}
        columns |= {"completion": [tiny_math_completion(a, b) for a, b in pairs], "problem": problems}
        return datasets.Dataset.from_dict(columns)

    return datasets.DatasetDict({"train": to_dataset(splits["train"]), "test": to_dataset(splits["test"])})


# The single source of truth for `builtin:` dataset names (used by `load_prompt_dataset` and its error message).
BUILTIN_DATASETS: dict[str, Callable[[], datasets.DatasetDict]] = {
    "tiny-math": make_tiny_math_dataset,
}
BUILTIN_PREFIX = "builtin:"

_LOCAL_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


# -- Loading any prompt dataset ----------------------------------------------------------------------------------


def _get_field(example: dict[str, Any], column: str) -> Any:
    """Value of `column` in one row; a dotted name (`reward_model.ground_truth`) walks into nested dicts."""
    return example[column] if column in example else functools.reduce(operator.getitem, column.split("."), example)


def _has_column(features: datasets.Features, column: str) -> bool:
    """Whether `column` exists, a dotted name (`reward_model.ground_truth`) meaning a field of a struct column."""
    feature: Any = features
    for key in [column] if column in features else column.split("."):
        if not isinstance(feature, (dict, datasets.Features)) or key not in feature:
            return False
        feature = feature[key]
    return True


def is_local_dataset_file(dataset_name: str) -> bool:
    """Whether `dataset_name` names a local `.json` / `.jsonl` / `.parquet` / `.csv` file (existing or not)."""
    return os.path.splitext(dataset_name)[1].lower() in _LOCAL_FILE_BUILDERS


def local_data_digest(dataset_name: str) -> str | None:
    """The SHA-256 of a local dataset file's bytes, or of a local dataset folder's files (each file's relative path
    and bytes, in sorted order; hidden files left out); `None` for a `builtin:` task or a Hub id. A file rewritten in
    place under the same name gets another digest."""
    if not os.path.exists(dataset_name) or dataset_name.startswith(BUILTIN_PREFIX):
        return None
    digest = hashlib.sha256()
    if os.path.isfile(dataset_name):
        files = [(os.path.basename(dataset_name), dataset_name)]
    else:
        files = sorted(
            (os.path.relpath(os.path.join(root, name), dataset_name), os.path.join(root, name))
            for root, dirs, names in os.walk(dataset_name)
            for name in names
            if not name.startswith(".")
            and not any(
                part.startswith(".") for part in os.path.relpath(root, dataset_name).split(os.sep) if part != "."
            )
        )
    for relative, path in files:
        digest.update(relative.encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


# The split label of a before/after evaluation that reads training prompts (a local file has one split).
NOT_HELD_OUT = "training file (not held out)"


def evaluation_split(dataset_name: str, test_split: str) -> tuple[str, str | None]:
    """(the label of the prompts `stapo-train`'s before/after evaluation reads, a warning or `None`): a local file has
    one split, so the evaluation reads the first training prompts; the label says so (`eval.json`, the model card) and
    the warning tells the user before the run (`stapo-train` and its dry run)."""
    if not is_local_dataset_file(dataset_name):
        return test_split, None
    return NOT_HELD_OUT, (
        f"dataset_name={dataset_name!r} is one local file, so the before/after evaluation reads its first prompts, "
        "which are also trained on: the accuracy is not held out. For a held-out measure run stapo-eval on another "
        "file (--data-dir), or set eval_before_after: false."
    )


def load_local_dataset_file(path: str) -> datasets.Dataset:
    """A local `.json` / `.jsonl` / `.parquet` / `.csv` file as one [`~datasets.Dataset`].

    Raises:
        FileNotFoundError: If the file does not exist.
        ValueError: one line: "dataset file X is empty" (0 bytes, only whitespace, `[]`: not `datasets`'
            `StopIteration` / `ArrowInvalid`), or "... could not be parsed as json: line N is not a JSON object"
            (counted from 1 as an editor does; the parser's first line for other formats).
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Dataset file {path!r} does not exist.")
    empty = ValueError(f"dataset file {path!r} is empty: it holds no rows.")
    if os.path.getsize(path) == 0:
        raise empty
    builder = _LOCAL_FILE_BUILDERS[os.path.splitext(path)[1].lower()]
    try:
        return datasets.load_dataset(builder, data_files=path, split="train")
    except (StopIteration, ValueError, datasets.exceptions.DatasetGenerationError) as e:
        if isinstance(e, StopIteration) or "corresponds to no data" in str(e):  # no row: whitespace only, or `[]`
            raise empty from e
        bad = (
            next((n for n, row in json_lines(path) if not isinstance(row, dict)), None) if _is_json_lines(path) else 0
        )
        cause = f"line {bad} is not a JSON object" if bad else (str(e.__cause__ or e).strip().splitlines() or [""])[0]
        raise ValueError(f"dataset file {path!r} could not be parsed as {builder}: {cause}") from e


def _local_folder_error(folder: str, error: Exception) -> str:
    """One line for a local dataset folder that `datasets` could not read: the first line of one of its JSON Lines
    files that is not a JSON object (file and line, counted from 1), else the first line of the parser's error."""
    for root, _, names in sorted(os.walk(folder)):
        for name in sorted(names):
            path = os.path.join(root, name)
            if name.lower().endswith((".json", ".jsonl")) and _is_json_lines(path):
                bad = next((n for n, row in json_lines(path) if not isinstance(row, dict)), None)
                if bad is not None:
                    where = os.path.relpath(path, folder)
                    return f"dataset folder {folder!r} could not be read: {where} line {bad} is not a JSON object"
    cause = (str(error.__cause__ or error).strip().splitlines() or [type(error).__name__])[0]
    return f"dataset folder {folder!r} could not be read: {cause}"


def _is_json_lines(path: str) -> bool:
    """Whether a local `.json` / `.jsonl` file holds JSON Lines (a row per non-blank line), not an array."""
    if not path.lower().endswith((".json", ".jsonl")):
        return False
    with open(path, "rb") as f:
        return not f.read(4096).lstrip().startswith(b"[")


def check_prompt_columns(
    dataset: datasets.Dataset, dataset_name: str, prompt_column: str, solution_column: str
) -> list[str]:
    """Check a dataset's prompt and solution columns, and each row's values, before any model is built.

    GRPOTrainer trains on an empty prompt (the instruction alone) and on a row without an answer (the reward of its
    completions is `None`), so those are warnings; a prompt that is not a string or a chat (`null`, a number) is an
    error. Each names the file, the lines (a local JSON Lines file: its line numbers, counted from 1; else the rows,
    counted from 1) and the column, once per kind.

    Returns:
        `list[str]`: one warning line per kind of questionable row (empty prompts, missing answers).

    Raises:
        ValueError: a missing column (naming it, the dataset and its columns; dotted names reach into struct
            columns), or rows whose prompt is neither a string nor a list of chat messages.
    """
    for column in (prompt_column, solution_column):
        if not _has_column(dataset.features, column):
            raise ValueError(
                f"{missing_column_message(column, dataset_name, dataset.column_names)} Set prompt_column / "
                "solution_column (dotted names reach into struct columns, e.g. 'reward_model.ground_truth')."
            )
    bad, empty, unanswered = [], [], []
    for index, row in enumerate(
        dataset.select_columns(list({c.split(".")[0] for c in (prompt_column, solution_column)}))
    ):
        prompt = _get_field(row, prompt_column)
        chat = isinstance(prompt, list) and all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in prompt)
        if not isinstance(prompt, str) and not chat:
            bad.append(index)
        elif not (prompt if isinstance(prompt, str) else "".join(str(m["content"]) for m in prompt)).strip():
            empty.append(index)
        if not _solution_to_str(_get_field(row, solution_column)).strip():
            unanswered.append(index)
    if bad:
        raise ValueError(
            f"{_where(dataset_name, bad)} (column {prompt_column!r}): a prompt must be a string or a list of chat "
            f"messages with 'role' and 'content', got {_get_field(dataset[bad[0]], prompt_column)!r:.100}. Fix or "
            "remove those rows."
        )
    return [
        f"{_where(dataset_name, rows)} (column {column!r}): {what}"
        for rows, column, what in (
            (empty, prompt_column, "empty prompt: trained on, the model sees the instruction alone."),
            (unanswered, solution_column, "no answer: math_accuracy gives their completions no reward (None)."),
        )
        if rows
    ]


def _where(dataset_name: str, indices: list[int]) -> str:
    """`dataset file 'x.jsonl': lines 4, 9` for a JSON Lines file (counted from 1, blank lines too, which `datasets`
    skips), else `dataset 'x': rows 4, 9` (counted from 1); at most 10 listed."""
    numbers, kind = [index + 1 for index in indices], "row"
    if os.path.isfile(dataset_name) and _is_json_lines(dataset_name):
        lines = [number for number, _ in json_lines(dataset_name)]
        numbers, kind = [lines[index] for index in indices], "line"
    shown = ", ".join(map(str, numbers[:10])) + (f" and {len(numbers) - 10} more" if len(numbers) > 10 else "")
    what = "dataset file" if os.path.isfile(dataset_name) else "dataset"
    return f"{what} {dataset_name!r}: {kind}{'s' * (len(numbers) > 1)} {shown}"


def _solution_to_str(value: Any) -> str:
    """Gold answer as a string: integral floats lose the `.0` (AMC23 stores `27.0`), a one-element list is unwrapped,
    longer lists are joined with `", "` (OlympiadBench multi-answer rows), `None` becomes `""` (graders treat an
    unparseable gold as ungradable, never as correct)."""
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (list, tuple)):
        return ", ".join(_solution_to_str(v) for v in value)
    return str(value)


def _to_prompt(value: str | list[dict[str, str]], instruction: str | None) -> list[dict[str, str]]:
    """Conversational prompt from a raw problem string, or from a chat (verl layout: a list of messages), whose last
    user turn gets the instruction appended as [`format_prompt`] would ([`check_prompt_columns`] refuses the rest)."""
    if isinstance(value, str):
        return format_prompt(value, instruction)
    messages = [{"role": m["role"], "content": m["content"]} for m in value]
    user_turns = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if instruction and user_turns:
        last = user_turns[-1]
        messages[last]["content"] = format_prompt(messages[last]["content"], instruction)[0]["content"]
    return messages


def _load_builtin_split(dataset_name: str, split: str) -> datasets.Dataset:
    """One split of a `builtin:<name>` task (columns `problem` and `solution`); raises a `ValueError` on an unknown
    name or split (the known ones listed)."""
    name = dataset_name[len(BUILTIN_PREFIX) :]
    if name not in BUILTIN_DATASETS:
        known = ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_DATASETS)
        raise ValueError(f"Unknown built-in dataset {dataset_name!r}. Known built-in datasets: {known}.")
    splits = BUILTIN_DATASETS[name]()
    if split not in splits:
        raise ValueError(
            f"Built-in dataset {dataset_name!r} has no split {split!r}; available splits: {sorted(splits)}."
        )
    return splits[split]


def load_prompt_dataset(
    dataset_name: str,
    *,
    dataset_config: str | None = None,
    split: str = "train",
    prompt_column: str = "problem",
    solution_column: str = "answer",
    instruction: str | None = INSTRUCTION,
    data_files: str | list[str] | dict[str, Any] | None = None,
    limit: int | None = None,
    strip_dapo_instruction: bool = False,
) -> datasets.Dataset:
    """Load a math dataset as conversational prompts with gold answers, ready for [`~trl.GRPOTrainer`].

    `dataset_name` is a built-in task (`builtin:tiny-math`, splits `"train"` and `"test"`, its own columns); a local
    `.json`, `.jsonl`, `.parquet` or `.csv` file ([`load_local_dataset_file`]; the file is the split); or else goes to
    `datasets.load_dataset(dataset_name, dataset_config, split=split, data_files=...)`: a Hub id such as
    `"HuggingFaceH4/MATH-500"`, a local dataset folder, or a builder name (`"json"`) with `data_files`.

    A prompt cell may be a raw problem string or already a chat (a list of `{"role", "content"}` messages, as in
    verl parquet files); the instruction is appended to its last user turn either way. Column names may be dotted
    to reach into struct columns (`reward_model.ground_truth`). The rows are checked ([`check_prompt_columns`]): a
    warning line per kind of questionable row.

    Args:
        dataset_name (`str`): `builtin:<name>`, a path to a local file, or a name for `datasets.load_dataset`.
        dataset_config (`str`, *optional*): dataset configuration (subset) name, for Hub datasets.
        split (`str`, *optional*, defaults to `"train"`): split to load.
        prompt_column (`str`, *optional*, defaults to `"problem"`): column with the problem text (or the chat).
        solution_column (`str`, *optional*, defaults to `"answer"`): column with the gold answer; converted to `str`
            (integral floats such as `27.0` become `"27"`).
        instruction (`str`, *optional*, defaults to `INSTRUCTION`): appended to the problem on a new line; `None` or
            `""` appends nothing.
        data_files (`str`, `list[str]` or `dict`, *optional*): for `datasets.load_dataset` (not builtin, not a file).
        limit (`int`, *optional*): keep only the first `limit` rows.
        strip_dapo_instruction (`bool`, *optional*, defaults to `False`): remove DAPO-Math-17k's own answer-format
            instruction from every problem ([`remove_dapo_instruction`]) before appending `instruction`; ignored for
            `builtin:` datasets.

    Returns:
        [`~datasets.Dataset`]: Columns `prompt` (`list[dict[str, str]]`, conversational) and `solution` (`str`), then
        every other column of the file or Hub dataset, unchanged (TRL passes each one to the reward functions by
        name); a `builtin:` task has only `prompt` and `solution`.

    Raises:
        ValueError: an unknown `builtin:` name or split (the known ones listed), a file that does not parse, a column
            missing or a prompt that is neither text nor chat ([`check_prompt_columns`]).
        FileNotFoundError: If `dataset_name` names a local file that does not exist.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}.")

    builtin = dataset_name.startswith(BUILTIN_PREFIX)
    if builtin:
        dataset = _load_builtin_split(dataset_name, split)
        prompt_column, solution_column = "problem", "solution"
    elif is_local_dataset_file(dataset_name):
        dataset = load_local_dataset_file(dataset_name)
    else:
        try:
            dataset = datasets.load_dataset(dataset_name, dataset_config, split=split, data_files=data_files)
        except (ValueError, datasets.exceptions.DatasetGenerationError) as e:
            if not os.path.isdir(dataset_name):
                raise
            raise ValueError(_local_folder_error(dataset_name, e)) from e
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    for warning in check_prompt_columns(dataset, dataset_name, prompt_column, solution_column):
        logger.warning(warning)
    strip = strip_dapo_instruction and not builtin
    return _to_prompts_and_solutions(dataset, prompt_column, solution_column, instruction, strip, keep=not builtin)


def _to_prompts_and_solutions(dataset: datasets.Dataset, prompt_column: str, solution_column: str,
                              instruction: str | None, strip: bool, keep: bool = True):  # fmt: skip
    """The `prompt` (chat, instruction appended) and `solution` (`str`) columns, written over any input column of
    that name; `keep`: every other input column stays (TRL passes each column to the reward functions, e.g. a
    `difficulty` column to a reward with a `difficulty` argument), else only the two remain; `strip`: remove DAPO's
    answer-format instruction from the problems first."""

    def _strip(value: Any) -> Any:
        if not strip:
            return value
        if isinstance(value, str):
            return remove_dapo_instruction(value)
        return [{**m, "content": remove_dapo_instruction(m["content"])} if m["role"] == "user" else m for m in value]

    def to_prompt_solution(example: dict[str, Any]) -> dict[str, Any]:
        prompt = _to_prompt(_strip(_get_field(example, prompt_column)), instruction)
        return {"prompt": prompt, "solution": _solution_to_str(_get_field(example, solution_column))}

    # Both output columns are rebuilt from scratch (an input `prompt` or `solution` column is read before it is
    # replaced, and removed first so that its old type does not constrain the new values).
    overwritten = [c for c in dataset.column_names if not keep or c in ("prompt", "solution")]
    return dataset.map(to_prompt_solution, remove_columns=overwritten)
