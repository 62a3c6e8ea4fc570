"""The `builtin:` model names: the registry, the cache folder of each, and the checks of a model argument.

Nothing here builds or loads a model (cheap to import and to call before loading data); `cache.py` builds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


BUILTIN_PREFIX = "builtin:"

# The single source of truth for `builtin:` model names. Bump a `version` whenever its recipe (tokenizer, model,
# data or warm-up) changes: the cache folder is `<name>-<version>`, so old builds are never reused by mistake.
BUILTIN_MODELS: dict[str, dict[str, Any]] = {
    "tiny-math": {
        "version": "v2",
        "description": "tiny Qwen3 (144k parameters) SFT-warmed on two-digit addition to ~45 % sampled accuracy",
        # Sampled accuracy (T = 1.0) jumps from ~5 % to ~45 % between steps 150 and 300, then plateaus near 50 %
        # (label smoothing caps it; greedy accuracy is ~100 % by then). 320 steps: just onto the plateau.
        "sft_steps": 320,
    },
    "tiny-random": {
        "version": "v2",
        "description": "the tiny-math tokenizer and architecture with random weights (no warm-up), for fast tests",
        "sft_steps": 0,
    },
    # vLLM's CPU attention refuses head_dim 16 ("Unsupported CPU attention configuration"): the same recipe with
    # wider heads, for the vLLM paths (`stapo-eval --backend vllm`, vLLM rollouts). `model_config` overrides
    # `MODEL_CONFIG`; `tiny-math` itself keeps its shape, so the demo's calibration and figures stay valid.
    "tiny-math-h64": {
        "version": "v1",
        "description": "tiny-math with head_dim 64 (vLLM's CPU attention needs head_dim >= 32), SFT-warmed likewise",
        "sft_steps": 320,
        "model_config": {"head_dim": 64},
    },
}

CACHE_ENV_VAR = "STAPO_TRL_CACHE"
DEFAULT_CACHE_DIR = "~/.cache/stapo_trl"
INFO_FILE = "stapo_builtin.json"


def default_cache_dir() -> Path:
    """Cache root: `$STAPO_TRL_CACHE` if set, else `~/.cache/stapo_trl`."""
    return Path(os.environ.get(CACHE_ENV_VAR) or DEFAULT_CACHE_DIR).expanduser()


def builtin_model_dir(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where `builtin:<name>` is (or will be) cached: `<cache_dir>/<name>-<version>` (`name` with or without the
    `builtin:` prefix; `cache_dir=None` means [`default_cache_dir`])."""
    name = check_builtin_name(name)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / f"{name}-{BUILTIN_MODELS[name]['version']}"


def check_builtin_name(name: str) -> str:
    """`name` without the `builtin:` prefix; a ValueError listing the known names if it is not one."""
    bare = name.removeprefix(BUILTIN_PREFIX)
    if bare not in BUILTIN_MODELS:
        known = ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS)
        raise ValueError(f"Unknown built-in model {BUILTIN_PREFIX + bare!r}. Known built-in models: {known}.")
    return bare


def check_model_name_or_path(name_or_path: str | os.PathLike) -> str:
    """Validate a model argument without loading or building anything (cheap: run it before loading data).

    Returns:
        `str`: `builtin:<name>` unchanged, an existing local directory (`~` expanded), or a Hub id unchanged.

    Raises:
        ValueError: If a `builtin:` name is unknown (the message lists the known names).
        FileNotFoundError: If a local-looking path (`./x`, `../x`, `/x`, `~/x`) does not exist.
        NotADirectoryError: If the path exists but is a file.
    """
    name_or_path = os.fspath(name_or_path)
    if name_or_path.startswith(BUILTIN_PREFIX):
        check_builtin_name(name_or_path)
        return name_or_path
    if os.path.isdir(name_or_path):
        return name_or_path
    if name_or_path.startswith("~") and os.path.isdir(os.path.expanduser(name_or_path)):
        return os.path.expanduser(name_or_path)  # transformers does not expand `~`
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


def check_model_available(name_or_path: str | os.PathLike) -> str:
    """[`check_model_name_or_path`], and, when the Hub is offline (`HF_HUB_OFFLINE=1`), that a name which is not a
    local directory is a Hub id already in the local Hugging Face cache (otherwise transformers fails later with a
    long "couldn't connect" traceback; a relative path such as `outputs/no-such` reads as a Hub id too).

    Returns:
        `str`: as [`check_model_name_or_path`].

    Raises:
        FileNotFoundError: the name is neither a local directory nor, offline, a cached Hub id; plus the errors of
            [`check_model_name_or_path`].
    """
    name = check_model_name_or_path(name_or_path)
    if name.startswith(BUILTIN_PREFIX) or os.path.isdir(name):
        return name
    from huggingface_hub import constants, try_to_load_from_cache  # only for a Hub id

    if constants.HF_HUB_OFFLINE:
        try:
            cached = try_to_load_from_cache(name, "config.json")
        except Exception:  # noqa: BLE001 (an invalid repo id: not cached either)
            cached = None
        if not isinstance(cached, str):
            raise FileNotFoundError(
                f"Model {name!r} is not a local directory, and as a Hub id it is not in the local Hugging Face cache "
                "while HF_HUB_OFFLINE=1 (no download). Pass an existing directory (e.g. outputs/demo-stapo after "
                "`make demo`), a cached Hub id, or a built-in name ("
                + ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS)
                + ")."
            )
    return name


def read_builtin_info(model_path: str | os.PathLike) -> dict[str, Any]:
    """The build record (`stapo_builtin.json`) of a built-in model directory."""
    with open(Path(model_path) / INFO_FILE, encoding="utf-8") as f:
        return json.load(f)
