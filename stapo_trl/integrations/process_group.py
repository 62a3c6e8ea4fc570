"""Keep nothing holding the process group when it is destroyed: a gloo group held through `destroy_process_group()`
keeps threads that outlive the run, and about one process exit in 15 then aborts in C++ teardown (SIGABRT). Holders:
a module with `def f(group=dist.group.WORLD)` imported after `init_process_group` (transformers, accelerate and TRL
import such modules while a trainer is built: [`import_group_capturing_modules`] imports them first), a trained
trainer's DDP wrapper ([`release_process_group`]), a process ending on an input error
([`destroy_process_group_if_any`]).
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import os
import sys

from .upstream_warnings import quiet_upstream_imports


# Modules whose import evaluates the default process group in a default argument (torch 2.13, DeepSpeed 0.19).
GROUP_CAPTURING_MODULES = ("torch.distributed.nn.functional", "deepspeed.comm.torch")


def import_group_capturing_modules() -> None:
    """Import the installed [`GROUP_CAPTURING_MODULES`] if no process group exists yet; the environment, warning
    filters and loggers stay as they were ([`quiet_upstream_imports`]). Called when `stapo_trl.config` is imported."""
    import torch.distributed

    if not torch.distributed.is_available() or torch.distributed.is_initialized():
        return
    environ = dict(os.environ)
    with quiet_upstream_imports():
        for name in [n for n in GROUP_CAPTURING_MODULES if importlib.util.find_spec(n.split(".")[0]) is not None]:
            importlib.import_module(name)
    for key in os.environ.keys() - environ.keys():  # DeepSpeed sets PYTORCH_NVML_BASED_CUDA_CHECK
        del os.environ[key]


def release_process_group(trainer) -> None:
    """Drop a `Trainer`'s DDP wrapper (its reducer holds the group), then `accelerator.end_training()` (trackers
    finished, group destroyed): `trainer.model` stays usable for inference and saving, nothing may communicate. A
    DeepSpeed engine (its parameters' hooks hold its groups anyway) or an FSDP model is left as it is."""
    if not (getattr(trainer, "is_deepspeed_enabled", False) or getattr(trainer, "is_fsdp_enabled", False)):
        trainer.model_wrapped = trainer.model
        gc.collect()  # the wrapper sits in reference cycles
    trainer.accelerator.end_training()


def destroy_process_group_if_any() -> None:
    """Destroy this process's default process group if it has one (a local call, no collective: each rank that stops
    on an input error calls it by itself). Does not import torch when nothing has."""
    if "torch" not in sys.modules:
        return
    import torch.distributed

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
