"""STAPO as TRL would ship it (`trl/experimental/stapo/`): the S2T rule, its config and trainer, nothing else.

[STAPO](https://huggingface.co/papers/2602.15620) is GRPO whose loss silences rare spurious tokens: positive-advantage
tokens sampled with a low probability at low-entropy positions leave the numerator and the denominator of the loss.

- `s2t.py`: the rule as pure tensor maths ([`s2t_mask`], [`S2TResult`]); torch only.
- `s2t_metrics.py`: the method's own diagnostics (entropy quantiles, logit-gradient-norm shares from the collision
  probability).
- `stapo_config.py`: [`STAPOConfig`], `trl.GRPOConfig` plus the `s2t_*` fields with the paper's defaults.
- `stapo_trainer.py`: [`STAPOTrainer`], `trl.GRPOTrainer` with the mask in the parent's loss.

This folder imports torch, transformers, accelerate and trl only, with relative imports inside it, and writes no
files of its own. `stapo_trl` builds its product on it (`stapo_trl.STAPOTrainer` subclasses this trainer);
`tests/test_core_standalone.py` copies this folder out under another name, with `stapo_trl` blocked, and trains.
"""

from .s2t import S2TResult, s2t_mask
from .stapo_config import STAPOConfig
from .stapo_trainer import STAPOTrainer


__all__ = ["S2TResult", "STAPOConfig", "STAPOTrainer", "s2t_mask"]
