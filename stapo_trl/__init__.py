"""stapo_trl: STAPO (arXiv:2602.15620) for TRL. `from stapo_trl import STAPOConfig, STAPOTrainer`.

The pure S2T maths (`s2t_mask`, `S2TResult`) imports only torch; the trainer and config import TRL lazily, so
`import stapo_trl` stays cheap. The core (`s2t`, `config`, `trainer`, with `diagnostics`) imports no other
`stapo_trl` module but `process_group` (imported by `config`, dropped in a copy inside TRL); this package wires the
`builtin:` model names to it (`STAPOTrainer.resolve_model_path`).
"""

from .s2t import S2TResult, s2t_mask


__version__ = "0.1.0"
__all__ = ["STAPOConfig", "STAPOTrainer", "S2TResult", "s2t_mask"]


def __getattr__(name):
    # Lazy, so that `import stapo_trl` does not import TRL (seconds).
    if name == "STAPOConfig":
        from .config import STAPOConfig

        return STAPOConfig
    if name == "STAPOTrainer":
        from .builtin import resolve_model_path
        from .trainer import STAPOTrainer

        if STAPOTrainer.resolve_model_path is None:
            STAPOTrainer.resolve_model_path = staticmethod(resolve_model_path)
        return STAPOTrainer
    raise AttributeError(f"module 'stapo_trl' has no attribute {name!r}")
