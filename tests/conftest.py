"""Fixtures of every test file: tiny offline models, the shared benchmark data, one torch thread, a guard that no
model is built before an input error. The tiny-math models come from the user's cache (`$STAPO_TRL_CACHE`, else
`~/.cache/stapo_trl`, as `make demo` uses): built once (~40 s); `STAPO_TRL_TEST_MODEL` names another model."""

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


torch.set_num_threads(1)  # for the session and module fixtures too


@pytest.fixture(autouse=True)
def single_torch_thread():
    """One torch thread per test, whatever an earlier test set: a ~140k-parameter model on 2 busy cores runs ~10x
    slower on two threads."""
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def builtin_cache_dir(tmp_path_factory) -> Path:
    """A session-private cache for `builtin:` models: the tests build into it (`STAPO_TRL_CACHE` is never touched)."""
    return tmp_path_factory.mktemp("stapo_trl_cache")


@pytest.fixture(scope="session")
def tiny_math_model_path() -> str:
    """`builtin:tiny-math` (a tiny Qwen3 at ~45 % sampled accuracy on two-digit addition), or `STAPO_TRL_TEST_MODEL`."""
    return resolve_model_path(os.environ.get("STAPO_TRL_TEST_MODEL") or "builtin:tiny-math")


@pytest.fixture(scope="session")
def tiny_random_model_path(builtin_cache_dir) -> str:
    """`builtin:tiny-random`: tiny-math's tokenizer and architecture, random weights (~2 s)."""
    return resolve_model_path("builtin:tiny-random", cache_dir=builtin_cache_dir)


@pytest.fixture(scope="session")
def tiny_math_h64_model_path() -> str:
    """`builtin:tiny-math-h64` (head_dim 64, for vLLM's CPU attention), or `STAPO_TRL_TEST_VLLM_MODEL`."""
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
    """`builtin:smollm2-135m` converted into the session's cache (~1-2 min; `real_model` tests, which need its wheel)."""
    return resolve_model_path("builtin:smollm2-135m", cache_dir=builtin_cache_dir)


def pytest_collection_modifyitems(config, items):
    """Skip `vllm` tests without vLLM (`make test-vllm`) and `real_model(*names)` tests without a named model's wheels
    (the reason names the install command)."""
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
