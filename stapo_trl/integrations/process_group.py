"""Keep nothing holding the process group when it is destroyed, so that gloo's threads stop and the process exits.

Held through `destroy_process_group()`, a gloo group's threads outlive the run and about one process exit in 15
aborts in C++ teardown ("terminate called without an active exception", SIGABRT) after everything was written. Two
holders are known and handled here:

- A module that writes `def f(group=dist.group.WORLD)` evaluates `group.WORLD` once, when it is imported. Imported
  before `init_process_group`, the default is `None` (the default group, looked up at call time); imported after, the
  default *is* the group object. transformers, accelerate and TRL import such modules lazily while a trainer is built,
  which in a training script is after the group exists (creating a `STAPOConfig` / `GRPOConfig` creates it):
  [`import_group_capturing_modules`] imports them first.
- A trained trainer's DDP wrapper: [`release_process_group`], which the product trainers' `end()` calls.

And a process that ends early, on an input error, still has its group: [`destroy_process_group_if_any`].
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
    """Import [`GROUP_CAPTURING_MODULES`] (the installed ones) if no process group exists yet; else do nothing.

    Called when `stapo_trl.config` is imported, before any `STAPOConfig` can exist; the environment (DeepSpeed sets
    `PYTORCH_NVML_BASED_CUDA_CHECK`), warnings filters and loggers stay as they were ([`quiet_upstream_imports`]).
    """
    import torch.distributed

    if not torch.distributed.is_available() or torch.distributed.is_initialized():
        return
    environ = dict(os.environ)
    with quiet_upstream_imports():
        for name in [n for n in GROUP_CAPTURING_MODULES if importlib.util.find_spec(n.split(".")[0]) is not None]:
            importlib.import_module(name)
    for key in os.environ.keys() - environ.keys():
        del os.environ[key]


def release_process_group(trainer) -> None:
    """Drop a trained `Trainer`'s DDP wrapper, then end training (finish the trackers, destroy the process group).

    A DDP wrapper holds the process group (its reducer). Kept by the trainer (`model_wrapped`) through
    `destroy_process_group()`, it keeps the group alive: gloo's threads outlive the run and about one process exit in
    15 aborts in C++ teardown ("terminate called without an active exception", SIGABRT) after everything was written.
    Afterwards `trainer.model` is the plain model, usable for inference and saving on each process; nothing may
    communicate. A DeepSpeed engine or an FSDP model is left as it is: DeepSpeed's own parameter attributes and hooks
    hold its groups whatever the trainer drops (measured on ZeRO-2 and ZeRO-3, 2 CPU ranks), and an FSDP model is its
    own wrapper.

    Args:
        trainer (`transformers.Trainer`): a trainer, trained or not; its `accelerator` ends training here
            (`Accelerator.end_training`).
    """
    if not (getattr(trainer, "is_deepspeed_enabled", False) or getattr(trainer, "is_fsdp_enabled", False)):
        trainer.model_wrapped = trainer.model
        gc.collect()  # the wrapper sits in reference cycles
    trainer.accelerator.end_training()


def destroy_process_group_if_any() -> None:
    """Destroy this process's default process group, if it has one; called when an input error ends a command
    ([`~stapo_trl.cli.errors.report_input_errors`]; the group exists once a config does: an error found after that
    leaves gloo's threads running).

    A local call, no collective: every rank that stops on the error calls it by itself. Does not import torch when
    nothing has (a command that stopped at its arguments).
    """
    if "torch" not in sys.modules:
        return
    import torch.distributed

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
