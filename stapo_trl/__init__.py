"""stapo_trl: [STAPO](https://huggingface.co/papers/2602.15620) for TRL. `from stapo_trl import STAPOConfig, STAPOTrainer`.

`stapo_trl.core` is the method as TRL would ship it (the S2T rule, `STAPOConfig(GRPOConfig)`, `STAPOTrainer(GRPOTrainer)`);
the names here add the built-in models and rewards, the run files and the model card. Names are imported lazily
(`import stapo_trl` does not import TRL), and no import changes filters, loggers, threads or the environment.
"""

import importlib
import sys
import types
import warnings


__version__ = "0.3.0"
__all__ = ["STAPOConfig", "STAPOTrainer", "S2TResult", "s2t_mask"]
_MODULES = {"STAPOConfig": ".trainer", "STAPOTrainer": ".trainer", "S2TResult": ".core.s2t", "s2t_mask": ".core.s2t"}
# Module paths that moved into packages: each still imports its names, with a DeprecationWarning, for one release.
_MOVED = {
    "callbacks": (".cli.callbacks",),
    "checkpoints": (".run_folder.checkpoints",),
    "checks": (".data",),
    "config": (".trainer.config",),
    "model_card": (".run_folder.card",),
    "plots": (".cli.figures",),
    "preflight": (".integrations.hub", ".data"),
    "run_files": (".run_folder.logs",),
}


class _MovedModule(types.ModuleType):
    """A module path that moved: its names come from the new module, each access warned as deprecated."""

    def __getattr__(self, attr):
        if attr.startswith("_"):  # probes of every module (inspect, pickle): never an import
            raise AttributeError(attr)
        homes = [importlib.import_module(home, __name__) for home in _MOVED[self.__name__.rpartition(".")[2]]]
        home, value = next(((h.__name__, getattr(h, attr)) for h in homes if hasattr(h, attr)), (None, None))
        if home is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}")
        warnings.warn(f"{self.__name__} moved: import {attr} from {home}.",
                      DeprecationWarning, stacklevel=2)  # fmt: skip
        return value


for _old in _MOVED:
    sys.modules.setdefault(f"{__name__}.{_old}", _MovedModule(f"{__name__}.{_old}"))


def __getattr__(name):
    if name in _MOVED:
        return sys.modules[f"{__name__}.{name}"]
    if name not in _MODULES:
        raise AttributeError(f"module 'stapo_trl' has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULES[name], __name__), name)
