"""Load a causal LM from a full model folder, a Hub id, or a LoRA adapter folder (a `--use_peft` run's output).

A LoRA run's output folder holds `adapter_config.json` and `adapter_model.safetensors`, and often a `config.json`
too, so `AutoModelForCausalLM.from_pretrained(folder)` looks for a `model.safetensors` that is not there. Here an
adapter folder is recognised by its `adapter_config.json`, its base model (`base_model_name_or_path`, or the one
given) is loaded, and the adapter is applied with PEFT and merged (generation then runs at the base model's speed).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass


logger = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"


@dataclass(frozen=True)
class ModelSource:
    """Where the weights come from.

    Args:
        base (`str`): the full model to load (a folder or a Hub id).
        adapter (`str` or `None`): the PEFT adapter folder applied on top, `None` for a full model.
    """

    base: str
    adapter: str | None = None


def resolve_model_source(model: str, base_model: str | None = None) -> ModelSource:
    """Tell a full model from a PEFT adapter folder, and find the adapter's base model.

    Args:
        model (`str`): a local folder or a Hub id.
        base_model (`str`, *optional*): the base model to put the adapter on, overriding the adapter's own
            `base_model_name_or_path` (e.g. when the base was trained from a local folder that has moved).

    Returns:
        [`ModelSource`]: `ModelSource(model)` for a full model; `ModelSource(base, adapter=model)` for an adapter.

    Raises:
        ValueError: `model` is an adapter folder whose `adapter_config.json` names no `base_model_name_or_path`
            and no `base_model` is given, or the file is not valid JSON.
    """
    config_path = os.path.join(model, ADAPTER_CONFIG)
    if not os.path.isfile(config_path):
        return ModelSource(model)
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{config_path}: cannot read the adapter config ({e}).") from e
    base = base_model or config.get("base_model_name_or_path")
    if not base:
        raise ValueError(
            f"{config_path} names no base_model_name_or_path; pass the base model explicitly (base_model=...)."
        )
    return ModelSource(base, adapter=model)


def load_causal_lm(
    model: str,
    *,
    revision: str | None = None,
    dtype=None,
    base_model: str | None = None,
    merge: bool = True,
):
    """Load `(model, tokenizer)` from a full model or a LoRA adapter folder, and say which base was used.

    Args:
        model (`str`): a local folder or a Hub id; a folder with `adapter_config.json` is a PEFT adapter.
        revision (`str`, *optional*): Hub revision of the full model (of the base model for an adapter).
        dtype (`torch.dtype` or `str`, *optional*): weights dtype, passed to `from_pretrained`.
        base_model (`str`, *optional*): see [`resolve_model_source`].
        merge (`bool`): merge the adapter into the base weights (`merge_and_unload`) after loading.

    Returns:
        `tuple`: the `transformers` causal LM (in eval mode) and its tokenizer. For an adapter the tokenizer is read
        from the adapter folder when it holds one (a training run saves it there), else from the base model.

    Raises:
        ValueError: see [`resolve_model_source`].
        ImportError: an adapter folder without `peft` installed.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = resolve_model_source(model, base_model)
    kwargs = {"revision": revision} if revision else {}
    if dtype is not None:
        kwargs["dtype"] = dtype
    if source.adapter is None:
        lm = AutoModelForCausalLM.from_pretrained(source.base, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(source.base, **({"revision": revision} if revision else {}))
        return lm.eval(), tokenizer
    try:
        from peft import PeftModel
    except ImportError as e:
        raise ImportError(f"{model} is a PEFT adapter folder; loading it needs `pip install peft`.") from e
    message = f"Loading the LoRA adapter {source.adapter} onto its base model {source.base}"
    logger.info(message)
    print(message, flush=True)
    base = AutoModelForCausalLM.from_pretrained(source.base, **kwargs)
    lm = PeftModel.from_pretrained(base, source.adapter)
    if merge:
        lm = lm.merge_and_unload()
    has_tokenizer = any(
        os.path.isfile(os.path.join(source.adapter, f)) for f in ("tokenizer.json", "tokenizer_config.json")
    )
    tokenizer = AutoTokenizer.from_pretrained(
        source.adapter if has_tokenizer else source.base,
        **({"revision": revision} if revision and not has_tokenizer else {}),
    )
    return lm.eval(), tokenizer


__all__ = ["ModelSource", "load_causal_lm", "resolve_model_source"]
