"""A `builtin:` model built once into its cache folder, and the checks of a model argument before anything loads."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import logging
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from filelock import FileLock

from ..integrations.hub import check_hub_model
from . import gguf
from .names import BUILTIN_MODELS, BUILTIN_PREFIX, INFO_FILE, builtin_model_dir


logger = logging.getLogger(__name__)

_LAUNCHER_VAR = re.compile(  # torchrun's and accelerate's: a build under them runs in a child without them
    r"(ACCELERATE|TORCHELASTIC|FSDP|PET)_.*|((LOCAL|GROUP|ROLE)_)?(RANK|WORLD_SIZE)|ROLE_NAME|MASTER_ADDR|MASTER_PORT"
)


def resolve_model_path(name_or_path: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None) -> str:
    """What `from_pretrained` loads: the cache folder of `builtin:<name>` (built once on first use; `cache_dir=None`:
    [`default_cache_dir`]), a local folder (`~` expanded) or a Hub id. Raises as [`check_model_name_or_path`], and
    ValueError for a GGUF file whose SHA-256 differs from the pin."""
    name_or_path = check_model_name_or_path(name_or_path, cache_dir)
    if not name_or_path.startswith(BUILTIN_PREFIX):
        return name_or_path
    target = builtin_model_dir(name := name_or_path.removeprefix(BUILTIN_PREFIX), cache_dir)
    if (target / INFO_FILE).is_file():
        return str(target)
    base = BUILTIN_MODELS[name].get("base")
    base_path = resolve_model_path(BUILTIN_PREFIX + base, cache_dir=cache_dir) if base else None
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{target}.lock"):
        if (target / INFO_FILE).is_file():  # built while this process waited
            return str(target)
        tmp_dir = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        os.umask(umask := os.umask(0))
        try:
            logger.warning("Building builtin:%s on its first use, once, into %s.", name, target.parent)
            dist = getattr(sys.modules.get("torch"), "distributed", None)  # launched: a child, off the launcher's
            if any(map(_LAUNCHER_VAR.fullmatch, os.environ)) or dist and dist.is_available() and dist.is_initialized():
                if BUILTIN_MODELS[name]["kind"] == "gguf":  # a checksum error in one line, not a child's status
                    gguf.verify_gguf(gguf.locate_gguf(name))
                env = {k: v for k, v in os.environ.items() if not _LAUNCHER_VAR.fullmatch(k)}
                cmd = [sys.executable, "-m", "stapo_trl.models", name, "--output-dir", str(tmp_dir)]
                cmd += ["--base-path", base_path] if base_path else []
                subprocess.run(cmd, env=env | {"HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}, check=True)
            else:  # in this process: accelerate's shared state and the random generators restored after it
                import numpy as np
                import torch
                from accelerate.state import AcceleratorState, GradientState, PartialState

                states = [(cls, dict(cls._shared_state)) for cls in (PartialState, AcceleratorState, GradientState)]
                py_rng, np_rng = random.getstate(), np.random.get_state()
                try:
                    with torch.random.fork_rng(devices=[]):
                        build_builtin_model(name, tmp_dir, base_path=base_path)
                finally:
                    for cls, saved in states:
                        cls._shared_state.clear()
                        cls._shared_state.update(saved)
                    random.setstate(py_rng), np.random.set_state(np_rng)
            for path in [tmp_dir, *tmp_dir.rglob("*")]:
                os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)
            if target.exists():  # incomplete: no build record
                shutil.rmtree(target)
            os.rename(tmp_dir, target)
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)
    return str(target)


def build_builtin_model(name: str, output_dir: str | os.PathLike, base_path: str | os.PathLike | None = None) -> dict:
    """Build `builtin:<name>` into `output_dir` (no cache) on one torch thread, the build record last, and return it.
    `base_path`: a `gguf+sft` model's built base. FileNotFoundError, ValueError: a real model's wheel or file."""
    import torch
    import transformers

    recipe, start, threads = BUILTIN_MODELS[name], time.perf_counter(), torch.get_num_threads()
    os.makedirs(output_dir, exist_ok=True)
    logger.info("Building builtin:%s (%s) into %s", name, recipe["description"], output_dir)
    module = importlib.import_module({"gguf+sft": ".sft_math"}.get(kind := recipe["kind"], f".{kind}"), __package__)
    torch.set_num_threads(1)
    try:
        fields = {**module.build(name, output_dir, base_path), "torch_threads": torch.get_num_threads()}  # saves
    finally:
        torch.set_num_threads(threads)
    versions = {"stapo_trl": importlib.metadata.version("stapo_trl"), "torch": torch.__version__,
                "transformers": transformers.__version__, **fields["versions"]}  # fmt: skip
    header = {k: recipe[k] for k in ("version", "kind", "description", "license") if k in recipe}
    info = {"name": BUILTIN_PREFIX + name, **header, **fields, "versions": versions}
    info["build_seconds"] = round(time.perf_counter() - start, 1)
    (Path(output_dir) / INFO_FILE).write_text(json.dumps(info, indent=2), encoding="utf-8")
    logger.info("Built builtin:%s in %.1f s.", name, info["build_seconds"])
    return info


def check_model_name_or_path(name_or_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> str:
    """A model argument checked without loading: `builtin:<name>` or a Hub id unchanged, a local folder `~`-expanded.
    Raises ValueError (an unknown `builtin:` name, a folder without a whole model), FileNotFoundError (a missing local
    path, a real built-in model neither cached nor installed), NotADirectoryError (a file)."""
    name_or_path = os.fspath(name_or_path)
    if name_or_path.startswith(BUILTIN_PREFIX):
        name = name_or_path.removeprefix(BUILTIN_PREFIX)
        built = lambda n: (builtin_model_dir(n, cache_dir) / INFO_FILE).is_file()  # noqa: E731
        while not built(name) and "base" in BUILTIN_MODELS[name]:
            name = BUILTIN_MODELS[name]["base"]
        if BUILTIN_MODELS[name]["kind"] == "gguf" and not built(name):
            gguf.locate_gguf(name)
        return name_or_path
    if os.path.isdir(path := os.path.expanduser(name_or_path)):  # a checkpoint whole, or a model saved whole
        from ..run_folder import checkpoints as ck

        what, names = f"Model directory {path!r}", sorted(os.listdir(path))
        weights, has_config = weight_files(names), bool({"config.json", "adapter_config.json"} & set(names))
        if ck.CHECKPOINT_FOLDER.match(os.path.basename(os.path.normpath(path))) or ck.RUN_RECORD in names:
            fix = "Give a complete checkpoint (<output_dir>/checkpoint-<step>) or the run's final model (its "
            ck.check_checkpoint(path, what, save_only_model=True, fix=fix + "output_dir).")
            return path
        if not (has_config and weights):
            hint = ("give a folder saved by save_pretrained: a stapo-train output_dir or one of its checkpoint-N "
                    "folders")  # fmt: skip
            if newest := ck.newest_complete_checkpoint(path)[0]:
                hint = f"it is a run folder without its final model: give its newest complete checkpoint, {newest}"
            missing = "weights (*.safetensors)" if has_config else "config.json"
            raise ValueError(f"{what} holds no model (no {missing}): {hint}.")
        for name in weights:
            if problem := ck.file_problem(os.path.join(path, name)):
                raise ValueError(f"{what}: {name} {problem}. Give a folder whose save finished.")
        return path
    if os.path.exists(name_or_path):
        raise NotADirectoryError(f"Model path {name_or_path!r} is a file; pass the directory that holds the model.")
    if name_or_path.startswith(("/", "./", "../", "~", ".\\", "..\\")) or name_or_path in (".", ".."):
        raise FileNotFoundError(f"Model directory {name_or_path!r} does not exist. Pass an existing local directory, "
            f"a Hub id (e.g. 'Qwen/Qwen3-1.7B-Base') or a built-in name "
            f"({', '.join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS)}).")  # fmt: skip
    return name_or_path


def check_model_available(name_or_path: str | os.PathLike, revision: str | None = None) -> str:
    """[`check_model_name_or_path`], then a Hub id cached or answering; FileNotFoundError or ConnectionError."""
    check_hub_model(name := check_model_name_or_path(name_or_path), revision=revision)
    return name


def weight_files(names: list[str]) -> list[str]:
    """The weight files among a folder's `names`: `*.safetensors`, `pytorch_model*.bin`."""
    return [n for n in names if n.endswith(".safetensors") or re.fullmatch(r"pytorch_model.*\.bin", n)]
