"""A causal LM for evaluation from a full model or a LoRA adapter folder; `trust_remote_code` is never set."""

from __future__ import annotations

import logging
import os
from collections import namedtuple


ModelSource = namedtuple("ModelSource", "base adapter", defaults=(None,))


def resolve_model_source(model: str) -> ModelSource:
    """`ModelSource(model)`, or `(base, adapter=model)` for an adapter folder; ValueError if it names no base."""
    if not os.path.isfile(os.path.join(model, "adapter_config.json")):
        return ModelSource(model)
    from peft import PeftConfig

    if not (base := PeftConfig.from_pretrained(model).base_model_name_or_path):
        raise ValueError(f"{model}/adapter_config.json names no base_model_name_or_path: its base model is unknown.")
    return ModelSource(base, adapter=model)


def load_causal_lm(model: str, *, revision: str | None = None, dtype=None):
    """`(model in eval mode, tokenizer)`, an adapter merged onto its base; ValueError as [`resolve_model_source`]."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source, kwargs = resolve_model_source(model), {"dtype": dtype} if dtype is not None else {}
    hub = {"revision": revision} if revision else {}
    if source.adapter is None:
        lm = AutoModelForCausalLM.from_pretrained(model, **hub, **kwargs)
        return lm.eval(), AutoTokenizer.from_pretrained(model, **hub)
    from peft import AutoPeftModelForCausalLM

    logging.getLogger(__name__).info("Loading the LoRA adapter %s onto its base model %s, merged", model, source.base)
    lm = AutoPeftModelForCausalLM.from_pretrained(model, **kwargs).merge_and_unload()
    has_tokenizer = any(os.path.isfile(os.path.join(model, f)) for f in ("tokenizer.json", "tokenizer_config.json"))
    return lm.eval(), AutoTokenizer.from_pretrained(model if has_tokenizer else source.base)
