"""`benchmarks/gpu.py`: the tokenizer of the 151,936-token model, the reward, the pairing and shares of the report on
hand-made runs, the shared model's reset between trainers, and (slow) the CPU smoke run end to end."""

import json
import sys
from pathlib import Path

import pytest
import torch


sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "benchmarks"))  # the experiment's modules
import gpu  # noqa: E402


def test_the_tokenizer_decodes_every_id_of_the_model_and_encodes_text_byte_by_byte():
    tokenizer = gpu.build_tokenizer()
    assert len(tokenizer) == gpu.QWEN3_1_7B["vocab_size"] == 151936
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (151643, 151645)  # Qwen's ids
    assert tokenizer.decode([256]) == " t256" and tokenizer.decode([151935]) == " t151935"
    assert tokenizer.decode([151645], skip_special_tokens=False) == "<|im_end|>"
    ids = tokenizer.encode("ab c")
    assert len(ids) == 4 and max(ids) < 256 and tokenizer.decode(ids) == "ab c"  # one byte, one token: no merges


def test_the_reward_is_the_crc32_parity_of_the_completion():
    # CRC-32 check value of "123456789" is 0xCBF43926 (even); CRC-32 of "a" is 0xE8B7BE43 (odd).
    assert gpu.hashed_binary_reward(["123456789", "a", "a"]) == [0.0, 1.0, 1.0]


def test_field_differences_name_the_fields_that_differ():
    fields = {"GRPO|g": {"lr": 1, "beta": 0.0}, "off|g": {"lr": 1, "beta": 0.0}, "STAPO|g": {"lr": 2, "beta": 0.1}}
    assert gpu.field_differences(fields) == ["GRPO|g vs STAPO|g: ['beta', 'lr']"]
    assert gpu.field_differences({"GRPO|g": {"lr": 1}, "off|g": {"lr": 1}}) == []


def _run(arm, geometry, rep, steps, peak):
    spu = gpu.GEOMETRIES[geometry]
    return dict(
        arm=arm, geometry=geometry, rep=rep, steps_per_unit=spu, units=len(steps) // spu, peak_bytes=peak,
        start_bytes=100, by_step=dict(enumerate(steps)), logged={}, token_records=None,
    )  # fmt: skip


def test_summarize_pairs_the_units_of_one_repetition_and_drops_the_warm_up():
    warm = {"step_seconds": 99.0, "generate_seconds": 98.0, "mask_seconds": 50.0}  # discarded
    grpo = {"step_seconds": 2.0, "generate_seconds": 1.0, "grad_forwards": 1, "grad_rows": 4}
    # STAPO: 0.1 s of the meter's own bookkeeping inside the step and the mask, taken out: 2.2 s, of which 1.2 s
    # train-side, and 0.11 s of mask.
    stapo = dict(grpo, step_seconds=2.3, meter_seconds=0.1, mask_seconds=0.21)
    slow_grpo = dict(grpo, step_seconds=4.0, generate_seconds=3.0)  # repetition 1 ran slower: its own pairs
    runs = [
        _run("GRPO", "spg=GA=1", 0, [warm, grpo, grpo], 1000),
        _run("STAPO", "spg=GA=1", 0, [warm, stapo, stapo], 1100),
        _run("GRPO", "spg=GA=1", 1, [warm, slow_grpo], 1000),
        _run("STAPO", "spg=GA=1", 1, [warm, dict(stapo, step_seconds=4.5, generate_seconds=3.0)], 1200),
    ]
    result = {"settings": {"warmup_units": 1, "completions": 4}, "runs": runs}
    summary = gpu.summarize(result)["spg=GA=1"]
    ratios = summary["ratios"]["STAPO/GRPO"]
    assert ratios["step"] == pytest.approx([1.1, 1.1, 4.4 / 4.0])
    assert ratios["train_side"] == pytest.approx([1.2, 1.2, 1.4])
    assert ratios["peak"] == pytest.approx([1.1, 1.2])
    assert summary["ratios"]["STAPO/off"] == {"step": [], "train_side": [], "peak": []}  # no off runs
    stapo_arm = summary["per_arm"]["STAPO"]
    assert stapo_arm["step_seconds"] == pytest.approx(2.2)  # median of 2.2, 2.2, 4.4
    assert stapo_arm["mask_share"] == pytest.approx(3 * 0.11 / (2.2 + 2.2 + 4.4))
    assert stapo_arm["grad_forwards"] == 1 and stapo_arm["grad_passes"] == 1 and stapo_arm["nograd_passes"] == 0


def test_summarize_sums_the_steps_of_a_rollout_batch_in_the_papers_geometry():
    first = {"step_seconds": 3.0, "generate_seconds": 2.0, "nograd_forwards": 4, "nograd_rows": 16, "grad_rows": 4}
    later = {"step_seconds": 1.0, "grad_rows": 4}
    runs = [_run(arm, "spg=4xGA", 0, [first, later, later, later] * 2, 10) for arm in ("GRPO", "off")]
    summary = gpu.summarize({"settings": {"warmup_units": 1, "completions": 4}, "runs": runs})
    arm = summary["spg=4xGA"]["per_arm"]["off"]
    assert arm["step_seconds"] == pytest.approx(6.0 / 4) and arm["train_side_seconds"] == pytest.approx(4.0 / 4)
    assert arm["nograd_forwards"] == 1 and arm["nograd_passes"] == 1 and arm["grad_passes"] == 1


def test_reset_model_restores_the_weights_and_the_class_forward():
    from trl.trainer.utils import add_fused_lm_head

    shape = dict(gpu.CPU_SMOKE_SHAPE, num_hidden_layers=1)
    model = gpu.build_model(shape, gpu.build_tokenizer(), torch.float32, "cpu")
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


@pytest.mark.slow
def test_the_cpu_smoke_run_measures_every_arm_and_writes_its_report(tmp_path):
    args = gpu.parse_args(["--cpu-smoke", "--out", str(tmp_path), "--mask-sizes", "0.0625"])
    result = gpu.run(args)
    assert result["complete"] and result["field_differences"] == []
    assert {(r["arm"], r["geometry"]) for r in result["runs"]} == {(a, g) for a in gpu.ARMS for g in gpu.GEOMETRIES}
    assert all(r["activation_checkpointing"] for r in result["runs"])
    summary = gpu.summarize(result)
    for geometry, extra in (("spg=GA=1", 0), ("spg=4xGA", 1)):  # TRL's old-log-prob forward only where spg > GA
        for arm, a in summary[geometry]["per_arm"].items():
            assert (a["grad_passes"], a["nograd_passes"]) == (1, extra), (geometry, arm)
        stapo, off = summary[geometry]["per_arm"]["STAPO"], summary[geometry]["per_arm"]["off"]
        assert stapo["candidate_ratio"] > 0 and stapo["silenced_ratio"] > 0 and off["silenced_ratio"] == 0
        assert stapo["token_records"][0]["token_bytes_table_entries"] == 151936
        assert stapo["token_records"][0]["file_bytes"] > 0 and stapo["mask_share"] > 0
    assert [row["num_tokens"] for row in result["mask"]] == [2**16] * len(gpu.MASK_FRACTIONS)
    assert json.loads((tmp_path / "gpu.json").read_text())["complete"]
    page = gpu.write_report(str(tmp_path / "gpu.json"), str(tmp_path / "page.md"))
    assert "| spg=4xGA | STAPO/off |" in page.read_text() and (tmp_path / "page.json").exists()
