"""Fixtures shared by every test file: tiny offline models, the shared benchmark data, one torch thread, and a guard
that fails a test that builds a model where an input error should have stopped first. Helper functions live in
`testing_utils.py`.

All tests run offline in one process (each new process spends ~7 s importing torch/transformers/trl). The tiny-math
models come from the user's cache (`$STAPO_TRL_CACHE`, else `~/.cache/stapo_trl`, where `make demo` puts them too):
built once (~40 s), then reused; `STAPO_TRL_TEST_MODEL` names another `builtin:` model or folder.
"""

import importlib.util
import os
from pathlib import Path


# Before torch / transformers / huggingface_hub are imported: the hub client reads these once, at import.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import pytest  # noqa: E402
import torch  # noqa: E402
from testing_utils import REPO  # noqa: E402

from stapo_trl.models import resolve_model_path  # noqa: E402


# The project's CPU machines have 2 cores; more threads than cores only adds contention.
torch.set_num_threads(1)  # tiny models gain nothing from threads; with 2-process tests running beside, 2 thrash


@pytest.fixture(autouse=True)
def single_torch_thread():
    """Every test starts on one torch thread, whatever an earlier test set: generation and training of a
    ~140k-parameter model are dominated by thread hand-offs, and two OpenMP threads on a busy 2-core machine make them
    ~10x slower."""
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def builtin_cache_dir(tmp_path_factory) -> Path:
    """A fresh, session-private cache for `builtin:` models, so the tests exercise a real build (passed to
    `resolve_model_path(..., cache_dir=...)`; `STAPO_TRL_CACHE` is never touched)."""
    return tmp_path_factory.mktemp("stapo_trl_cache")


@pytest.fixture(scope="session")
def tiny_math_model_path() -> str:
    """Directory of `builtin:tiny-math` (the tiny Qwen3 SFT-warmed to ~45 % sampled accuracy on two-digit addition) in
    the user's cache, or of `STAPO_TRL_TEST_MODEL`."""
    return resolve_model_path(os.environ.get("STAPO_TRL_TEST_MODEL") or "builtin:tiny-math")


@pytest.fixture(scope="session")
def tiny_random_model_path(builtin_cache_dir) -> str:
    """Directory of `builtin:tiny-random`: same tokenizer and architecture as tiny-math, random weights (~2 s)."""
    return resolve_model_path("builtin:tiny-random", cache_dir=builtin_cache_dir)


@pytest.fixture(scope="session")
def tiny_math_h64_model_path() -> str:
    """Directory of `builtin:tiny-math-h64` (head_dim 64, which vLLM's CPU attention accepts) in the user's cache, or of
    `STAPO_TRL_TEST_VLLM_MODEL`."""
    return resolve_model_path(os.environ.get("STAPO_TRL_TEST_VLLM_MODEL") or "builtin:tiny-math-h64")


@pytest.fixture
def no_model_built(monkeypatch):
    """Fail the test if a trainer (and so a model) is constructed: input errors must come before that."""
    import trl

    def guard(self, *args, **kwargs):
        raise AssertionError("a trainer was constructed: the error should have been raised before any model is built")

    monkeypatch.setattr(trl.GRPOTrainer, "__init__", guard)


@pytest.fixture(scope="session")
def smollm2_path(builtin_cache_dir) -> str:
    """`builtin:smollm2-135m` converted into the session's cache (~1-2 min on 2 busy cores). Needs its wheel
    (`real_model` tests only): `builtin:smollm2-135m-math`, built from it, lands in the same cache when resolved with
    `cache_dir=builtin_cache_dir` (or with `STAPO_TRL_CACHE` set to it, as the notebook's test does)."""
    return resolve_model_path("builtin:smollm2-135m", cache_dir=builtin_cache_dir)


def pytest_collection_modifyitems(config, items):
    """Skip the `vllm`-marked tests where vLLM is not installed (they run in .venv-vllm: `make test-vllm`), and the
    `real_model(*names)`-marked ones where a named model's wheels are missing (the reason names the install command)."""
    from stapo_trl.models.gguf import locate_gguf

    missing: dict[str, str | None] = {}
    vllm_skip = pytest.mark.skip(reason="vllm is not installed here: `make test-vllm` runs these in .venv-vllm")
    have_vllm = importlib.util.find_spec("vllm") is not None
    for item in items:
        if "vllm" in item.keywords and not have_vllm:
            item.add_marker(vllm_skip)
        marker = item.get_closest_marker("real_model")
        if marker is None:
            continue
        for name in marker.args:
            if name not in missing:
                try:
                    locate_gguf(name)  # metadata and file existence only (the checksum is a test of its own)
                    missing[name] = None
                except FileNotFoundError as e:
                    missing[name] = str(e)
            if missing[name]:
                item.add_marker(pytest.mark.skip(reason=missing[name]))
                break


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """`../shared/data` next to the repository (benchmark files, see its SOURCES.md); skips when absent."""
    path = (REPO.parent / "shared" / "data").resolve()
    if not path.is_dir():
        pytest.skip(f"shared benchmark data not found at {path}")
    return path
