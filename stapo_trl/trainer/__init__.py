"""The library trainer: the core's `STAPOTrainer` and `STAPOConfig` with what the package adds around them (built-in
models and named rewards, checks at construction, the run folder, the card), and TRL's `GRPOTrainer` with the same
additions as the baseline."""

from .config import STAPOConfig
from .trainers import GRPOBaselineTrainer, STAPOTrainer, tiny_model_threads


__all__ = ["GRPOBaselineTrainer", "STAPOConfig", "STAPOTrainer", "tiny_model_threads"]
