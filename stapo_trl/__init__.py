"""stapo_trl: [STAPO](https://huggingface.co/papers/2602.15620) for TRL. `from stapo_trl import STAPOConfig, STAPOTrainer`.

`stapo_trl.core` is the method as TRL would ship it (the S2T rule, `STAPOConfig(GRPOConfig)`, `STAPOTrainer(GRPOTrainer)`);
the names here add the built-in models and rewards, the run files and the model card. Names are imported lazily
(`import stapo_trl` does not import TRL), and no import changes filters, loggers, threads or the environment.
"""

import importlib


__version__ = "0.3.0"
__all__ = ["STAPOConfig", "STAPOTrainer", "S2TResult", "s2t_mask"]
_MODULES = {"STAPOConfig": ".config", "STAPOTrainer": ".trainer", "S2TResult": ".core.s2t", "s2t_mask": ".core.s2t"}


def __getattr__(name):
    if name not in _MODULES:
        raise AttributeError(f"module 'stapo_trl' has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULES[name], __name__), name)
