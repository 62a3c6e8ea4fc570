"""`stapo_trl/core/` stands alone: what TRL would merge as `trl/experimental/stapo/`.

The folder is copied out of the package under another name (`stapo`, as `trl/experimental/stapo/` would be), every
import of `stapo_trl` is blocked, and a child process trains with the copy (shape of TRL's
`tests/experimental/test_gmpo_trainer.py`: snapshot, train, every parameter changed, the metric in `log_history`):
- the threshold fires and silences tokens, and the training changes every parameter;
- `s2t_mode="off"` equals `GRPOTrainer` when `steps_per_generation` equals GA;
- no product file (`metrics.jsonl`, `spurious_tokens.jsonl`, `eval.json`) is written, and no `stapo_trl` module is
  imported.
A child process, because this pytest process has imported `stapo_trl` already; the model is the tiny random Qwen3 of
`tests/core/conftest.py` (built with transformers alone).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import stapo_trl


CORE_DIR = Path(stapo_trl.__file__).parent / "core"

CHILD = r'''
import importlib.abc
import json
import os
import sys
import warnings


class BlockStapoTrl(importlib.abc.MetaPathFinder):
    """Any import of stapo_trl (the product) fails, as it would inside TRL."""

    def find_spec(self, name, path=None, target=None):
        if name == "stapo_trl" or name.startswith("stapo_trl."):
            raise ImportError(f"{name} is blocked: the lifted core must not import the product")
        return None


sys.meta_path.insert(0, BlockStapoTrl())

import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from stapo import STAPOConfig, STAPOTrainer, s2t_mask  # the copy of stapo_trl/core/

model_path, out = sys.argv[1], sys.argv[2]
prompts = Dataset.from_list([{"prompt": f"{i}+{i % 7}="} for i in range(32)])


def length_reward(completions, **kwargs):  # varies within a group: non-zero advantages
    return [float(len(c) % 4) for c in completions]


class Recorder(STAPOTrainer):
    """Keeps the inputs and result of the last mask, through the core's hook for subclasses."""

    def _compute_s2t_mask(self, *values):
        self.last = (values, super()._compute_s2t_mask(*values))
        return self.last[1]


def train(trainer_cls, config_cls, name, **overrides):
    settings = dict(
        output_dir=os.path.join(out, name), use_cpu=True, bf16=False, report_to=[], per_device_train_batch_size=4,
        num_generations=2, max_completion_length=8, logging_steps=1, save_strategy="no", seed=0, max_steps=4,
        learning_rate=1e-2,  # why: a tiny random model; the weights must move visibly in 4 steps
    )
    settings.update(overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = trainer_cls(model_path, reward_funcs=length_reward, args=config_cls(**settings),
                              train_dataset=prompts)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    after = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    rows = [h for h in trainer.state.log_history if "loss" in h]
    return trainer, rows, before, after


# 1. The threshold fires: tau_p = 1.0 makes every positive-advantage token a candidate; the bottom q are silenced.
trainer, rows, before, after = train(Recorder, STAPOConfig, "stapo", s2t_prob_threshold=1.0)
unchanged = [n for n in before if torch.equal(before[n], after[n])]
silenced = sum(r["s2t/num_silenced"] for r in rows)
candidates = sum(r["s2t/num_candidates"] for r in rows)
(logps, entropies, advantages, loss_mask, _), last = trainer.last
expected = s2t_mask(logps, entropies, advantages, loss_mask, prob_threshold=1.0, entropy_quantile=0.75)

# 2. s2t_mode="off" against GRPOTrainer, steps_per_generation = GA = 2.
_, off_rows, _, off_params = train(STAPOTrainer, STAPOConfig, "off", s2t_mode="off", gradient_accumulation_steps=2)
_, grpo_rows, _, grpo_params = train(GRPOTrainer, GRPOConfig, "grpo", loss_type="dapo", epsilon_high=0.28, beta=0.0,
                                     gradient_accumulation_steps=2)
keys = ("loss", "grad_norm", "entropy", "reward")
max_metric_diff = max(abs(a[k] - b[k]) for a, b in zip(off_rows, grpo_rows, strict=True) for k in keys)
max_param_diff = max((off_params[n] - grpo_params[n]).abs().max().item() for n in off_params)

print(json.dumps({
    "unchanged": unchanged,
    "num_parameters": len(before),
    "silenced": silenced,
    "candidates": candidates,
    "mask_matches": bool(torch.equal(last.silenced, expected.silenced)),
    "rows": [len(rows), len(off_rows), len(grpo_rows)],
    "max_metric_diff": max_metric_diff,
    "max_param_diff": max_param_diff,
    "files": [sorted(os.listdir(d)) if os.path.isdir(d) else [] for d in (os.path.join(out, n) for n in ("stapo", "off"))],
    "stapo_trl_modules": sorted(m for m in sys.modules if m.split(".")[0] == "stapo_trl"),
}))
'''


def test_the_core_copied_out_of_the_package_trains_alone(tiny_model_path, tmp_path):
    lifted = tmp_path / "lifted"
    shutil.copytree(CORE_DIR, lifted / "stapo", ignore=shutil.ignore_patterns("__pycache__"))
    script = tmp_path / "train_with_the_copy.py"
    script.write_text(CHILD)
    # Only the copy on the path: not the checkout (where stapo_trl lives) nor its editable install (blocked anyway).
    env = {**os.environ, "PYTHONPATH": str(lifted), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(script), tiny_model_path, str(tmp_path / "runs")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])

    assert facts["stapo_trl_modules"] == []
    # The threshold fires: candidates are silenced, and the mask is the rule recomputed from its own inputs.
    assert facts["silenced"] > 0 and facts["candidates"] > facts["silenced"]
    assert facts["mask_matches"]
    assert facts["unchanged"] == [], f"parameters not updated: {facts['unchanged']}"
    # The mask off is GRPOTrainer, step for step and weight for weight.
    assert facts["rows"] == [4, 4, 4]
    assert facts["max_metric_diff"] < 1e-5 and facts["max_param_diff"] < 1e-6, facts
    # No product file: no metrics.jsonl, spurious_tokens.jsonl, eval.json, figures or card in the output folders.
    for files in facts["files"]:
        assert not {"metrics.jsonl", "spurious_tokens.jsonl", "eval.json", "training_curves.png"} & set(files), files
