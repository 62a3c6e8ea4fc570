# Copyright 2026 The stapo_trl Authors. All rights reserved.
# SPDX-License-Identifier: Apache-2.0

"""[STAPO](https://huggingface.co/papers/2602.15620) for TRL: the S2T rule, config and trainer; no file written."""

from .s2t import S2TResult, s2t_mask
from .stapo_config import STAPOConfig
from .stapo_trainer import STAPOTrainer


__all__ = ["S2TResult", "STAPOConfig", "STAPOTrainer", "s2t_mask"]
