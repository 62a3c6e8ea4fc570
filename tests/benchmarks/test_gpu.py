"""`benchmarks/`: gpu.py (tokenizer, reward, candidate share, report, model reset, smoke run), the harness' threads."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from testing_utils import REPO, builtin_cache_root
from trl.trainer.utils import add_fused_lm_head


sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "benchmarks"))  # the experiment's modules
import gpu  # noqa: E402


def test_the_tokenizer_reward_candidate_share_model_reset_and_summary():
    tokenizer = gpu.build_tokenizer()
    assert len(tokenizer) == gpu.QWEN3_1_7B["vocab_size"] == 151936
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (151643, 151645)  # Qwen's ids
    assert tokenizer.decode([256]) == " t256" and tokenizer.decode([151935]) == " t151935"
    assert tokenizer.decode([151645], skip_special_tokens=False) == "<|im_end|>"
    ids = tokenizer.encode("ab c")
    assert len(ids) == 4 and max(ids) < 256 and tokenizer.decode(ids) == "ab c"  # one byte, one token: no merges
    # CRC-32 of "0:a" is 0xC436B335 (odd), of "1:a" 0xC5F4D902 (even): equal completions of a group get reward spread.
    assert gpu.hashed_binary_reward(["a", "a"]) == [1.0, 0.0] == gpu.hashed_binary_reward(["a", "a"])  # reproducible
    fields = {"GRPO|g": {"lr": 1, "beta": 0.0}, "off|g": {"lr": 1, "beta": 0.0}, "STAPO|g": {"lr": 2, "beta": 0.1}}
    assert gpu.field_differences(fields) == ["GRPO|g vs STAPO|g: ['beta', 'lr']"]
    assert gpu.field_differences({"GRPO|g": {"lr": 1}, "off|g": {"lr": 1}}) == []
    # Candidate share: the mass of sampled tokens below tau_p; row 1 (logits [0, -10]): p = 4.54e-5, row 0: p = 1/2.
    logits = torch.tensor([[0.0, 0.0], [0.0, -10.0]])
    share, entropy = gpu.candidate_mass(logits, 1.0)
    p = 1 / (1 + math.exp(10))
    assert share == pytest.approx(p / 2, rel=1e-4)
    assert entropy == pytest.approx((math.log(2) - p * math.log(p) - (1 - p) * math.log(1 - p)) / 2, rel=1e-4)
    assert gpu.candidate_mass(logits, 0.5)[0] == 0.0  # logits x 0.5: p = 6.7e-3 >= tau_p
    model = gpu.build_model(dict(gpu.CPU_SMOKE_SHAPE, num_hidden_layers=1), tokenizer, torch.float32, "cpu")
    saved = [p.detach().clone() for p in model.parameters()]
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))  # what each GRPOTrainer does to its model
    model._original_forward = model.forward  # what accelerate's mixed-precision wrapper leaves
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
            p.grad = torch.ones_like(p)
    gpu.reset_model(model, saved)
    assert "forward" not in model.__dict__ and "_original_forward" not in model.__dict__
    assert all(torch.equal(p, s) and p.grad is None for p, s in zip(model.parameters(), saved, strict=True))
    warm = {"step_seconds": 99.0, "generate_seconds": 98.0, "mask_seconds": 50.0}  # discarded
    grpo = {"step_seconds": 2.0, "generate_seconds": 1.0, "grad_forwards": 1, "grad_rows": 4}
    stapo = dict(grpo, step_seconds=2.2, mask_seconds=0.11, records_seconds=0.01)  # 1.2 s train-side
    slow_grpo = dict(grpo, step_seconds=4.0, generate_seconds=3.0)  # repetition 1 ran slower: its own pairs
    stapo_slow = dict(stapo, step_seconds=4.4, generate_seconds=3.0)
    runs = [("GRPO", 0, [warm, grpo, grpo], 1000), ("STAPO", 0, [warm, stapo, stapo], 1100),
            ("GRPO", 1, [warm, slow_grpo], 1000), ("STAPO", 1, [warm, stapo_slow], 1200)]  # fmt: skip
    summary = _summary("spg=GA=1", runs)
    ratios = summary["ratios"]["STAPO/GRPO"]
    assert ratios["step"] == pytest.approx([1.1, 1.1, 4.4 / 4.0])
    assert ratios["train_side"] == pytest.approx([1.2, 1.2, 1.4])
    assert ratios["peak"] == pytest.approx([1.1, 1.2])
    assert summary["ratios"]["STAPO/off"] == {"step": [], "train_side": [], "peak": []}  # no off runs
    stapo_arm = summary["per_arm"]["STAPO"]
    assert stapo_arm["step_seconds"] == pytest.approx(2.2)  # median of 2.2, 2.2, 4.4
    assert stapo_arm["mask_share"] == pytest.approx(3 * 0.11 / (2.2 + 2.2 + 4.4))
    assert stapo_arm["records_share"] == pytest.approx(3 * 0.01 / (2.2 + 2.2 + 4.4))
    assert stapo_arm["grad_forwards"] == 1 and stapo_arm["grad_passes"] == 1 and stapo_arm["nograd_passes"] == 0
    # The paper's geometry: the steps of a rollout batch summed into one unit.
    first = {"step_seconds": 3.0, "generate_seconds": 2.0, "nograd_forwards": 4, "nograd_rows": 16, "grad_rows": 4}
    later = {"step_seconds": 1.0, "grad_rows": 4}
    arm = _summary("spg=4xGA", [(a, 0, [first, *[later] * 3] * 2, 10) for a in ("GRPO", "off")])["per_arm"]["off"]
    assert arm["step_seconds"] == pytest.approx(6.0 / 4) and arm["train_side_seconds"] == pytest.approx(4.0 / 4)
    assert arm["nograd_forwards"] == 1 and arm["nograd_passes"] == 1 and arm["grad_passes"] == 1


def _summary(geometry, runs):  # (arm, rep, steps, peak) each
    spu = gpu.GEOMETRIES[geometry][0] // gpu.GEOMETRIES[geometry][1]
    runs = [dict(model="random", arm=arm, geometry=geometry, rep=rep, steps_per_unit=spu, units=len(steps) // spu,
                 peak_bytes=peak, by_step=dict(enumerate(steps)), logged={})
            for arm, rep, steps, peak in runs]  # fmt: skip
    return gpu.summarize({"settings": {"warmup_units": 1, "completions": 4}, "runs": runs})[f"random {geometry}"]


@pytest.mark.slow
def test_the_cpu_smoke_run_measures_every_arm_and_writes_its_report(tmp_path):  # 18 runs, smaller than --cpu-smoke's
    args = "--cpu-smoke --warmup-units 0 --completions 4 --num-generations 4 --out".split()
    result = gpu.run(gpu.parse_args([*args, str(tmp_path)]))
    assert result["complete"] and result["field_differences"] == []
    runs = {(r["model"], r["arm"], r["geometry"]) for r in result["runs"]}
    assert runs == {(m, a, g) for m in gpu.MODELS for a in gpu.ARMS for g in gpu.GEOMETRIES}
    assert all(r["activation_checkpointing"] for r in result["runs"])
    sharp = result["model"]["trained_like"]  # the candidate share that gives ~1e-4 silenced: 1e-4 / (0.5 x 0.75)
    assert sharp["norm_scale"] > 1 and sharp["candidate_share"] == pytest.approx(1e-4 / 0.375, rel=0.01)
    summary = gpu.summarize(result)
    for model in gpu.MODELS:
        # No-grad passes: TRL's old-log-prob forward where spg > GA (every arm), the core's own where GA = spg > 1.
        geometries = {"spg=GA=1": {}, "spg=4xGA": dict.fromkeys(gpu.ARMS, 1), "GA=spg=4": {"STAPO": 1, "off": 1}}
        for geometry, extra in geometries.items():
            per_arm = summary[f"{model} {geometry}"]["per_arm"]
            for arm, a in per_arm.items():
                assert (a["grad_passes"], a["nograd_passes"]) == (1, extra.get(arm, 0)), (model, geometry, arm)
            assert per_arm["off"]["silenced_ratio"] == 0 and per_arm["STAPO"]["records_share"] > 0
        random = summary[f"{model} spg=GA=1"]["per_arm"]["STAPO"]
        assert model != "random" or (random["silenced_ratio"] > 0.1 and random["entropy"] > 5)
    trained = [summary[f"trained-like {g}"]["per_arm"]["STAPO"] for g in gpu.GEOMETRIES]
    assert all(a["silenced_ratio"] < 0.01 and a["entropy"] < 1 for a in trained)
    assert json.loads((tmp_path / "gpu.json").read_text())["complete"]
    page = gpu.write_report(str(tmp_path / "gpu.json"), str(tmp_path / "page.md"))
    assert "| trained-like GA=spg=4 | STAPO/off |" in page.read_text() and (tmp_path / "page.json").exists()


SCRIPT = """
import json, sys, tempfile, torch
from transformers import TrainerCallback
sys.path.insert(0, "benchmarks")
from harness import PLAIN_GRPO_RECIPE, STAPO_RECIPE, build_trainer
seen = {"default": torch.get_num_threads()}
for arm, recipe in (("GRPOTrainer", PLAIN_GRPO_RECIPE), ("STAPOTrainer", STAPO_RECIPE)):
    trainer, _ = build_trainer(recipe, ["--max_steps", "1", *sys.argv[1:]], workdir=tempfile.mkdtemp())
    package = type(trainer).__module__.split(".")[0]
    record = lambda *a, arm=arm, package=package, **k: seen.__setitem__(arm, (package, torch.get_num_threads()))
    trainer.add_callback(type("Threads", (TrainerCallback,), {"on_step_end": record}))
    trainer.train()
print(json.dumps(seen))
"""


@pytest.mark.slow  # a fresh process per case (this one pins one thread): ~20 s each on 2 cores
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="torch's default is already one thread on one core")
@pytest.mark.parametrize("environ, overrides, expected",  # the recipes' 1; a recipe override; the caller's environment
    [({}, [], 1), ({}, ["--torch_num_threads", "2"], 2), ({"OMP_NUM_THREADS": "2"}, [], 2)])  # fmt: skip
def test_plain_grpo_and_stapo_arms_train_on_the_same_thread_count(tiny_math_model_path, tmp_path, environ, overrides,
                                                                  expected):  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env |= environ | {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    env["STAPO_TRL_CACHE"] = str(builtin_cache_root(tiny_math_model_path))
    command = [sys.executable, "-c", SCRIPT, *overrides]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["default"] == len(os.sched_getaffinity(0))  # nothing set before the harness
    assert seen["GRPOTrainer"] == ["trl", expected] and seen["STAPOTrainer"] == ["stapo_trl", expected]
