"""The `builtin:` models (`names.py`, recipes `tiny.py` `gguf.py` `sft_math.py`), cache and checks, model loading."""

from .cache import build_builtin_model, check_model_available, check_model_name_or_path, resolve_model_path
from .names import BUILTIN_MODELS, INFO_FILE, builtin_model_dir, default_cache_dir, read_builtin_info


__all__ = ["BUILTIN_MODELS", "INFO_FILE", "build_builtin_model", "builtin_model_dir", "check_model_available",
           "check_model_name_or_path", "default_cache_dir", "read_builtin_info", "resolve_model_path"]  # fmt: skip
