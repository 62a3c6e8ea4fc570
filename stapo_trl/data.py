"""Prompt datasets (builtin:tiny-math, local files, Hub ids), their checks before a model, the prompt-token budget."""

from __future__ import annotations

import functools
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

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."  # STAPO Sec. 4.1
BUILTIN_PREFIX = "builtin:"
_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
NOT_HELD_OUT = "training file (not held out)"  # the split label of an evaluation that reads training prompts
remove_dapo_instruction = functools.partial(re.compile(  # DAPO-Math-17k's own "Answer: $Answer", against \boxed{}
    r"^\s*Solve the following math problem step by step\. The last line of your response should be of the form "
    r"Answer: \$Answer \(without quotes\) where \$Answer is the answer to the problem\.\s*"
    r'|\s*Remember to put your answer on its own line after "Answer:"\.?\s*$'
).sub, "")  # fmt: skip
TRL_REWARD_ARGUMENTS = {*"prompts completions completion_ids trainer_state log_extra log_metric environments".split()}
_PASSED_AS = {"prompt": "prompts", "completion": "completions"}  # columns TRL passes under the plural
_MISSING = "Column {!r} not found in dataset {!r}. Available columns: {}."
CHAT_TEMPLATE_FIX = "Give the tokenizer a template (tokenizer.chat_template = '...', then pass processing_class="
CHAT_TEMPLATE_FIX += "tokenizer or save it into the model folder), or pass prompts as plain strings."
CLI_CHAT_TEMPLATE_FIX = "Use a model whose tokenizer has one (builtin:gemma3-270m adds Gemma's), or set "
CLI_CHAT_TEMPLATE_FIX += "tokenizer.chat_template and save_pretrained it into the model folder."
EVAL_CHAT_TEMPLATE_FIX = CLI_CHAT_TEMPLATE_FIX[:-1] + "; or pass --no-chat-template to feed the plain problem text."


def format_prompt(problem: str, instruction: str | None = INSTRUCTION) -> list[dict[str, str]]:
    """One user turn: `problem`, then `instruction` on a new line unless None, "" or already its end (spaces aside)."""
    if instruction and not "".join(str(problem).split()).endswith("".join(instruction.split())):
        problem = f"{problem}\n{instruction}"
    return [{"role": "user", "content": problem}]


def filter_long_prompts(dataset, tokenizer, max_prompt_tokens: int, chat_template_kwargs: dict | None = None):
    """The rows whose chat `prompt`, with the generation prompt, has at most `max_prompt_tokens` tokens."""
    kwargs = {"tokenize": True, "add_generation_prompt": True, "return_dict": False, **(chat_template_kwargs or {})}

    def short_enough(batch: dict[str, list]) -> list[bool]:  # in the fingerprint a resume compares: keep it as is
        return [len(ids) <= max_prompt_tokens for ids in tokenizer.apply_chat_template(batch["prompt"], **kwargs)]

    return dataset.filter(short_enough, batched=True, desc=f"Dropping prompts longer than {max_prompt_tokens} tokens")


def tiny_math_completion(a: int, b: int) -> str:
    r"""The worked column addition: `21, 34` -> `1+4=5, write 5 carry 0; 2+3+0=5; \boxed{55}`."""
    units, carry = a % 10 + b % 10, (a % 10 + b % 10) // 10
    steps = f"{a % 10}+{b % 10}={units}, write {units % 10} carry {carry}; {a // 10}+{b // 10}+{carry}"
    return f"{steps}={(a + b) // 10}; \\boxed{{{a + b}}}"


def make_tiny_math_dataset(num_train: int = 7800, num_test: int = 300, seed: int = 0):
    """The tiny-math [`~datasets.DatasetDict`]: the 8,100 pairs `10 <= a, b <= 99` shuffled by `random.Random(seed)`,
    `num_test` in "test", the next `num_train` in "train"; columns `prompt`, `solution` (`"85"`), `completion` (the
    worked steps), `problem` (`"47+38"`). `ValueError` for a negative size or more than 8,100 in all."""
    import datasets

    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    if num_train < 0 or num_test < 0 or num_train + num_test > len(pairs):
        raise ValueError(f"num_train={num_train} and num_test={num_test} must be >= 0 and add up to at most 8100.")
    random.Random(seed).shuffle(pairs)
    splits = {"train": pairs[num_test : num_test + num_train], "test": pairs[:num_test]}
    return datasets.DatasetDict({
        name: datasets.Dataset.from_dict({
            "prompt": [format_prompt(f"{a}+{b}") for a, b in split], "solution": [str(a + b) for a, b in split],
            "completion": [tiny_math_completion(a, b) for a, b in split], "problem": [f"{a}+{b}" for a, b in split],
        }) for name, split in splits.items()
    })  # fmt: skip


def is_local_dataset_file(dataset_name: str) -> bool:
    return os.path.splitext(dataset_name)[1].lower() in _FILE_BUILDERS


def local_data_digest(dataset_name: str) -> str | None:
    """The SHA-256 of a local file's bytes or a folder's files (path and bytes, hidden ones left out), else `None`."""
    if dataset_name.startswith(BUILTIN_PREFIX) or not os.path.exists(dataset_name):
        return None
    root, digest = Path(dataset_name), hashlib.sha256()
    files = {root.name: root} if root.is_file() else {str(p.relative_to(root)): p for p in root.rglob("*")}
    for name in sorted(n for n, p in files.items() if p.is_file() and (p == root or not re.search(r"(^|/)\.", n))):
        digest.update(name.encode() + b"\0")
        with open(files[name], "rb") as f:
            hashlib.file_digest(f, lambda: digest)
    return digest.hexdigest()


def evaluation_split(dataset_name: str, test_split: str) -> tuple[str, str | None]:
    """(the before/after evaluation's split label, a warning or `None`): a local file's reads training rows."""
    if not is_local_dataset_file(dataset_name):
        return test_split, None
    return NOT_HELD_OUT, (f"dataset_name={dataset_name!r} is one local file, so the before/after evaluation reads its "
                          "first prompts, which are also trained on: the accuracy is not held out. For a held-out "
                          "measure run stapo-eval on another file (--data-dir), or set eval_before_after: "
                          "false.")  # fmt: skip


def load_local_dataset_file(path: str):
    """A local data file as a `Dataset`; `FileNotFoundError`, or `ValueError` for one without rows or not parsing."""
    import datasets

    if not os.path.isfile(path):
        raise FileNotFoundError(f"Dataset file {path!r} does not exist.")
    builder = _FILE_BUILDERS[os.path.splitext(path)[1].lower()]
    try:
        if os.path.getsize(path):
            return datasets.load_dataset(builder, data_files=path, split="train")
    except (StopIteration, ValueError, datasets.exceptions.DatasetGenerationError) as e:  # StopIteration: whitespace
        if not isinstance(e, StopIteration) and "corresponds to no data" not in str(e):  # `[]`
            raise ValueError(f"dataset file {path!r} could not be parsed as {builder}: {_read_error(path, e)}") from e
    raise ValueError(f"dataset file {path!r} is empty: it holds no rows.")


def json_lines(path: str | os.PathLike):
    """(its number from 1, its JSON value or `None` when it does not parse) of each non-blank line of `path`."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                try:
                    yield number, json.loads(line)
                except ValueError:  # JSONDecodeError, UnicodeDecodeError
                    yield number, None


def _json_lines(path: str) -> list[tuple[int, Any]]:  # a JSON Lines file's, else []
    with open(path, "rb") as f:
        lines = path.lower().endswith((".json", ".jsonl")) and not f.read(4096).lstrip().startswith(b"[")
    return list(json_lines(path)) if lines else []


def _read_error(root: str, error: Exception) -> str:
    """The first line of a file (of a folder's) that is not a JSON object, else the parser's first line."""
    paths = [root] if os.path.isfile(root) else sorted(str(p) for p in Path(root).rglob("*") if p.is_file())
    bad = (f"{'' if p == root else os.path.relpath(p, root) + ' '}line {n} is not a JSON object"
           for p in paths for n, row in _json_lines(p) if not isinstance(row, dict))  # fmt: skip
    return next(bad, (str(error.__cause__ or error).strip().splitlines() or [type(error).__name__])[0])


def _where(dataset_name: str, indices: list[int]) -> str:
    """`dataset file 'x.jsonl': lines 4, 9` (a JSON Lines file's lines), else `dataset 'x': rows 4, 9` (from 1)."""
    numbers, kind, is_file = [index + 1 for index in indices], "row", os.path.isfile(dataset_name)
    if is_file and (lines := _json_lines(dataset_name)):
        numbers, kind = [lines[index][0] for index in indices], "line"
    shown = ", ".join(map(str, numbers[:10])) + (f" and {len(numbers) - 10} more" if len(numbers) > 10 else "")
    return f"dataset{' file' * is_file} {dataset_name!r}: {kind}{'s' * (len(numbers) > 1)} {shown}"


def _solution_to_str(value: Any) -> str:
    """`27.0` -> `"27"`, a list joined with `", "`, `None` -> `""` (never correct)."""
    if isinstance(value, (list, tuple)):
        return ", ".join(map(_solution_to_str, value))
    return "" if value is None else str(int(value) if isinstance(value, float) and value.is_integer() else value)


def load_prompt_dataset(
    dataset_name: str, *, dataset_config: str | None = None, split: str = "train", prompt_column: str = "problem",
    solution_column: str = "answer", instruction: str | None = INSTRUCTION, data_files=None, limit: int | None = None,
    strip_dapo_instruction: bool = False,
):  # fmt: skip
    """A math [`~datasets.Dataset`] for [`~trl.GRPOTrainer`]: the source's columns, then `prompt` (a chat,
    `instruction` added to its last user turn) and `solution` (`str`); a `builtin:<name>` task has only these two. A
    local `.json`, `.jsonl`, `.parquet` or `.csv` file is one split; another name goes to `datasets.load_dataset`.
    `ValueError` (unknown name or split, unparsable file, missing column, bad prompt), `FileNotFoundError`."""
    import datasets

    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}.")
    if builtin := dataset_name.startswith(BUILTIN_PREFIX):
        if split not in (splits := make_tiny_math_dataset() if dataset_name == "builtin:tiny-math" else {}):
            raise ValueError(f"No built-in dataset {dataset_name!r} with a split {split!r}; built-in ones: "
                             "builtin:tiny-math (splits train, test).")  # fmt: skip
        dataset, prompt_column, solution_column = splits[split], "problem", "solution"
    elif is_local_dataset_file(dataset_name):
        dataset = load_local_dataset_file(dataset_name)
    else:
        try:
            dataset = datasets.load_dataset(dataset_name, dataset_config, split=split, data_files=data_files)
        except (ValueError, datasets.exceptions.DatasetGenerationError) as e:
            if not os.path.isdir(dataset_name):
                raise
            raise ValueError(f"dataset folder {dataset_name!r} could not be read: "
                             f"{_read_error(dataset_name, e)}") from e  # fmt: skip
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    flat, columns = dataset.flatten(), dataset.column_names
    if missing := [c for c in (prompt_column, solution_column) if c not in flat.column_names + columns]:
        fix = "Set prompt_column / solution_column (a dotted name reaches into a struct: 'reward_model.ground_truth')."
        raise ValueError(f"{_MISSING.format(missing[0], dataset_name, columns)} {fix}")
    prompts, solutions = [(dataset if c in columns else flat)[c] for c in (prompt_column, solution_column)]
    texts = [p if isinstance(p, str) else "".join(str(m["content"]) for m in p)
             if isinstance(p, list) and all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in p) else None
             for p in prompts]  # fmt: skip
    if bad := [i for i, text in enumerate(texts) if text is None]:
        raise ValueError(f"{_where(dataset_name, bad)} (column {prompt_column!r}): a prompt must be a string or a "
                         f"list of chat messages with 'role' and 'content', got {prompts[bad[0]]!r:.100}. Fix or "
                         "remove those rows.")  # fmt: skip
    solutions = list(map(_solution_to_str, solutions))
    for column, values, what in [
        (prompt_column, texts, "empty prompt: trained on, the model sees the instruction alone."),
        (solution_column, solutions, "no answer: math_accuracy gives their completions no reward (None)."),
    ]:  # fmt: skip
        if indices := [i for i, value in enumerate(values) if not value.strip()]:
            logger.warning(f"{_where(dataset_name, indices)} (column {column!r}): {what}")
    strip = remove_dapo_instruction if strip_dapo_instruction and not builtin else (lambda text: text)
    prompts = [[{"role": m["role"], "content": strip(m["content"]) if m["role"] == "user" else m["content"]}
                for m in p] if isinstance(p, list) else [{"role": "user", "content": strip(p)}]
               for p in prompts]  # fmt: skip
    for chat in prompts:  # the instruction to the last user turn
        if users := [i for i, m in enumerate(chat) if m["role"] == "user"]:
            chat[users[-1]] = format_prompt(chat[users[-1]]["content"], instruction)[0]
    if builtin or not (kept := [c for c in columns if c not in ("prompt", "solution")]):
        return datasets.Dataset.from_dict({"prompt": prompts, "solution": solutions})
    return dataset.select_columns(kept).add_column("prompt", prompts).add_column("solution", solutions)


def model_max_positions(config, revision: str | None = None) -> int | None:
    """The positions a vLLM engine, a model, a config (or dict) or the config.json of a folder, a built `builtin:`
    model or a cached Hub id attends over, or None."""
    engine = getattr(getattr(getattr(config, "llm", config), "llm_engine", None), "model_config", None)
    if isinstance(config, (str, os.PathLike)):
        from huggingface_hub import try_to_load_from_cache

        from .models.names import builtin_model_dir

        try:  # an unknown builtin: name, not a repo id, not cached: None
            if (folder := os.path.expanduser(config)).startswith(BUILTIN_PREFIX):
                folder = builtin_model_dir(folder)
            elif not os.path.isdir(folder):
                folder = os.path.dirname(try_to_load_from_cache(folder, "config.json", revision=revision))
            config = json.loads(Path(folder, "config.json").read_text(encoding="utf-8"))
        except Exception:  # noqa: BLE001
            return None
    config = getattr(model := getattr(config, "model", config), "config", model)  # a generator holds its model
    get = config.get if isinstance(config, dict) else lambda name: getattr(config, name, None)
    lengths = [getattr(engine, "max_model_len", None), *map(get, ("max_position_embeddings", "n_positions",
                                                                  "max_sequence_length", "seq_length"))]  # fmt: skip
    return next((n for n in lengths if isinstance(n, int) and not isinstance(n, bool) and n > 0), None)


def prompt_token_budget(max_positions: int | None, max_new_tokens: int, max_prompt_tokens: int | None = None):
    """The longest prompt (tokens) that leaves `max_new_tokens` positions and is at most `max_prompt_tokens`, or None;
    `ValueError` when `max_new_tokens >= max_positions` or `max_prompt_tokens < 1`."""
    if max_prompt_tokens is not None and max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens={max_prompt_tokens!r} must be a positive number of tokens.")
    if max_positions is not None and max_new_tokens >= max_positions:
        raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt: the model has {max_positions} "
                         f"positions (prompt + completion); give a budget below {max_positions}.")  # fmt: skip
    room = None if max_positions is None else max_positions - max_new_tokens
    return min((b for b in (max_prompt_tokens, room) if b is not None), default=None)


def report_dropped(total: int, kept: int, budget: int | None, what: str = "prompts") -> None:
    """One warning line when prompts over `budget` tokens were dropped; `ValueError` when all were."""
    if not kept and total:
        raise ValueError(f"All {total} {what} are longer than {budget} tokens: raise max_prompt_tokens, lower the "
                         "generation budget, or use a model with more positions.")  # fmt: skip
    if kept < total:
        logger.warning(f"Dropped {total - kept} of {total} {what} longer than {budget} tokens (max_prompt_tokens).")


def keep_short_prompts(lengths: list[int], budget: int | None, what: str = "prompts") -> list[int]:
    """The indices of the prompts of at most `budget` tokens ([`report_dropped`] says what was dropped)."""
    keep = [i for i, n in enumerate(lengths) if budget is None or n <= budget]
    report_dropped(len(lengths), len(keep), budget, what)
    return keep


def _named(dataset: Any, dataset_name: str) -> list[tuple[str, Any]]:
    if isinstance(dataset, Mapping):  # several eval datasets
        return [(f"{dataset_name}[{key!r}]", value) for key, value in dataset.items()]
    return [] if dataset is None else [(dataset_name, dataset)]


def check_reward_columns(reward_funcs: Any, dataset: Any, dataset_name: str = "train_dataset") -> None:
    """Raise a `ValueError` naming column, dataset and reward for an argument no column of `dataset` nor TRL fills."""
    import torch
    from trl.trainer.utils import get_callable_name

    funcs = [f for f in (reward_funcs if isinstance(reward_funcs, list) else [reward_funcs])
             if callable(f) and not isinstance(f, torch.nn.Module)]  # fmt: skip
    for name, data in _named(dataset, dataset_name):
        if (columns := getattr(data, "column_names", None)) is None:  # some streamed datasets
            continue
        filled = (set(columns) - set(_PASSED_AS)) | TRL_REWARD_ARGUMENTS
        for func in funcs:
            try:
                parameters, func_name = inspect.signature(func).parameters.values(), get_callable_name(func)
            except (TypeError, ValueError):
                continue
            missing = next((p.name for p in parameters if p.default is p.empty and p.name not in filled
                            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)), None)  # fmt: skip
            if missing in _PASSED_AS:
                raise ValueError(f"The reward function {func_name!r} takes an argument {missing!r}, which TRL never "
                                 f"fills: it passes that column as `{_PASSED_AS[missing]}`. Rename the "
                                 "argument.")  # fmt: skip
            if missing is not None:
                raise ValueError(f"{_MISSING.format(missing, name, columns)} The reward function {func_name!r} needs "
                                 "it (TRL passes each column to the argument of its name): add the column to the "
                                 "dataset, or give the argument a default.")  # fmt: skip


def check_prompt_column(dataset: Any, dataset_name: str = "train_dataset", *, prompt_optional: bool = False) -> None:
    """Raise a `ValueError` for an empty `dataset` (or one of a dict), or without `prompt` unless `prompt_optional`."""
    for name, data in _named(dataset, dataset_name):
        if hasattr(data, "__len__") and len(data) == 0:
            raise ValueError(f"Dataset {name!r} is empty (0 rows): give it prompts (rows with a 'prompt' column).")
        columns = getattr(data, "column_names", None)
        if not prompt_optional and columns is not None and "prompt" not in columns:
            message = f"{_MISSING.format('prompt', name, columns)} TRL reads each prompt from a column named "
            raise ValueError(message + "'prompt': rename yours (dataset.rename_column('question', 'prompt')), or pass "
                             "an environment_factory whose reset() supplies the prompt.")  # fmt: skip


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def chat_template_message(model_name: str, what: str, fix: str) -> str:
    return f"{what} chat messages, but the tokenizer of {model_name!r} has no chat template to format them with. {fix}"


def render_chat_template(tokenizer, messages, **template_kwargs) -> str:
    """`messages` through the chat template, with the generation prompt; `ValueError` naming the file jinja refuses."""
    from jinja2 import TemplateError

    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **template_kwargs)
    except TemplateError as e:
        folder = str(getattr(tokenizer, "name_or_path", ""))
        files = [os.path.join(folder, f) for f in ("chat_template.jinja", "tokenizer_config.json")]
        where, reason = next(filter(os.path.isfile, files), f"of {folder!r}"), (str(e).splitlines() or [""])[0]
        raise ValueError(f"The chat template {where} cannot be applied ({type(e).__name__}: {reason}): fix or "
                         "replace it.") from None  # fmt: skip


def check_chat_template(tokenizer, dataset, model_name: str, dataset_name="train_dataset", fix=CHAT_TEMPLATE_FIX,
                        template_kwargs=None):  # fmt: skip
    """Raise a `ValueError` when `dataset`'s chat prompts meet no chat template, or one jinja refuses on the first."""
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
