"""`python -m stapo_trl.models NAME --output-dir DIR [--base-path DIR]`: build a built-in model, without the cache."""

import argparse
import logging

from .cache import BUILTIN_MODELS, build_builtin_model


parser = argparse.ArgumentParser(prog="python -m stapo_trl.models", description=__doc__)
parser.add_argument("name", choices=sorted(BUILTIN_MODELS))
parser.add_argument("--output-dir", required=True)
parser.add_argument("--base-path", default=None, help="the built base model of a gguf+sft model")
args = parser.parse_args()
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
try:
    build_builtin_model(args.name, args.output_dir, args.base_path)
except (FileNotFoundError, ValueError) as e:
    raise SystemExit(f"python -m stapo_trl.models: error: {e}") from e
