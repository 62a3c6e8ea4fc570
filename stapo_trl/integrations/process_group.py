"""Nothing may hold the process group when it is destroyed: gloo's threads would outlive it (~1 exit in 15 aborts)."""

from __future__ import annotations

import importlib.util
import os
import sys


def import_group_capturing_modules() -> None:
    """Import installed torch and DeepSpeed modules that capture the default group before one exists (env kept)."""
    import torch.distributed

    if not torch.distributed.is_available() or torch.distributed.is_initialized():
        return
    environ = dict(os.environ)  # DeepSpeed sets variables
    for name in ("torch.distributed.nn.functional", "deepspeed.comm.torch"):
        if importlib.util.find_spec(name.split(".")[0]) is not None:
            importlib.import_module(name)
    for key in os.environ.keys() - environ.keys():
        del os.environ[key]


def destroy_process_group_if_any() -> None:
    """Destroy this process's default process group, if any (a local call, no collective), importing nothing."""
    dist = getattr(sys.modules.get("torch"), "distributed", None)
    if dist and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
