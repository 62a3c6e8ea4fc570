"""The core's `STAPOTrainer` and `STAPOConfig`, and TRL's `GRPOTrainer` (the baseline), with the package's extras."""

from .config import STAPOConfig
from .trainers import GRPOBaselineTrainer, STAPOTrainer, tiny_model_threads


__all__ = ["GRPOBaselineTrainer", "STAPOConfig", "STAPOTrainer", "tiny_model_threads"]
