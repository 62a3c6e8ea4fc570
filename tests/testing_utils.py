"""Helpers shared by several test files (TRL's `tests/testing_utils.py` is the pattern)."""

import warnings

import torch

from stapo_trl import STAPOConfig


class ForwardCounter:
    """Counts the no-grad scoring forwards (fused LM head, not generation) of a model."""

    def __init__(self, model):
        self.count = 0
        model.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs):
        if kwargs.get("fused_lm_head") and not torch.is_grad_enabled():
            self.count += 1


def tiny_stapo_config(output_dir, **overrides) -> STAPOConfig:
    """A `STAPOConfig` for a few CPU steps of a tiny model: 4 completions per step (2 prompts x 2), no checkpoints,
    no trackers; `overrides` win. Built with warnings silenced (the tests check values, not TRL's notices)."""
    settings = dict(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=False,  # bf16 on CPU is slow and not what the maths is checked in
        report_to=[],
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,  # tiny model, short completions
        save_strategy="no",
    )
    settings.update(overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return STAPOConfig(**settings)
