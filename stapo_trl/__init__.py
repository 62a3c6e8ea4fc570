"""stapo_trl: STAPO (arXiv:2602.15620) for TRL. `from stapo_trl import STAPOConfig, STAPOTrainer`.

The pure S2T maths (`s2t_mask`, `S2TResult`) imports only torch; the trainer and config import TRL lazily, so
`import stapo_trl` stays cheap.
"""

from .s2t import S2TResult, s2t_mask


__version__ = "0.1.0"
__all__ = ["STAPOConfig", "STAPOTrainer", "S2TResult", "s2t_mask"]


def __getattr__(name):
    if name == "STAPOConfig":
        from .config import STAPOConfig

        return STAPOConfig
    if name == "STAPOTrainer":
        from .trainer import STAPOTrainer

        return STAPOTrainer
    raise AttributeError(f"module 'stapo_trl' has no attribute {name!r}")
