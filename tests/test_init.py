"""Importing the package after TRL's own imports changes no process-wide state (a fresh interpreter per case)."""

import json
import subprocess
import sys

import pytest


# Prints, as JSON, what importing argv[2:] (after the user's code argv[1]) changed: warnings filters, existing loggers,
# thread counts, environment.
IMPORT_PROBE = r"""
import importlib, json, logging, os, sys, warnings
import torch
from trl import GRPOConfig, GRPOTrainer  # noqa: F401 (the user's own imports: what GRPOTrainer brings is TRL's)
exec(sys.argv[1])

def state():
    loggers = {"": logging.getLogger()} | logging.root.manager.loggerDict
    return {"filters": [repr(f) for f in warnings.filters], "environ": dict(os.environ),
            "loggers": {name: repr((lg.level, lg.handlers, lg.filters, lg.propagate, lg.disabled))
                        for name, lg in loggers.items() if isinstance(lg, logging.Logger)},
            "threads": [torch.get_num_threads(), torch.get_num_interop_threads()]}

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

MODULES = ["stapo_trl", "stapo_trl:STAPOConfig", "stapo_trl:STAPOTrainer",  # the lazy names too
           "stapo_trl.core", "stapo_trl.trainer.config", "stapo_trl.trainer.trainers"]  # fmt: skip


@pytest.mark.slow  # a fresh interpreter per case
@pytest.mark.parametrize("user_code", [
        "pass",  # TRL's filters stay; the DeepSpeed its config imports set no PYTORCH_NVML_BASED_CUDA_CHECK
        "import deepspeed",  # its logger exists first, and keeps its filters
        "torch.set_num_threads(1); os.environ['OMP_NUM_THREADS'] = '1'; warnings.simplefilter('error', FutureWarning)",
])  # fmt: skip
def test_importing_the_package_changes_no_process_wide_state(user_code):
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE, user_code, *MODULES], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    changes = json.loads(proc.stdout.splitlines()[-1])
    before, after = changes.pop("threads")
    assert before == after
    assert changes == {"filters added": [], "filters dropped": [], "loggers changed": [], "environ changed": []}
