"""Import, before any process group exists, the modules that capture the default process group at import time.

A module that writes `def f(group=dist.group.WORLD)` evaluates `group.WORLD` once, when it is imported. Imported
before `init_process_group`, the default is `None` (the default group, looked up at call time). Imported after, the
default *is* the group object, so `destroy_process_group()` can never free it: its gloo threads outlive the run and
about one process exit in 15 aborts in C++ teardown ("terminate called without an active exception", SIGABRT)
after everything was written. transformers, accelerate and TRL import these modules lazily while a trainer is built,
which in a training script is after the group exists (creating a `STAPOConfig` / `GRPOConfig` creates it).
"""

from __future__ import annotations

import importlib
import importlib.util


# Modules whose import evaluates the default process group in a default argument (torch 2.13, DeepSpeed 0.19).
GROUP_CAPTURING_MODULES = ("torch.distributed.nn.functional", "deepspeed.comm.torch")


def import_group_capturing_modules() -> None:
    """Import [`GROUP_CAPTURING_MODULES`] (the installed ones) if no process group exists yet; else do nothing.

    Called when `stapo_trl.config` is imported, i.e. before any `STAPOConfig` can exist.
    """
    import torch.distributed

    if not torch.distributed.is_available() or torch.distributed.is_initialized():
        return
    for name in GROUP_CAPTURING_MODULES:
        if importlib.util.find_spec(name.split(".")[0]) is not None:
            importlib.import_module(name)
