"""Importing the package changes no process-wide state: warnings filters, logging (handlers, levels, filters of the
loggers that exist), torch's thread counts and the environment are as they were, for a user who already runs
GRPOTrainer (its imports come first). Each case runs in a fresh interpreter, since an import happens once."""

import json
import subprocess
import sys

import pytest


# Prints, as JSON, what changed in the process-wide state while the modules of argv[2:] were imported (after the
# user's own code in argv[1]): new or dropped warnings filters, changed existing loggers, thread counts, environment.
IMPORT_PROBE = r"""
import importlib, json, logging, os, sys, warnings
import torch
from trl import GRPOConfig, GRPOTrainer  # noqa: F401 (the user's own imports: what GRPOTrainer brings is TRL's)
exec(sys.argv[1])

def state():
    loggers = {"": logging.getLogger()} | {
        name: logger for name, logger in logging.root.manager.loggerDict.items() if isinstance(logger, logging.Logger)
    }
    return {
        "filters": [repr(f) for f in warnings.filters],
        "loggers": {
            name: repr((logger.level, logger.handlers, logger.filters, logger.propagate, logger.disabled))
            for name, logger in loggers.items()
        },
        "threads": [torch.get_num_threads(), torch.get_num_interop_threads()],
        "environ": dict(os.environ),
    }

before = state()
for name in sys.argv[2:]:
    module, _, attribute = name.partition(":")
    imported = importlib.import_module(module)
    if attribute:
        getattr(imported, attribute)
after = state()
print(json.dumps({
    "filters added": [f for f in after["filters"] if f not in before["filters"]],
    "filters dropped": [f for f in before["filters"] if f not in after["filters"]],
    "loggers changed": [n for n in before["loggers"] if before["loggers"][n] != after["loggers"].get(n)],
    "threads": [before["threads"], after["threads"]],
    "environ changed": sorted(k for k in before["environ"].keys() | after["environ"].keys()
                              if before["environ"].get(k) != after["environ"].get(k)),
}))
"""

MODULES = [
    "stapo_trl",
    "stapo_trl:STAPOConfig",  # the lazy names: `from stapo_trl import STAPOConfig, STAPOTrainer`
    "stapo_trl:STAPOTrainer",
    "stapo_trl.core",
    "stapo_trl.trainer.config",
    "stapo_trl.trainer.trainers",
]


@pytest.mark.slow  # a fresh interpreter per case
@pytest.mark.parametrize(
    "user_code",
    [
        # The reported case: `import stapo_trl` after TRL added a warnings filter for TRL's vLLM-range message and a
        # filter on DeepSpeed's logger; importing the config modules imports DeepSpeed, which set
        # PYTORCH_NVML_BASED_CUDA_CHECK in the environment.
        "pass",
        # DeepSpeed imported by the user first: its logger exists, and keeps its filters.
        "import deepspeed",
        # A user's own thread count, environment and warnings filter stay as set.
        "torch.set_num_threads(1); os.environ['OMP_NUM_THREADS'] = '1'; warnings.simplefilter('error', FutureWarning)",
    ],
)
def test_importing_the_package_changes_no_process_wide_state(user_code):
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE, user_code, *MODULES], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    changes = json.loads(proc.stdout.splitlines()[-1])
    before, after = changes.pop("threads")
    assert before == after
    assert changes == {"filters added": [], "filters dropped": [], "loggers changed": [], "environ changed": []}
