"""stapo_trl: STAPO (arXiv:2602.15620) for TRL. `from stapo_trl import STAPOConfig, STAPOTrainer`.

Two layers. `stapo_trl.core` is STAPO as TRL would ship it (the S2T rule, `STAPOConfig(GRPOConfig)`,
`STAPOTrainer(GRPOTrainer)`; it imports torch, transformers, accelerate and trl only). The names exported here are
the product built on it: `STAPOConfig` and `STAPOTrainer` subclass the core's and add built-in model and reward
names, construction-time dataset checks, CPU defaults, the run files and the model card. Every name is imported
lazily (`import stapo_trl` does not import TRL: seconds); no import changes filters, loggers, threads or environment.
"""

import importlib


__version__ = "0.2.0"
__all__ = ["STAPOConfig", "STAPOTrainer", "S2TResult", "s2t_mask"]
_MODULES = {"STAPOConfig": ".config", "STAPOTrainer": ".trainer", "S2TResult": ".core.s2t", "s2t_mask": ".core.s2t"}


def __getattr__(name):
    if name not in _MODULES:
        raise AttributeError(f"module 'stapo_trl' has no attribute {name!r}")
    from .integrations.upstream_warnings import quiet_upstream_imports  # TRL warns while it is imported: see there

    with quiet_upstream_imports():
        return getattr(importlib.import_module(_MODULES[name], __name__), name)
