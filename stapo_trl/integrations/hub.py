"""Checks a command runs before any model is built, as plain functions a script may call too: Hub access for a model,
a dataset or a push (one line in seconds, instead of transformers' and datasets' retries), and the prompt-token budget
(prompts longer than the model's positions minus the generation budget are dropped, with one line)."""

from __future__ import annotations

import json
import logging
import os


logger = logging.getLogger(__name__)

HUB_PROBE_TIMEOUT = 5.0  # seconds; `HF_HUB_ETAG_TIMEOUT` overrides it
_POSITION_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def _no_answer(url: str, token=None, timeout: float | None = None) -> str | None:
    """One `HEAD` request to the Hub (no retries): `None` on any HTTP answer, else the cause in a few words."""
    from huggingface_hub.utils import build_hf_headers, get_session

    if timeout is None:
        timeout = float(os.environ.get("HF_HUB_ETAG_TIMEOUT") or HUB_PROBE_TIMEOUT)
    try:
        get_session().head(url, headers=build_hf_headers(token=token), timeout=timeout, follow_redirects=True)
    except Exception as e:  # noqa: BLE001 (connection, DNS, proxy, timeout: no answer)
        cause = str(e).splitlines()[0] if str(e) else ""
        return f"{type(e).__name__}: {cause or f'no answer in {timeout:g} s'}"
    return None


def check_hub_model(name: str, *, revision=None, token=None, what: str = "Model", timeout=None) -> None:
    """Refuse a model that must come from the Hub when the Hub cannot be used: a local path, a `builtin:` name or a Hub
    id in the local cache passes; otherwise `HF_HUB_OFFLINE=1` is refused, and else the Hub is asked once.

    Raises:
        FileNotFoundError: offline and not cached. ConnectionError: not cached and the Hub does not answer.
    """
    from huggingface_hub import constants, hf_hub_url, try_to_load_from_cache

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
    instead = (
        "Pass an existing directory (e.g. outputs/demo-stapo after `make demo`), a cached Hub id, or a built-in name ("
        + ", ".join("builtin:" + n for n in BUILTIN_MODELS)
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


def check_hub_dataset(name: str, *, token=None, timeout=None) -> None:
    """[`check_hub_model`] for `dataset_name`: a local path, a `datasets` builder name (`json`, `parquet`, ...) or a
    cached Hub dataset passes.

    Raises:
        FileNotFoundError: offline and not cached. ConnectionError: not cached and the Hub does not answer.
    """
    from datasets import config, packaged_modules
    from huggingface_hub import constants

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
    if cause := _no_answer(f"{constants.ENDPOINT}/api/datasets/{name}", token, timeout):
        raise ConnectionError(
            f"dataset_name={name!r} is not a local path nor in the local cache, and the Hub at {constants.ENDPOINT} "
            f"does not answer ({cause}). {instead}; or download it where the Hub is reachable "
            f"(`hf download --repo-type dataset {name}`) and set HF_HUB_OFFLINE=1."
        )


def check_hub_access(hub_model_id, output_dir: str, token=None, *, endpoint=None, network: bool = True) -> None:
    """Refuse a push that cannot work: offline mode, no token, or (`network`) a Hub that does not answer or refuses
    the token (`whoami`). Nothing is created or uploaded.

    Raises:
        ConnectionError: `push_to_hub: cannot push to hub_model_id=...: <cause>. ... or pass --push_to_hub false`.
    """
    from huggingface_hub import HfApi, constants, get_token

    repo = hub_model_id or os.path.basename(os.path.abspath(output_dir))

    def fail(cause: str) -> ConnectionError:
        return ConnectionError(
            f"push_to_hub: cannot push to hub_model_id={repo!r}: {cause}. Fix that, or pass --push_to_hub false to "
            "train without pushing (the model, card and results stay in output_dir; upload them later with "
            f"`hf upload {repo} {output_dir}`)."
        )

    if constants.HF_HUB_OFFLINE:
        raise fail("offline mode is on (HF_HUB_OFFLINE=1)")
    if not (token := token or get_token()):
        raise fail("no Hub token (run `hf auth login`, or set HF_TOKEN or hub_token)")
    if network:
        endpoint = endpoint or constants.ENDPOINT
        try:
            HfApi(endpoint=endpoint).whoami(token=token)
        except Exception as e:  # noqa: BLE001 (the cause is what matters)
            status = getattr(getattr(e, "response", None), "status_code", None)
            if status in (401, 403):
                raise fail(f"the Hub at {endpoint} refuses the token (HTTP {status})") from e
            raise fail(f"the Hub at {endpoint} cannot be reached ({type(e).__name__}: {e})") from e


def model_max_positions(config) -> int | None:
    """The positions a model attends over: a vLLM engine's `max_model_len`, else the first positive
    `max_position_embeddings` / `n_positions` / `max_sequence_length` / `seq_length` of a config (object or dict),
    a model (its `.config`) or a folder (its `config.json`); `None` when unknown."""
    engine = getattr(getattr(config, "llm", config), "llm_engine", None)
    if isinstance(length := getattr(getattr(engine, "model_config", None), "max_model_len", None), int):
        return length
    if isinstance(config, (str, os.PathLike)):
        try:
            with open(os.path.join(config, "config.json"), encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError):
            return None
    config = getattr(config, "model", config)  # an evaluation generator holds its model
    config = getattr(config, "config", config)
    for name in _POSITION_FIELDS:
        value = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def prompt_token_budget(max_positions: int | None, max_new_tokens: int, max_prompt_tokens: int | None = None):
    """The longest prompt (tokens) that leaves `max_new_tokens` positions: `min(max_positions - max_new_tokens,
    max_prompt_tokens)` over the known terms, `None` when neither is known.

    Raises:
        ValueError: `max_new_tokens >= max_positions`, or `max_prompt_tokens < 1`.
    """
    if max_prompt_tokens is not None and max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens={max_prompt_tokens!r} must be a positive number of tokens.")
    budgets = [] if max_prompt_tokens is None else [max_prompt_tokens]
    if max_positions is not None:
        if max_new_tokens >= max_positions:
            raise ValueError(
                f"max_new_tokens={max_new_tokens} leaves no room for a prompt: the model has {max_positions} "
                f"positions (prompt + completion); give a budget below {max_positions}."
            )
        budgets.append(max_positions - max_new_tokens)
    return min(budgets) if budgets else None


def config_max_positions(name_or_path: str, revision: str | None = None) -> int | None:
    """[`model_max_positions`] of a model argument without loading it: a local folder, a built `builtin:` model or a
    Hub id in the local cache; `None` when no `config.json` is here."""
    if name_or_path.startswith("builtin:"):
        from ..models.names import builtin_model_dir

        try:
            return model_max_positions(builtin_model_dir(name_or_path))
        except (KeyError, ValueError):
            return None
    if os.path.isdir(os.path.expanduser(name_or_path)):
        return model_max_positions(os.path.expanduser(name_or_path))
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(name_or_path, "config.json", revision=revision)
    except Exception:  # noqa: BLE001 (not a valid repo id: nothing cached)
        return None
    return model_max_positions(os.path.dirname(cached)) if isinstance(cached, str) else None


def count_prompt_tokens(prompt_texts: list[str], tokenizer) -> list[int]:
    """Token counts of rendered prompt texts (chat template applied), without special tokens."""
    return [len(ids) for ids in tokenizer(list(prompt_texts), add_special_tokens=False)["input_ids"]]


def report_dropped(total: int, kept: int, budget: int | None, what: str = "prompts") -> None:
    """One warning line when prompts longer than `budget` tokens were dropped.

    Raises:
        ValueError: every prompt was dropped.
    """
    if kept == total:
        return
    if not kept:
        raise ValueError(
            f"All {total} {what} are longer than {budget} tokens: raise max_prompt_tokens, lower the generation "
            "budget, or use a model with more positions."
        )
    logger.warning("Dropped %d of %d %s longer than %d tokens (max_prompt_tokens).", total - kept, total, what, budget)


def keep_short_prompts(lengths: list[int], budget: int | None, what: str = "prompts") -> list[int]:
    """The indices of the prompts of at most `budget` tokens ([`report_dropped`] says what was dropped)."""
    keep = list(range(len(lengths))) if budget is None else [i for i, n in enumerate(lengths) if n <= budget]
    report_dropped(len(lengths), len(keep), budget, what)
    return keep
