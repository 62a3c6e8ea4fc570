"""Importing the package after TRL's own imports changes no process-wide state (a fresh interpreter per case)."""

import json
import subprocess
import sys

import pytest


# Prints, as JSON, the state before and after importing argv[2:] (after the user's code argv[1]).
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
for module, _, attribute in (name.partition(":") for name in sys.argv[2:]):
    imported = importlib.import_module(module)
    attribute and getattr(imported, attribute)
print(json.dumps([before, state()]))
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
    before, after = json.loads(proc.stdout.splitlines()[-1])
    assert set(after["filters"]) == set(before["filters"]) and after["threads"] == before["threads"]
    assert after["environ"] == before["environ"]
    assert {name: after["loggers"].get(name) for name in before["loggers"]} == before["loggers"]
