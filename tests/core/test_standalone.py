import ast
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from testing_utils import length_reward

import stapo_trl


CORE_DIR = Path(stapo_trl.__file__).parent / "core"


@pytest.mark.filterwarnings("ignore")
def test_the_core_imports_only_torch_transformers_accelerate_trl_and_itself_and_a_copy_of_it_trains_alone(
        tiny_random_model_path, tmp_path, monkeypatch):  # fmt: skip
    allowed = {"torch", "transformers", "accelerate", "trl", "packaging", *sys.stdlib_module_names}
    for path in CORE_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom) and not getattr(node, "level", 0):
                names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                assert {name.split(".")[0] for name in names} <= allowed, (path.name, names)
    shutil.copytree(CORE_DIR, tmp_path / "stapo", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.split(".")[0] == "stapo_trl"]:  # hidden and blocked while the copy runs
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "stapo_trl", None)  # `import stapo_trl...` raises ImportError
    from stapo import STAPOConfig, STAPOTrainer, s2t_mask  # the copy of stapo_trl/core/

    class Recorder(STAPOTrainer):  # the last mask's inputs and result, through the hook
        def _compute_s2t_mask(self, *values):
            self.last = (values, super()._compute_s2t_mask(*values))
            return self.last[1]

    args = STAPOConfig(output_dir=str(out := tmp_path / "run"), use_cpu=True, bf16=False, report_to=[], seed=0,
                       per_device_train_batch_size=4, num_generations=2, max_completion_length=8, logging_steps=1,
                       save_strategy="no", max_steps=4, learning_rate=1e-2, s2t_prob_threshold=1.0)  # fmt: skip
    trainer = Recorder(tiny_random_model_path, reward_funcs=length_reward, args=args,
                       train_dataset=Dataset.from_list([{"prompt": f"{i}+{i % 7}="} for i in range(32)]))  # fmt: skip
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    rows = [h for h in trainer.state.log_history if "loss" in h]
    (logps, entropies, advantages, loss_mask, _), last = trainer.last
    expected = s2t_mask(logps, entropies, advantages, loss_mask, prob_threshold=1.0, entropy_quantile=0.75)
    assert not [m for m in sys.modules if m.split(".")[0] == "stapo_trl" and sys.modules[m]] and len(rows) == 4
    assert all(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    silenced, candidates = (sum(r[f"s2t/num_{k}"] for r in rows) for k in ("silenced", "candidates"))
    assert 0 < silenced < candidates and torch.equal(last.silenced, expected.silenced)
    files = set(os.listdir(out)) if out.is_dir() else set()
    assert not {"metrics.jsonl", "spurious_tokens.jsonl", "eval.json", "training_curves.png"} & files
    for name in [m for m in sys.modules if m.split(".")[0] == "stapo"]:
        del sys.modules[name]
