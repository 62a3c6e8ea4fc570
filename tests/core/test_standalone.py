"""`stapo_trl/core/` stands alone: its imports, and a copy of it training with `stapo_trl` blocked."""

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import stapo_trl


CORE_DIR = Path(stapo_trl.__file__).parent / "core"

CHILD = r"""
import importlib.abc, json, os, sys, warnings


class BlockStapoTrl(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "stapo_trl":
            raise ImportError(f"{name} is blocked: the lifted core must not import the library")


sys.meta_path.insert(0, BlockStapoTrl())
import torch
from datasets import Dataset
from stapo import STAPOConfig, STAPOTrainer, s2t_mask  # the copy of stapo_trl/core/


class Recorder(STAPOTrainer):  # the last mask's inputs and result, through the hook
    def _compute_s2t_mask(self, *values):
        self.last = (values, super()._compute_s2t_mask(*values))
        return self.last[1]


out = sys.argv[2]
args = STAPOConfig(output_dir=out, use_cpu=True, bf16=False, report_to=[], per_device_train_batch_size=4, seed=0,
                   num_generations=2, max_completion_length=8, logging_steps=1, save_strategy="no", max_steps=4,
                   learning_rate=1e-2, s2t_prob_threshold=1.0)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    trainer = Recorder(sys.argv[1], reward_funcs=lambda completions, **kw: [float(len(c) % 4) for c in completions],
                       args=args, train_dataset=Dataset.from_list([{"prompt": f"{i}+{i % 7}="} for i in range(32)]))
before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
trainer.train()
rows = [h for h in trainer.state.log_history if "loss" in h]
(logps, entropies, advantages, loss_mask, _), last = trainer.last
expected = s2t_mask(logps, entropies, advantages, loss_mask, prob_threshold=1.0, entropy_quantile=0.75)
print(json.dumps({"unchanged": [n for n, p in trainer.model.named_parameters() if torch.equal(before[n], p)],
                  "rows": len(rows), "silenced": sum(r["s2t/num_silenced"] for r in rows),
                  "candidates": sum(r["s2t/num_candidates"] for r in rows),
                  "mask_matches": bool(torch.equal(last.silenced, expected.silenced)),
                  "files": sorted(os.listdir(out)) if os.path.isdir(out) else [],
                  "stapo_trl_modules": sorted(m for m in sys.modules if m.split(".")[0] == "stapo_trl")}))
"""


def test_the_core_imports_only_torch_transformers_accelerate_trl_and_itself():
    allowed = {"torch", "transformers", "accelerate", "trl", "packaging", *sys.stdlib_module_names}
    for path in CORE_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom) and not getattr(node, "level", 0):
                names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                assert {name.split(".")[0] for name in names} <= allowed, (path.name, names)


@pytest.mark.slow  # a new Python process (the pytest process has imported stapo_trl), training 4 steps
def test_the_core_copied_out_of_the_package_trains_alone(tiny_model_path, tmp_path):
    shutil.copytree(CORE_DIR, tmp_path / "lifted" / "stapo", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "train_with_the_copy.py").write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "lifted"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "train_with_the_copy.py", tiny_model_path, str(tmp_path / "run")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["stapo_trl_modules"] == [] and facts["unchanged"] == [] and facts["rows"] == 4
    assert facts["silenced"] > 0 and facts["candidates"] > facts["silenced"] and facts["mask_matches"]
    assert not {"metrics.jsonl", "spurious_tokens.jsonl", "eval.json", "training_curves.png"} & set(facts["files"])
