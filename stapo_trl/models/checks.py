"""The checks of a model argument, run before any data is loaded: a `builtin:` name that is cached or can be built
(its wheels and GGUF file are here, `gguf.py`), a local directory that exists, and, offline, a Hub id that is cached.
Cheap: metadata and file existence only; nothing is built or loaded.
"""

from __future__ import annotations

import os

from .gguf import locate_gguf  # standard library only at import
from .names import BUILTIN_MODELS, BUILTIN_PREFIX, INFO_FILE, builtin_model_dir, check_builtin_name


def check_builtin_buildable(name: str, cache_dir: str | os.PathLike | None = None) -> None:
    """Check, cheaply, that `builtin:<name>` is in the cache or can be built: for a real model (`kind` `gguf`, or the
    `base` of a `gguf+sft` one), that its pinned wheels and the `gguf` reader are installed and its GGUF file or
    chunks exist. Only metadata and file existence are read: the checksum is verified when the model is built.

    Args:
        name (`str`): A key of `BUILTIN_MODELS` (without the `builtin:` prefix).
        cache_dir (`str`, `os.PathLike` or `None`, *optional*, defaults to `None`): Cache root, as in
            [`builtin_model_dir`].

    Raises:
        stapo_trl.models.gguf.ModelWheelNotInstalledError: A wheel (or `gguf`) is missing or at another version; the
            message names the install command.
        stapo_trl.models.gguf.GGUFFileMissingError: A wheel is installed but its GGUF file or a chunk is missing.
    """
    if (builtin_model_dir(name, cache_dir) / INFO_FILE).is_file():
        return  # built: the wheels are no longer needed
    recipe = BUILTIN_MODELS[name]
    if recipe["kind"] == "gguf+sft":
        check_builtin_buildable(recipe["base"], cache_dir)
    elif recipe["kind"] == "gguf":
        locate_gguf(name)


def check_model_name_or_path(name_or_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> str:
    """Validate a model argument without loading or building anything (cheap: run it before loading data).

    Args:
        name_or_path (`str` or `os.PathLike`): `builtin:<name>`, a local model directory or a Hub id.
        cache_dir (`str`, `os.PathLike` or `None`, *optional*, defaults to `None`): Cache root of built-in models
            (`None`: `$STAPO_TRL_CACHE`, else `~/.cache/stapo_trl`); a built real model needs no wheel.

    Returns:
        `str`: `builtin:<name>` unchanged, an existing local directory (`~` expanded), or a Hub id unchanged.

    Raises:
        ValueError: If a `builtin:` name is unknown (the message lists the known names).
        FileNotFoundError: If a local-looking path (`./x`, `../x`, `/x`, `~/x`) does not exist, or a real built-in
            model is neither cached nor buildable (its wheel is not installed, or its GGUF file is missing; see
            [`check_builtin_buildable`]: the message names the install command).
        NotADirectoryError: If the path exists but is a file.
        ValueError: a local directory that holds no whole model ([`check_model_folder`]).
    """
    name_or_path = os.fspath(name_or_path)
    if name_or_path.startswith(BUILTIN_PREFIX):
        check_builtin_buildable(check_builtin_name(name_or_path), cache_dir)
        return name_or_path
    if name_or_path.startswith("~") and os.path.isdir(os.path.expanduser(name_or_path)):
        name_or_path = os.path.expanduser(name_or_path)  # transformers does not expand `~`
    if os.path.isdir(name_or_path):
        check_model_folder(name_or_path)
        return name_or_path
    if os.path.exists(name_or_path):
        raise NotADirectoryError(f"Model path {name_or_path!r} is a file; pass the directory that holds the model.")
    if name_or_path.startswith(("/", "./", "../", "~", ".\\", "..\\")) or name_or_path in (".", ".."):
        raise FileNotFoundError(
            f"Model directory {name_or_path!r} does not exist. Pass an existing local directory, a Hub id "
            "(e.g. 'Qwen/Qwen3-1.7B-Base') or a built-in name ("
            + ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS)
            + ")."
        )
    return name_or_path


def check_model_available(name_or_path: str | os.PathLike, revision: str | None = None) -> str:
    """[`check_model_name_or_path`], and that a name which is not a local directory is a Hub id that can be loaded:
    in the local Hugging Face cache, or else the Hub answers (offline, `HF_HUB_OFFLINE=1`, it must be cached).
    Otherwise transformers retries for ~50 s and fails with a "couldn't connect" message; a relative path such as
    `outputs/no-such` reads as a Hub id too ([`~stapo_trl.checks.hub.check_hub_model`]).

    Args:
        name_or_path (`str` or `os.PathLike`): `builtin:<name>`, a local model directory or a Hub id.
        revision (`str`, *optional*): the Hub revision of a Hub id.

    Returns:
        `str`: as [`check_model_name_or_path`].

    Raises:
        FileNotFoundError: the name is neither a local directory nor, offline, a cached Hub id; plus the errors of
            [`check_model_name_or_path`].
        ConnectionError: a Hub id that is not cached while the Hub does not answer.
    """
    from ..checks.hub import check_hub_model

    name = check_model_name_or_path(name_or_path)
    check_hub_model(name, revision=revision)
    return name


def check_model_folder(path: str) -> None:
    """Refuse a local model directory that holds no model, or a damaged one: no `config.json` (nor an adapter's
    `adapter_config.json`) or no weights (a run folder stopped before its final model: its newest complete checkpoint
    is named), a `checkpoint-N` folder that is not complete (its save cut short, a file damaged: transformers' rotation
    may be removing it; [`~stapo_trl.runfiles.checkpoints.checkpoint_problem`]), a weights file that is not whole.

    Raises:
        ValueError: one line naming the folder and what is missing or damaged.
    """
    from ..runfiles.checkpoints import check_checkpoint, file_problem, newest_complete_checkpoint
    from ..runfiles.run_folder import CHECKPOINT_FOLDER
    from ..runfiles.run_record import RUN_RECORD

    what = f"Model directory {path!r}"
    if CHECKPOINT_FOLDER.match(os.path.basename(os.path.normpath(path))) or os.path.isfile(
        os.path.join(path, RUN_RECORD)
    ):
        fix = "Give a complete checkpoint (<output_dir>/checkpoint-<step>) or the run's final model (its output_dir)."
        return check_checkpoint(path, what, save_only_model=True, fix=fix)
    names = sorted(os.listdir(path))
    weights = [
        n for n in names if n.endswith(".safetensors") or (n.startswith("pytorch_model") and n.endswith(".bin"))
    ]
    if not {"config.json", "adapter_config.json"} & set(names) or not weights:
        missing = (
            "config.json" if not {"config.json", "adapter_config.json"} & set(names) else "weights (*.safetensors)"
        )
        newest = newest_complete_checkpoint(path)[0]
        hint = (
            f"it is a run folder without its final model: give its newest complete checkpoint, {newest}"
            if newest
            else "give a folder saved by save_pretrained: a stapo-train output_dir or one of its checkpoint-N folders"
        )
        raise ValueError(f"{what} holds no model (no {missing}): {hint}.")
    for name in weights:
        problem = file_problem(os.path.join(path, name))
        if problem:
            raise ValueError(f"{what}: {name} {problem}. Give a folder whose save finished.")
