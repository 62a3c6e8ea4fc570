r"""Prompt datasets in the columns `GRPOTrainer` and the rewards read, `prompt` ([`format_prompt`]) and `solution`,
beside the source's own (TRL passes each to the reward functions by name); `builtin:tiny-math` is two-digit addition
worked column by column: `47+38` -> `7+8=15, write 5 carry 1; 4+3+1=8; \boxed{85}`. `datasets` (slow to import) is
imported by the functions that use it."""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import random
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any


logger = logging.getLogger(__name__)

# The paper's prompt suffix (STAPO Sec. 4.1): step-by-step reasoning, final answer in \boxed{}.
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def format_prompt(problem: str, instruction: str | None = INSTRUCTION) -> list[dict[str, str]]:
    """One user turn: `problem`, then `instruction` on a new line unless it is None or "" or the problem already ends
    with it (whitespace aside). Training and evaluation prompts alike."""
    if instruction and not "".join(str(problem).split()).endswith("".join(instruction.split())):
        problem = f"{problem}\n{instruction}"
    return [{"role": "user", "content": problem}]


# DAPO-Math-17k wraps every problem in its own instruction ("Answer: $Answer" on the last line), against \boxed{}.
_DAPO_HEAD = re.compile(
    r"^\s*Solve the following math problem step by step\. The last line of your response should be of the form "
    r"Answer: \$Answer \(without quotes\) where \$Answer is the answer to the problem\.\s*"
)
_DAPO_TAIL = re.compile(r'\s*Remember to put your answer on its own line after "Answer:"\.?\s*$')


def remove_dapo_instruction(problem: str) -> str:
    """`problem` without DAPO-Math-17k's answer-format head and tail (unchanged when it has none)."""
    return _DAPO_TAIL.sub("", _DAPO_HEAD.sub("", problem, count=1), count=1)


def filter_long_prompts(dataset, tokenizer, max_prompt_tokens: int, chat_template_kwargs: dict | None = None):
    """The rows of `dataset` (a conversational `prompt` column) whose prompt, rendered by the tokenizer's chat template
    with the generation prompt, has at most `max_prompt_tokens` tokens (the paper caps prompts at 1,024)."""
    kwargs = {"tokenize": True, "add_generation_prompt": True, "return_dict": False, **(chat_template_kwargs or {})}

    def short_enough(batch: dict[str, list]) -> list[bool]:
        return [len(ids) <= max_prompt_tokens for ids in tokenizer.apply_chat_template(batch["prompt"], **kwargs)]

    kept = dataset.filter(short_enough, batched=True, desc=f"Dropping prompts longer than {max_prompt_tokens} tokens")
    logger.info("max_prompt_tokens=%d: kept %d of %d prompts.", max_prompt_tokens, len(kept), len(dataset))
    return kept


def tiny_math_completion(a: int, b: int) -> str:
    r"""The worked column addition of two-digit `a` and `b`, ending in the boxed sum, in one format for every problem
    (`carry 0` included): `tiny_math_completion(21, 34) == "1+4=5, write 5 carry 0; 2+3+0=5; \\boxed{55}"`."""
    units = a % 10 + b % 10
    carry = units // 10
    tens = a // 10 + b // 10 + carry
    units_step = f"{a % 10}+{b % 10}={units}, write {units % 10} carry {carry}"
    tens_step = f"{a // 10}+{b // 10}+{carry}={tens}"
    return f"{units_step}; {tens_step}; \\boxed{{{a + b}}}"


def make_tiny_math_dataset(num_train: int = 7800, num_test: int = 300, seed: int = 0):
    """The built-in tiny-math task, a [`~datasets.DatasetDict`]: the 8,100 pairs `10 <= a, b <= 99` shuffled by
    `random.Random(seed)`, the first `num_test` the `"test"` split, the next `num_train` the `"train"` split. Columns:
    `prompt` ([`format_prompt`]), `solution` (e.g. `"85"`), `completion` (the worked steps, the SFT target), `problem`
    (e.g. `"47+38"`). Raises `ValueError` for a negative size or more than 8,100 problems in all."""
    import datasets

    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    if num_train < 0 or num_test < 0 or num_train + num_test > len(pairs):
        raise ValueError(
            f"num_train={num_train} and num_test={num_test} must be >= 0 and together at most the {len(pairs)} "
            "distinct two-digit addition problems."
        )
    random.Random(seed).shuffle(pairs)

    def split(pairs: list[tuple[int, int]]):
        problems = [f"{a}+{b}" for a, b in pairs]
        columns = {"prompt": [format_prompt(p) for p in problems], "solution": [str(a + b) for a, b in pairs]}
        columns |= {"completion": [tiny_math_completion(a, b) for a, b in pairs], "problem": problems}
        return datasets.Dataset.from_dict(columns)

    return datasets.DatasetDict(
        {"train": split(pairs[num_test : num_test + num_train]), "test": split(pairs[:num_test])}
    )


BUILTIN_DATASETS = {"tiny-math": make_tiny_math_dataset}  # `builtin:<name>` dataset names
BUILTIN_PREFIX = "builtin:"
_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def is_local_dataset_file(dataset_name: str) -> bool:
    """Whether `dataset_name` names a local `.json`, `.jsonl`, `.parquet` or `.csv` file (existing or not)."""
    return os.path.splitext(dataset_name)[1].lower() in _FILE_BUILDERS


def local_data_digest(dataset_name: str) -> str | None:
    """The SHA-256 of a local dataset file's bytes, or of a folder's files (each one's relative path and bytes, in
    sorted order, hidden ones left out); `None` for a `builtin:` task or a Hub id."""
    if dataset_name.startswith(BUILTIN_PREFIX) or not os.path.exists(dataset_name):
        return None
    root = Path(dataset_name)
    if root.is_file():
        files = {root.name: root}
    else:
        relative = {str(p.relative_to(root)): p for p in root.rglob("*") if p.is_file()}
        files = {name: p for name, p in relative.items() if not any(part.startswith(".") for part in Path(name).parts)}
    digest = hashlib.sha256()
    for relative in sorted(files):
        digest.update(relative.encode() + b"\0")
        with open(files[relative], "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


# The split label of a before/after evaluation that reads training prompts (a local file has one split).
NOT_HELD_OUT = "training file (not held out)"


def evaluation_split(dataset_name: str, test_split: str) -> tuple[str, str | None]:
    """(the split label of `stapo-train`'s before/after evaluation, a warning or `None`): a local file has one split,
    so the evaluation reads its first prompts, which are trained on too."""
    if not is_local_dataset_file(dataset_name):
        return test_split, None
    return NOT_HELD_OUT, (
        f"dataset_name={dataset_name!r} is one local file, so the before/after evaluation reads its first prompts, "
        "which are also trained on: the accuracy is not held out. For a held-out measure run stapo-eval on another "
        "file (--data-dir), or set eval_before_after: false."
    )


def load_local_dataset_file(path: str):
    """A local `.json`, `.jsonl`, `.parquet` or `.csv` file as one [`~datasets.Dataset`] (`datasets.load_dataset`).
    Raises `FileNotFoundError` for a missing file, a one-line `ValueError` for one with no rows or that does not parse."""
    import datasets

    if not os.path.isfile(path):
        raise FileNotFoundError(f"Dataset file {path!r} does not exist.")
    empty = ValueError(f"dataset file {path!r} is empty: it holds no rows.")
    if os.path.getsize(path) == 0:
        raise empty
    builder = _FILE_BUILDERS[os.path.splitext(path)[1].lower()]
    try:
        return datasets.load_dataset(builder, data_files=path, split="train")
    except (StopIteration, ValueError, datasets.exceptions.DatasetGenerationError) as e:
        if isinstance(e, StopIteration) or "corresponds to no data" in str(e):  # whitespace only, or `[]`
            raise empty from e
        raise ValueError(f"dataset file {path!r} could not be parsed as {builder}: {_read_error(path, e)}") from e


def _read_error(root: str, error: Exception) -> str:
    """Why a file or folder did not parse, in one line: the first line of a JSON Lines file that is not a JSON object
    (counted from 1, as an editor counts; in a folder, after the file's name), else the parser's first line."""
    paths = [root] if os.path.isfile(root) else sorted(str(p) for p in Path(root).rglob("*") if p.is_file())
    for path in paths:
        if bad := next((n for n, row in _json_lines(path) if not isinstance(row, dict)), None):
            return f"{'' if path == root else os.path.relpath(path, root) + ' '}line {bad} is not a JSON object"
    return (str(error.__cause__ or error).strip().splitlines() or [type(error).__name__])[0]


def _json_lines(path: str) -> list[tuple[int, Any]]:
    """(number from 1, JSON value or `None`) of each non-blank line of a JSON Lines file, a `.json` or `.jsonl` file
    that is not one array; `[]` for another file."""
    from .run_folder.logs import json_lines  # torch: not for the commands' --help

    if not path.lower().endswith((".json", ".jsonl")):
        return []
    with open(path, "rb") as f:
        array = f.read(4096).lstrip().startswith(b"[")
    return [] if array else list(json_lines(path))


def check_prompt_columns(dataset, dataset_name: str, prompt_column: str, solution_column: str) -> list[str]:
    """Warnings, one line per kind, for rows GRPOTrainer trains on anyway (empty prompts, no answer), naming the rows
    (a JSON Lines file's lines) and the column. Raises `ValueError` for a missing column (dotted names reach into
    struct columns) or a prompt that is neither a string nor a list of chat messages."""
    prompts, solutions = _columns(dataset, dataset_name, prompt_column, solution_column)
    bad, empty, unanswered = [], [], []
    for index, (prompt, solution) in enumerate(zip(prompts, solutions)):
        chat = isinstance(prompt, list) and all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in prompt)
        if not isinstance(prompt, str) and not chat:
            bad.append(index)
        elif not (prompt if isinstance(prompt, str) else "".join(str(m["content"]) for m in prompt)).strip():
            empty.append(index)
        if not _solution_to_str(solution).strip():
            unanswered.append(index)
    if bad:
        raise ValueError(
            f"{_where(dataset_name, bad)} (column {prompt_column!r}): a prompt must be a string or a list of chat "
            f"messages with 'role' and 'content', got {prompts[bad[0]]!r:.100}. Fix or remove those rows."
        )
    return [
        f"{_where(dataset_name, rows)} (column {column!r}): {what}"
        for rows, column, what in (
            (empty, prompt_column, "empty prompt: trained on, the model sees the instruction alone."),
            (unanswered, solution_column, "no answer: math_accuracy gives their completions no reward (None)."),
        )
        if rows
    ]


def _columns(dataset, dataset_name: str, *columns: str) -> list:
    """The values of `columns`, a dotted name reaching into struct columns (`reward_model.ground_truth`); `ValueError`
    naming a missing one, the dataset and its columns."""
    flat, values = dataset.flatten(), []
    for column in columns:
        if column not in (source := dataset if column in dataset.column_names else flat).column_names:
            raise ValueError(
                f"{missing_column_message(column, dataset_name, dataset.column_names)} Set prompt_column / "
                "solution_column (dotted names reach into struct columns, e.g. 'reward_model.ground_truth')."
            )
        values.append(source[column])
    return values


def _where(dataset_name: str, indices: list[int]) -> str:
    """`dataset file 'x.jsonl': lines 4, 9` for a JSON Lines file (its lines, counted from 1, blank ones too), else
    `dataset 'x': rows 4, 9` (counted from 1); at most 10 listed."""
    numbers, kind = [index + 1 for index in indices], "row"
    if os.path.isfile(dataset_name) and (lines := _json_lines(dataset_name)):
        numbers, kind = [lines[index][0] for index in indices], "line"
    shown = ", ".join(map(str, numbers[:10])) + (f" and {len(numbers) - 10} more" if len(numbers) > 10 else "")
    what = "dataset file" if os.path.isfile(dataset_name) else "dataset"
    return f"{what} {dataset_name!r}: {kind}{'s' * (len(numbers) > 1)} {shown}"


def _solution_to_str(value: Any) -> str:
    """A gold answer as a string: `27.0` -> `"27"`, a list joined with `", "`, `None` -> `""` (never graded correct)."""
    if isinstance(value, (list, tuple)):
        return ", ".join(map(_solution_to_str, value))
    return "" if value is None else str(int(value) if isinstance(value, float) and value.is_integer() else value)


def _to_prompt(value: str | list[dict], instruction: str | None, strip_dapo: bool) -> list[dict[str, str]]:
    """A chat from a problem or a chat (verl's layout), the instruction added to its last user turn ([`format_prompt`]),
    DAPO's removed from its user turns first with `strip_dapo`."""
    if isinstance(value, str):
        return format_prompt(remove_dapo_instruction(value) if strip_dapo else value, instruction)
    messages = [{"role": m["role"], "content": m["content"]} for m in value]
    for message in messages if strip_dapo else []:
        if message["role"] == "user":
            message["content"] = remove_dapo_instruction(message["content"])
    if users := [i for i, m in enumerate(messages) if m["role"] == "user"]:
        messages[users[-1]] = format_prompt(messages[users[-1]]["content"], instruction)[0]
    return messages


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
):
    """A math dataset as a [`~datasets.Dataset`] for [`~trl.GRPOTrainer`]: the source's other columns, then `prompt`
    (`list[dict[str, str]]`) and `solution` (`str`, `27.0` -> `"27"`); a `builtin:` task has only these two.

    `dataset_name` is `builtin:<name>` (splits `"train"`, `"test"`), a local `.json`, `.jsonl`, `.parquet` or `.csv`
    file (the file is the split), or else goes to `datasets.load_dataset` (a Hub id, a local folder). A prompt cell is
    a problem or a chat (verl's list of messages): its last user turn gets `instruction` ([`format_prompt`]), DAPO's
    own removed first with `strip_dapo_instruction`. Dotted column names reach into struct columns. Questionable rows
    are logged ([`check_prompt_columns`]).

    Raises:
        ValueError: an unknown `builtin:` name or split, a file or folder that does not parse, a missing column, or a
            prompt that is neither text nor chat.
        FileNotFoundError: a local file that does not exist.
    """
    import datasets

    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}.")
    builtin = dataset_name.startswith(BUILTIN_PREFIX)
    if builtin:
        splits = BUILTIN_DATASETS.get(dataset_name.removeprefix(BUILTIN_PREFIX), dict)()
        if split not in splits:
            known = "; ".join(
                f"{BUILTIN_PREFIX}{n} (splits {', '.join(make())})" for n, make in BUILTIN_DATASETS.items()
            )
            raise ValueError(
                f"No built-in dataset {dataset_name!r} with a split {split!r}; built-in datasets: {known}."
            )
        dataset, prompt_column, solution_column = splits[split], "problem", "solution"
    elif is_local_dataset_file(dataset_name):
        dataset = load_local_dataset_file(dataset_name)
    else:
        try:
            dataset = datasets.load_dataset(dataset_name, dataset_config, split=split, data_files=data_files)
        except (ValueError, datasets.exceptions.DatasetGenerationError) as e:
            if not os.path.isdir(dataset_name):
                raise
            raise ValueError(
                f"dataset folder {dataset_name!r} could not be read: {_read_error(dataset_name, e)}"
            ) from e
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    for warning in check_prompt_columns(dataset, dataset_name, prompt_column, solution_column):
        logger.warning(warning)
    prompts, solutions = _columns(dataset, dataset_name, prompt_column, solution_column)
    strip = strip_dapo_instruction and not builtin
    columns = {"prompt": [_to_prompt(p, instruction, strip) for p in prompts]}
    columns["solution"] = [_solution_to_str(s) for s in solutions]
    if not (kept := [c for c in dataset.column_names if c not in columns and not builtin]):
        return datasets.Dataset.from_dict(columns)
    dataset = dataset.select_columns(kept)
    return dataset.add_column("prompt", columns["prompt"]).add_column("solution", columns["solution"])


# -- the prompt-token budget: prompts longer than the model's positions minus the generation budget are dropped
_POSITION_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def model_max_positions(config) -> int | None:
    """The positions a model attends over: a vLLM engine's `max_model_len`, else the first positive
    `max_position_embeddings` / `n_positions` / `max_sequence_length` / `seq_length` of a config (object or dict),
    a model (its `.config`) or a folder (its `config.json`); `None` when unknown."""
    engine = getattr(getattr(config, "llm", config), "llm_engine", None)
    if isinstance(length := getattr(getattr(engine, "model_config", None), "max_model_len", None), int):
        return length
    if isinstance(config, (str, os.PathLike)):
        try:
            with open(os.path.join(config, "config.json"), encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError):
            return None
    config = getattr(config, "model", config)  # an evaluation generator holds its model
    config = getattr(config, "config", config)
    for name in _POSITION_FIELDS:
        value = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def prompt_token_budget(max_positions: int | None, max_new_tokens: int, max_prompt_tokens: int | None = None):
    """The longest prompt (tokens) that leaves `max_new_tokens` positions: `min(max_positions - max_new_tokens,
    max_prompt_tokens)` over the known terms, `None` when neither is known.

    Raises:
        ValueError: `max_new_tokens >= max_positions`, or `max_prompt_tokens < 1`.
    """
    if max_prompt_tokens is not None and max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens={max_prompt_tokens!r} must be a positive number of tokens.")
    budgets = [] if max_prompt_tokens is None else [max_prompt_tokens]
    if max_positions is not None:
        if max_new_tokens >= max_positions:
            raise ValueError(
                f"max_new_tokens={max_new_tokens} leaves no room for a prompt: the model has {max_positions} "
                f"positions (prompt + completion); give a budget below {max_positions}."
            )
        budgets.append(max_positions - max_new_tokens)
    return min(budgets) if budgets else None


def config_max_positions(name_or_path: str, revision: str | None = None) -> int | None:
    """[`model_max_positions`] of a model argument without loading it: a local folder, a built `builtin:` model or a
    Hub id in the local cache; `None` when no `config.json` is here."""
    if name_or_path.startswith("builtin:"):
        from .models.names import builtin_model_dir

        try:
            return model_max_positions(builtin_model_dir(name_or_path))
        except (KeyError, ValueError):
            return None
    if os.path.isdir(os.path.expanduser(name_or_path)):
        return model_max_positions(os.path.expanduser(name_or_path))
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(name_or_path, "config.json", revision=revision)
    except Exception:  # noqa: BLE001 (not a valid repo id: nothing cached)
        return None
    return model_max_positions(os.path.dirname(cached)) if isinstance(cached, str) else None


def report_dropped(total: int, kept: int, budget: int | None, what: str = "prompts") -> None:
    """One warning line when prompts longer than `budget` tokens were dropped.

    Raises:
        ValueError: every prompt was dropped.
    """
    if kept == total:
        return
    if not kept:
        raise ValueError(
            f"All {total} {what} are longer than {budget} tokens: raise max_prompt_tokens, lower the generation "
            "budget, or use a model with more positions."
        )
    logger.warning("Dropped %d of %d %s longer than %d tokens (max_prompt_tokens).", total - kept, total, what, budget)


def keep_short_prompts(lengths: list[int], budget: int | None, what: str = "prompts") -> list[int]:
    """The indices of the prompts of at most `budget` tokens ([`report_dropped`] says what was dropped)."""
    keep = list(range(len(lengths))) if budget is None else [i for i, n in enumerate(lengths) if n <= budget]
    report_dropped(len(lengths), len(keep), budget, what)
    return keep


# -- checks of a run's datasets, before any model: what GRPOTrainer would fail on at its first step ------
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
