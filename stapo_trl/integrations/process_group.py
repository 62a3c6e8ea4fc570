"""Nothing may hold the process group when it is destroyed: a gloo group's threads then outlive the run, and about one
process exit in 15 aborts in C++ teardown (SIGABRT) after everything was written. Two holders: modules that capture
the group in a default argument (`def f(group=dist.group.WORLD)`) when imported after it exists, and a trained
trainer's DDP wrapper."""

from __future__ import annotations

import gc
import importlib
import importlib.util
import os
import sys


def import_group_capturing_modules() -> None:
    """Import torch's and DeepSpeed's modules that capture the default group (those installed) before a process group
    exists (TRL imports DeepSpeed's while a trainer is built, in a DDP run too); the environment is left as it was."""
    import torch.distributed

    if not torch.distributed.is_available() or torch.distributed.is_initialized():
        return
    environ = dict(os.environ)  # DeepSpeed sets variables
    for name in ("torch.distributed.nn.functional", "deepspeed.comm.torch"):
        if importlib.util.find_spec(name.split(".")[0]) is not None:
            importlib.import_module(name)
    for key in os.environ.keys() - environ.keys():
        del os.environ[key]


def release_process_group(trainer) -> None:
    """Drop a trained `Trainer`'s DDP wrapper (its reducer holds the group; a DeepSpeed engine or an FSDP model is left
    as it is), then end training (trackers, the process group). `trainer.model` stays usable; nothing may communicate
    afterwards."""
    if not (getattr(trainer, "is_deepspeed_enabled", False) or getattr(trainer, "is_fsdp_enabled", False)):
        trainer.model_wrapped = trainer.model
        gc.collect()  # the wrapper sits in reference cycles
    trainer.accelerator.end_training()


def destroy_process_group_if_any() -> None:
    """Destroy this process's default process group, if any (a local call, no collective), importing nothing."""
    if "torch" in sys.modules:
        import torch.distributed

        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
