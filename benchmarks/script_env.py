"""Imported first by the benchmark scripts, before torch or stapo_trl: one torch thread (a tiny or small model on
shared cores gains nothing from more), offline, and the repository and `benchmarks/` on `sys.path` (so a script runs
as `python benchmarks/<name>.py` from anywhere, and a test or notebook can load it by path).

    import script_env  # noqa: I001 (first: sets the environment and sys.path)
"""

import os
import sys
from pathlib import Path


os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
for path in (REPO, REPO / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
