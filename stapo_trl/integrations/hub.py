"""Hub checks run before any model is built: a model, dataset or push that cannot work is one line in seconds."""

from __future__ import annotations

import contextlib
import functools
import os


def _refuse(subject: str, offline: str | None, info, timeout, instead: str, download: str) -> None:
    from huggingface_hub import constants, errors

    if offline:
        raise FileNotFoundError(f"{subject}, and not in the local Hugging Face cache while offline, {offline} (no "
                                f"download). {instead}.")  # fmt: skip
    timeout = timeout or float(os.environ.get("HF_HUB_ETAG_TIMEOUT") or 5.0)  # seconds
    try:
        info(timeout=timeout)
    except errors.HfHubHTTPError:  # the Hub answered: loading the repository says what is wrong with it
        pass
    except Exception as e:  # noqa: BLE001 (connection, DNS, proxy, timeout: no answer)
        cause = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0] or f'no answer in {timeout:g} s'}"
        raise ConnectionError(f"{subject} nor in the local Hugging Face cache, and the Hub at {constants.ENDPOINT} "
            f"does not answer ({cause}). {instead}; or download it where the Hub is reachable (`{download}`) and set "
            "HF_HUB_OFFLINE=1 to use the cache without asking the Hub.") from None  # fmt: skip


def check_hub_model(name: str, *, revision=None, timeout=None) -> None:
    """A local path, `builtin:` name or cached Hub id passes; else `FileNotFoundError` when offline, `ConnectionError`
    when the Hub, asked once (`HfApi.model_info`, `timeout` s), does not answer."""
    from huggingface_hub import HfApi, constants, try_to_load_from_cache

    from ..models.names import BUILTIN_MODELS

    name = os.fspath(name)
    if name.startswith("builtin:") or os.path.exists(os.path.expanduser(name)):
        return
    with contextlib.suppress(Exception):  # not a valid repo id: not cached
        for filename in ("config.json", "adapter_config.json"):
            if isinstance(try_to_load_from_cache(name, filename, revision=revision), str):
                return
    instead = "Pass an existing directory (e.g. outputs/demo-stapo after `make demo`), a cached Hub id, or a built-in "
    instead += f"name ({', '.join('builtin:' + n for n in BUILTIN_MODELS)})"
    info = functools.partial(HfApi().model_info, name, revision=revision)
    offline = constants.HF_HUB_OFFLINE and "HF_HUB_OFFLINE=1"
    _refuse(f"Model {name!r} is not a local directory", offline, info, timeout, instead, f"hf download {name}")


def check_hub_dataset(name: str, *, timeout=None) -> None:
    """[`check_hub_model`] for a dataset: a local path, a `datasets` builder name or a cached Hub dataset passes."""
    from datasets import config, packaged_modules
    from huggingface_hub import HfApi, constants

    cached = [os.path.join(constants.HF_HUB_CACHE, "datasets--" + name.replace("/", "--"))]
    cached += [os.path.join(config.HF_DATASETS_CACHE, name.replace("/", "___"))]
    builders = getattr(packaged_modules, "_PACKAGED_DATASETS_MODULES", {})
    if name in builders or os.path.exists(os.path.expanduser(name)) or any(map(os.path.isdir, cached)):
        return
    offline = (constants.HF_HUB_OFFLINE or config.HF_DATASETS_OFFLINE) and "HF_HUB_OFFLINE=1 or HF_DATASETS_OFFLINE=1"
    instead = "Pass a local .json/.jsonl/.parquet file or folder, or builtin:tiny-math"
    subject, info = f"dataset_name={name!r} is not a local path", functools.partial(HfApi().dataset_info, name)
    _refuse(subject, offline, info, timeout, instead, f"hf download --repo-type dataset {name}")


def check_hub_access(hub_model_id, output_dir: str, token=None, *, endpoint=None, network: bool = True) -> None:
    """One-line `ConnectionError` for an impossible push: offline, no token, or (`network`) `HfApi.whoami` fails."""
    from huggingface_hub import HfApi, constants, get_token

    repo, cause = hub_model_id or os.path.basename(os.path.abspath(output_dir)), None
    if constants.HF_HUB_OFFLINE:
        cause = "offline mode is on (HF_HUB_OFFLINE=1)"
    elif not (token := token or get_token()):
        cause = "no Hub token (run `hf auth login`, or set HF_TOKEN or hub_token)"
    elif network:
        try:
            HfApi(endpoint=endpoint).whoami(token=token)
        except Exception as e:  # noqa: BLE001 (the cause is what matters)
            status, error = getattr(getattr(e, "response", None), "status_code", None), f"{type(e).__name__}: {e}"
            why = f"refuses the token (HTTP {status})" if status in (401, 403) else f"cannot be reached ({error})"
            cause = f"the Hub at {endpoint or constants.ENDPOINT} {why}"
    if cause:
        raise ConnectionError(f"push_to_hub: cannot push to hub_model_id={repo!r}: {cause}. Fix that, or pass "
                              "--push_to_hub false to train without pushing (the model, card and results stay in "
                              f"output_dir; upload them later with `hf upload {repo} {output_dir}`).")  # fmt: skip
