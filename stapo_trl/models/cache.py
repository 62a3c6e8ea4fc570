"""Building `builtin:` models into their cache folder once: a file lock, a temporary folder, an atomic rename.

A process of a `torchrun` / `accelerate launch` job builds in a clean child process (`python -m stapo_trl.models`);
any other builds in-process with its global state (accelerate, random generators) restored afterwards.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from filelock import FileLock

from .build import build_builtin_model
from .checks import check_model_name_or_path
from .names import (
    BUILTIN_MODELS,
    BUILTIN_PREFIX,
    INFO_FILE,
    builtin_model_dir,
    check_builtin_name,
)


logger = logging.getLogger(__name__)

# Variables through which torchrun / accelerate launch make a process part of a distributed job.
_LAUNCHER_ENV_PREFIXES = ("ACCELERATE_", "TORCHELASTIC_", "FSDP_", "PET_")
_LAUNCHER_ENV_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def resolve_model_path(name_or_path: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None) -> str:
    """Turn a model argument into something `from_pretrained` can load, building `builtin:` models on first use.

    - `builtin:<name>`: built into the cache on first use (under a file lock, so the processes of an
      `accelerate launch` / `torchrun` job build it once), then read from it; returns the local directory.
    - An existing local directory: returned unchanged (`~` expanded).
    - A path that looks local (`./x`, `../x`, `/x`, `~/x`) but does not exist: `FileNotFoundError`.
    - Anything else (a Hub id such as `Qwen/Qwen3-1.7B-Base`): returned unchanged for transformers to load.

    Args:
        name_or_path (`str` or `os.PathLike`):
            `builtin:<name>`, a local model directory or a Hub id.
        cache_dir (`str`, `os.PathLike` or `None`, *optional*, defaults to `None`):
            Cache root for built-in models; `None` means `$STAPO_TRL_CACHE`, else `~/.cache/stapo_trl`.

    Returns:
        `str`: A local directory path, or the Hub id unchanged.

    Raises:
        ValueError: If a `builtin:` name is unknown (the message lists the known names), or a real model's GGUF file
            differs from the registry's checksum (`stapo_trl.models.gguf.GGUFChecksumError`, before conversion).
        FileNotFoundError: If a local-looking path does not exist, or a real built-in model's wheel or GGUF file is
            missing (`stapo_trl.models.gguf`: the message names the install command).
        NotADirectoryError: If the path exists but is a file.
    """
    name_or_path = check_model_name_or_path(name_or_path, cache_dir)
    if name_or_path.startswith(BUILTIN_PREFIX):
        return str(_build_or_load(check_builtin_name(name_or_path), cache_dir))
    return name_or_path


def _build_or_load(name: str, cache_dir: str | os.PathLike | None) -> Path:
    target = builtin_model_dir(name, cache_dir)
    if (target / INFO_FILE).is_file():
        return target
    base = BUILTIN_MODELS[name].get("base")  # a model SFT-warmed from another one: that one first
    base_path = _build_or_load(base, cache_dir) if base else None
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        # Another process may have finished the build while this one waited for the lock.
        if (target / INFO_FILE).is_file():
            return target
        tmp_dir = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_dir, 0o777 & ~umask)  # mkdtemp makes it private; the cache may be shared
        try:
            if _is_launched_process():
                _check_source_before_child(name)
                _build_in_subprocess(name, tmp_dir, base_path)
            else:
                with _preserved_process_state():
                    build_builtin_model(name, tmp_dir, base_path=base_path)
            for path in tmp_dir.rglob("*"):  # transformers writes weight shards 0600; the cache may be shared
                if path.is_file():
                    os.chmod(path, 0o666 & ~umask)
            if target.exists():  # an incomplete folder (no info file), e.g. copied by hand: replace it
                shutil.rmtree(target)
            os.rename(tmp_dir, target)  # atomic on one file system: readers see nothing or a complete model
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)
    return target


def _is_launched_process() -> bool:
    """Whether this process belongs to a `torchrun` / `accelerate launch` job (or has a process group).

    The warm-up runs a [`~trl.SFTTrainer`], which would join the caller's process group and hang (the other ranks
    wait on the lock), or pick up the launcher's DeepSpeed / FSDP settings. Such processes build in a clean child.
    """
    if any(var in os.environ for var in _LAUNCHER_ENV_VARS):
        return True
    if any(var.startswith(_LAUNCHER_ENV_PREFIXES) for var in os.environ):
        return True
    if "torch" in sys.modules:
        import torch.distributed

        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return True
    return False


@contextlib.contextmanager
def _preserved_process_state():
    """Restore what an in-process warm-up changes globally: the accelerate state and the random generators.

    `TrainingArguments` resets accelerate's process-wide (Borg) state and configures it for the CPU, and the
    `Trainer` reseeds every generator. A caller that already built its own `GRPOConfig` (say, for a GPU) would
    otherwise train with the warm-up's CPU state, and a seeded caller would see its random stream change.
    """
    import random

    import numpy as np
    import torch
    from accelerate.state import AcceleratorState, GradientState, PartialState

    states = [(cls, dict(cls._shared_state)) for cls in (PartialState, AcceleratorState, GradientState)]
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    try:
        yield
    finally:
        for cls, saved in states:
            cls._shared_state.clear()
            cls._shared_state.update(saved)
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])


def _check_source_before_child(name: str) -> None:
    """Verify the GGUF checksum of a real model in this process before a child converts it: the child's errors reach
    the caller only as an exit status, while this is a one-line `GGUFChecksumError` (hashing takes about a second).
    (The base of a `gguf+sft` model is built, and so checked, before it.)"""
    if BUILTIN_MODELS[name]["kind"] == "gguf":
        from .gguf import locate_gguf, verify_gguf

        verify_gguf(locate_gguf(name))


def _build_in_subprocess(name: str, output_dir: Path, base_path: Path | None) -> None:
    env = {
        k: v for k, v in os.environ.items() if k not in _LAUNCHER_ENV_VARS and not k.startswith(_LAUNCHER_ENV_PREFIXES)
    }
    env["HF_HUB_OFFLINE"] = "1"
    env["CUDA_VISIBLE_DEVICES"] = ""  # the recipe is CPU-only; keep the child off the caller's GPUs
    cmd = [sys.executable, "-m", "stapo_trl.models", name, "--output-dir", str(output_dir)]
    if base_path is not None:
        cmd += ["--base-path", os.fspath(base_path)]
    logger.info("Building builtin:%s in a child process: %s", name, " ".join(cmd))
    subprocess.run(cmd, env=env, check=True)
