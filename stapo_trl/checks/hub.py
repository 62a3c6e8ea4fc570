"""Before anything is built: can a run reach the Hub for what it needs from there?

- [`check_hub_model`]: a model given as a Hub id must be in the local Hugging Face cache, or the Hub must answer.
  Without either, transformers retried `config.json` for ~50 s (after the dataset was prepared) and ended on a
  two-line message; this answers in seconds, in one line that names `HF_HUB_OFFLINE` and local paths.
- [`check_hub_dataset`]: the same for `dataset_name` given as a Hub id (`datasets` retried for ~35 s, then named
  neither the field nor a way out).
- [`check_hub_access`]: `push_to_hub: true` without network used to fail only while the trainer was built (a 60-line
  traceback, after the data and the model were loaded), or at the very end. It answers first, in one line that names
  `hub_model_id`, the cause and the way out (`--push_to_hub false`).
"""

from __future__ import annotations

import os


# Seconds to wait for the Hub's answer about a model that is not cached; `HF_HUB_ETAG_TIMEOUT` (huggingface_hub's
# timeout for metadata requests) overrides it when set.
HUB_PROBE_TIMEOUT = 5.0
# The files that make a cached model: a full model, or a PEFT adapter on its base.
_MODEL_FILES = ("config.json", "adapter_config.json")


def _no_answer(url: str, token: str | bool | None, timeout: float | None) -> str | None:
    """Ask the Hub about `url` once (`HEAD`, no retries): `None` on any HTTP answer, else the cause in a few words.
    `timeout` defaults to `HF_HUB_ETAG_TIMEOUT` when set, else [`HUB_PROBE_TIMEOUT`]."""
    from huggingface_hub.utils import build_hf_headers, get_session

    if timeout is None:
        timeout = float(os.environ.get("HF_HUB_ETAG_TIMEOUT") or HUB_PROBE_TIMEOUT)
    try:
        get_session().head(url, headers=build_hf_headers(token=token), timeout=timeout, follow_redirects=True)
    except Exception as e:  # noqa: BLE001 (httpx's connection, DNS, proxy and timeout errors: no answer)
        cause = str(e).splitlines()[0] if str(e) else ""
        return f"{type(e).__name__}: {cause or f'no answer in {timeout:g} s'}"
    return None


def is_in_hub_cache(repo_id: str, revision: str | None = None) -> bool:
    """Whether the local Hugging Face cache holds `repo_id` (its `config.json`, or an adapter's `adapter_config.json`)
    at `revision` (`None`: the default branch); an invalid repo id is not cached."""
    from huggingface_hub import try_to_load_from_cache

    for filename in _MODEL_FILES:
        try:
            if isinstance(try_to_load_from_cache(repo_id, filename, revision=revision), str):
                return True
        except Exception:  # noqa: BLE001 (an invalid repo id: not cached)
            return False
    return False


def check_hub_model(
    name_or_path: str,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    what: str = "Model",
    timeout: float | None = None,
) -> None:
    """Refuse a model that would have to come from the Hub when the Hub cannot be used, before any data is loaded.

    A name that is a local directory or a `builtin:` name passes, as does a Hub id in the local Hugging Face cache.
    Any other name is a Hub id that transformers would download: refused with `HF_HUB_OFFLINE=1`, else the Hub is
    asked once about its `config.json` (one `HEAD` request, no retries, `timeout` seconds); any HTTP answer passes (a
    missing or private repository is transformers' to report), no answer is refused.

    Args:
        name_or_path (`str`): a model argument (after `builtin:` names are resolved, or not).
        revision (`str`, *optional*): the Hub revision (branch, tag or commit).
        token (`str` or `bool`, *optional*): as `huggingface_hub` takes it (`None`: the stored login or `HF_TOKEN`).
        what (`str`, *optional*, defaults to `"Model"`): how the message names the model (`"Reward model"`).
        timeout (`float`, *optional*): seconds to wait for the Hub; defaults to `HF_HUB_ETAG_TIMEOUT` when set, else
            [`HUB_PROBE_TIMEOUT`] (5 s).

    Raises:
        FileNotFoundError: offline (`HF_HUB_OFFLINE=1`) and not cached.
        ConnectionError: not cached and the Hub does not answer (no network, an unreachable `HF_ENDPOINT`, a
            timeout). Both are one line naming the model, `HF_HUB_OFFLINE`, and what to pass instead.
    """
    from huggingface_hub import constants, hf_hub_url

    from ..models.names import BUILTIN_MODELS, BUILTIN_PREFIX

    name = os.fspath(name_or_path)
    if name.startswith(BUILTIN_PREFIX) or os.path.isdir(os.path.expanduser(name)) or os.path.isfile(name):
        return
    if is_in_hub_cache(name, revision):
        return
    instead = (
        "Pass an existing directory (e.g. outputs/demo-stapo after `make demo`), a cached Hub id, or a built-in name ("
        + ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS)
        + ")"
    )
    if constants.HF_HUB_OFFLINE:
        raise FileNotFoundError(
            f"{what} {name!r} is not a local directory, and as a Hub id it is not in the local Hugging Face cache "
            f"while HF_HUB_OFFLINE=1 (no download). {instead}."
        )
    url = hf_hub_url(name, "config.json", revision=revision, endpoint=constants.ENDPOINT)
    if cause := _no_answer(url, token, timeout):
        raise ConnectionError(
            f"{what} {name!r} is not a local directory nor in the local Hugging Face cache, and the Hub at "
            f"{constants.ENDPOINT} does not answer ({cause}). {instead}; or download it where the Hub is reachable "
            f"(`hf download {name}`) and set HF_HUB_OFFLINE=1 to use the cache without asking the Hub."
        )


def _is_dataset_cached(repo_id: str) -> bool:
    """Whether `repo_id` was downloaded before: its folder in the Hugging Face Hub cache or in the `datasets` cache."""
    from datasets import config
    from huggingface_hub import constants

    hub_folder = os.path.join(constants.HF_HUB_CACHE, "datasets--" + repo_id.replace("/", "--"))
    datasets_folder = os.path.join(config.HF_DATASETS_CACHE, repo_id.replace("/", "___"))
    return os.path.isdir(hub_folder) or os.path.isdir(datasets_folder)


def check_hub_dataset(name: str, *, token: str | bool | None = None, timeout: float | None = None) -> None:
    """Refuse a `dataset_name` that would have to come from the Hub when the Hub cannot be used, before any download.

    A local path, a `datasets` packaged builder (`json`, `parquet`, ... with `data_files`) and a Hub id found in the
    Hub or `datasets` cache pass. Any other name is a Hub id: refused with `HF_HUB_OFFLINE=1` (or
    `HF_DATASETS_OFFLINE=1`), else the Hub is asked once about it (one `HEAD` request, no retries, `timeout` seconds);
    any HTTP answer passes (a missing or private dataset is `datasets`' to report), no answer is refused.

    Args:
        name (`str`): the `dataset_name` argument (not `builtin:` and not a local `.json`/`.jsonl`/`.parquet` file).
        token (`str` or `bool`, *optional*): as `huggingface_hub` takes it (`None`: the stored login or `HF_TOKEN`).
        timeout (`float`, *optional*): seconds to wait for the Hub; defaults to `HF_HUB_ETAG_TIMEOUT` when set, else
            [`HUB_PROBE_TIMEOUT`] (5 s).

    Raises:
        FileNotFoundError: offline and not cached.
        ConnectionError: not cached and the Hub does not answer. Both are one line naming `dataset_name`.
    """
    from datasets import config, packaged_modules
    from huggingface_hub import constants

    builders = getattr(packaged_modules, "_PACKAGED_DATASETS_MODULES", {})  # json, csv, parquet, ... (datasets 5.2)
    if name in builders or os.path.exists(os.path.expanduser(name)) or _is_dataset_cached(name):
        return
    instead = "Pass a local .json/.jsonl/.parquet file or folder, or builtin:tiny-math"
    if constants.HF_HUB_OFFLINE or config.HF_DATASETS_OFFLINE:
        raise FileNotFoundError(
            f"dataset_name={name!r} is not a local path, and as a Hub dataset it is not in the local cache while "
            f"offline (HF_HUB_OFFLINE=1 or HF_DATASETS_OFFLINE=1: no download). {instead}."
        )
    if cause := _no_answer(f"{constants.ENDPOINT}/api/datasets/{name}", token, timeout):
        raise ConnectionError(
            f"dataset_name={name!r} is not a local path nor in the local cache, and the Hub at {constants.ENDPOINT} "
            f"does not answer ({cause}). {instead}; or download it where the Hub is reachable "
            f"(`hf download --repo-type dataset {name}`) and set HF_HUB_OFFLINE=1."
        )


def default_hub_model_id(output_dir: str) -> str:
    """The repository `Trainer` pushes to when `hub_model_id` is not set: the name of `output_dir`."""
    return os.path.basename(os.path.abspath(output_dir))


def check_hub_access(
    hub_model_id: str | None,
    output_dir: str,
    token: str | None = None,
    *,
    endpoint: str | None = None,
    network: bool = True,
) -> None:
    """Raise one `ConnectionError` line when a push to the Hub cannot work: offline mode, no token, the Hub not
    reachable, or a token it refuses. Nothing is created or uploaded.

    Args:
        hub_model_id (`str` or `None`): the repository (`None`: the name of `output_dir`, as `Trainer` does).
        output_dir (`str`): the run's folder.
        token (`str`, *optional*): `hub_token`; `None` uses the stored login or `HF_TOKEN`.
        endpoint (`str`, *optional*): the Hub's URL; `None` uses `HF_ENDPOINT` (default https://huggingface.co).
        network (`bool`, *optional*, defaults to `True`): also ask the Hub who the token belongs to (`whoami`, one
            request); `False` checks only offline mode and the token's presence (the dry run).

    Raises:
        ConnectionError: "push_to_hub: cannot push to hub_model_id='...': <cause>. ... or pass --push_to_hub false".
    """
    from huggingface_hub import HfApi, constants, get_token

    repo = hub_model_id or default_hub_model_id(output_dir)

    def fail(cause: str) -> ConnectionError:
        return ConnectionError(
            f"push_to_hub: cannot push to hub_model_id={repo!r}: {cause}. Fix that, or pass --push_to_hub false to "
            "train without pushing (the model, card and results stay in output_dir; upload them later with "
            f"`hf upload {repo} {output_dir}`)."
        )

    if constants.HF_HUB_OFFLINE:
        raise fail("offline mode is on (HF_HUB_OFFLINE=1)")
    token = token or get_token()
    if not token:
        raise fail("no Hub token (run `hf auth login`, or set HF_TOKEN or hub_token)")
    if not network:
        return
    endpoint = endpoint or constants.ENDPOINT
    try:
        HfApi(endpoint=endpoint).whoami(token=token)
    except Exception as e:  # noqa: BLE001 (httpx / requests / huggingface_hub errors: the cause is what matters)
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status in (401, 403):
            raise fail(f"the Hub at {endpoint} refuses the token (HTTP {status})") from e
        raise fail(f"the Hub at {endpoint} cannot be reached ({type(e).__name__}: {e})") from e


__all__ = ["check_hub_access", "check_hub_dataset", "check_hub_model", "default_hub_model_id", "is_in_hub_cache"]
