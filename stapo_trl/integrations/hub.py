"""Hub checks a command runs before any model is built, as plain functions a script may call too: a model, a dataset
or a push that cannot work is one line in seconds, instead of transformers' and datasets' retries."""

from __future__ import annotations

import os


HUB_PROBE_TIMEOUT = 5.0  # seconds; `HF_HUB_ETAG_TIMEOUT` overrides it


def _no_answer(info, name: str, token, timeout: float | None) -> str | None:
    """`None` when `info(name)` (`HfApi.model_info` or `dataset_info`: one request, no retries) gets an HTTP answer
    (found or not), else the cause in a few words."""
    from huggingface_hub.errors import HfHubHTTPError

    timeout = timeout or float(os.environ.get("HF_HUB_ETAG_TIMEOUT") or HUB_PROBE_TIMEOUT)
    try:
        info(name, token=token, timeout=timeout)
    except HfHubHTTPError:  # the Hub answered: loading the repository says what is wrong with it
        return None
    except Exception as e:  # noqa: BLE001 (connection, DNS, proxy, timeout: no answer)
        return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0] or f'no answer in {timeout:g} s'}"
    return None


def check_hub_model(name: str, *, revision=None, token=None, what: str = "Model", timeout=None) -> None:
    """Refuse a model that must come from the Hub when the Hub cannot be used: a local path, a `builtin:` name or a Hub
    id in the local cache passes; otherwise `HF_HUB_OFFLINE=1` is refused, and else the Hub is asked once
    (`HfApi.model_info`, `timeout` seconds).

    Raises:
        FileNotFoundError: offline and not cached. ConnectionError: not cached and the Hub does not answer.
    """
    from huggingface_hub import HfApi, constants, try_to_load_from_cache

    from ..models.names import BUILTIN_MODELS

    name = os.fspath(name)
    if name.startswith("builtin:") or os.path.isdir(os.path.expanduser(name)) or os.path.isfile(name):
        return
    for filename in ("config.json", "adapter_config.json"):
        try:
            if isinstance(try_to_load_from_cache(name, filename, revision=revision), str):
                return
        except Exception:  # noqa: BLE001 (not a valid repo id: not cached)
            break
    instead = "Pass an existing directory (e.g. outputs/demo-stapo after `make demo`), a cached Hub id, or a built-in "
    instead += f"name ({', '.join('builtin:' + n for n in BUILTIN_MODELS)})"
    if constants.HF_HUB_OFFLINE:
        raise FileNotFoundError(
            f"{what} {name!r} is not a local directory, and as a Hub id it is not in the local Hugging Face cache "
            f"while HF_HUB_OFFLINE=1 (no download). {instead}."
        )
    if cause := _no_answer(lambda n, **kw: HfApi().model_info(n, revision=revision, **kw), name, token, timeout):
        raise ConnectionError(
            f"{what} {name!r} is not a local directory nor in the local Hugging Face cache, and the Hub at "
            f"{constants.ENDPOINT} does not answer ({cause}). {instead}; or download it where the Hub is reachable "
            f"(`hf download {name}`) and set HF_HUB_OFFLINE=1 to use the cache without asking the Hub."
        )


def check_hub_dataset(name: str, *, token=None, timeout=None) -> None:
    """[`check_hub_model`] for `dataset_name` (`HfApi.dataset_info`): a local path, a `datasets` builder name (`json`,
    `parquet`, ...) or a cached Hub dataset passes.

    Raises:
        FileNotFoundError: offline and not cached. ConnectionError: not cached and the Hub does not answer.
    """
    from datasets import config, packaged_modules
    from huggingface_hub import HfApi, constants

    cached = (
        os.path.join(constants.HF_HUB_CACHE, "datasets--" + name.replace("/", "--")),
        os.path.join(config.HF_DATASETS_CACHE, name.replace("/", "___")),
    )
    builders = getattr(packaged_modules, "_PACKAGED_DATASETS_MODULES", {})
    if name in builders or os.path.exists(os.path.expanduser(name)) or any(map(os.path.isdir, cached)):
        return
    instead = "Pass a local .json/.jsonl/.parquet file or folder, or builtin:tiny-math"
    if constants.HF_HUB_OFFLINE or config.HF_DATASETS_OFFLINE:
        raise FileNotFoundError(
            f"dataset_name={name!r} is not a local path, and as a Hub dataset it is not in the local cache while "
            f"offline (HF_HUB_OFFLINE=1 or HF_DATASETS_OFFLINE=1: no download). {instead}."
        )
    if cause := _no_answer(HfApi().dataset_info, name, token, timeout):
        raise ConnectionError(
            f"dataset_name={name!r} is not a local path nor in the local cache, and the Hub at {constants.ENDPOINT} "
            f"does not answer ({cause}). {instead}; or download it where the Hub is reachable "
            f"(`hf download --repo-type dataset {name}`) and set HF_HUB_OFFLINE=1."
        )


def check_hub_access(hub_model_id, output_dir: str, token=None, *, endpoint=None, network: bool = True) -> None:
    """Refuse a push that cannot work: offline mode, no token, or (`network`) a Hub that does not answer or refuses
    the token (`HfApi.whoami`). Nothing is created or uploaded.

    Raises:
        ConnectionError: `push_to_hub: cannot push to hub_model_id=...: <cause>. ... or pass --push_to_hub false`.
    """
    from huggingface_hub import HfApi, constants, get_token

    repo, endpoint = hub_model_id or os.path.basename(os.path.abspath(output_dir)), endpoint or constants.ENDPOINT
    cause = None
    if constants.HF_HUB_OFFLINE:
        cause = "offline mode is on (HF_HUB_OFFLINE=1)"
    elif not (token := token or get_token()):
        cause = "no Hub token (run `hf auth login`, or set HF_TOKEN or hub_token)"
    elif network:
        try:
            HfApi(endpoint=endpoint).whoami(token=token)
        except Exception as e:  # noqa: BLE001 (the cause is what matters)
            status = getattr(getattr(e, "response", None), "status_code", None)
            refused = f"refuses the token (HTTP {status})" if status in (401, 403) else "cannot be reached"
            cause = f"the Hub at {endpoint} {refused}" + (
                "" if status in (401, 403) else f" ({type(e).__name__}: {e})"
            )
    if cause:
        raise ConnectionError(
            f"push_to_hub: cannot push to hub_model_id={repo!r}: {cause}. Fix that, or pass --push_to_hub false to "
            f"train without pushing (the model, card and results stay in output_dir; upload them later with "
            f"`hf upload {repo} {output_dir}`)."
        )
