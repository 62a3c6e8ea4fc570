import json
import logging
import shutil

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from stapo_trl.cli.eval import main
from stapo_trl.evaluation.generation import HFGenerator
from stapo_trl.models.loading import ModelSource, load_causal_lm, resolve_model_source
from stapo_trl.trainer.trainers import _torch_default_threads


def test_a_full_model_an_adapter_merged_onto_its_base_no_base_or_remote_code_and_stapo_eval_of_an_adapter(
        tiny_math_model_path, tmp_path, monkeypatch, capsys, caplog):  # fmt: skip  # one thread (tiny)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_math_model_path),
                                LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))  # fmt: skip
    torch.manual_seed(0)
    with torch.no_grad():  # B = 0 would make the adapter a no-op
        [param.normal_(0, 0.5) for name, param in peft_model.named_parameters() if "lora_B" in name]
        expected = peft_model(ids := torch.tensor([[1, 2, 3, 4, 5]])).logits
    peft_model.save_pretrained(folder := tmp_path / "lora-run")
    AutoTokenizer.from_pretrained(tiny_math_model_path).save_pretrained(folder)
    shutil.copy(f"{tiny_math_model_path}/config.json", folder / "config.json")  # what makes from_pretrained fail
    assert resolve_model_source(tiny_math_model_path) == ModelSource(tiny_math_model_path)
    model, tokenizer = load_causal_lm(tiny_math_model_path, dtype=torch.float64)
    assert not model.training and model.dtype == torch.float64 and tokenizer("12+34")["input_ids"]
    with pytest.raises(OSError):  # what stapo-eval hit before
        AutoModelForCausalLM.from_pretrained(folder)
    assert resolve_model_source(str(folder)) == ModelSource(tiny_math_model_path, adapter=str(folder))
    with caplog.at_level(logging.INFO, logger="stapo_trl.models.loading"):
        model, tokenizer = load_causal_lm(str(folder))
    assert f"onto its base model {tiny_math_model_path}, merged" in caplog.text
    assert type(model).__name__ == "Qwen3ForCausalLM" and not model.training  # merged: no PEFT wrapper left
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected, rtol=1e-4, atol=1e-4)
        base_logits = AutoModelForCausalLM.from_pretrained(tiny_math_model_path)(ids).logits
    assert (base_logits - expected).abs().max() > 1e-3 and tokenizer("12+34")["input_ids"]  # the adapter was applied
    shutil.copytree(folder, broken := tmp_path / "adapter")  # an adapter naming no base, a config naming its code
    config = json.loads((broken / "adapter_config.json").read_text())
    (broken / "adapter_config.json").write_text(json.dumps(config | {"base_model_name_or_path": None}))
    with pytest.raises(ValueError, match="base_model_name_or_path"):
        load_causal_lm(str(broken))
    shutil.copytree(tiny_math_model_path, folder := tmp_path / "remote-code")
    config = json.loads((folder / "config.json").read_text())
    auto_map = {"AutoConfig": "modeling_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    (folder / "config.json").write_text(json.dumps(config | {"model_type": "evil", "auto_map": auto_map}))
    (folder / "modeling_evil.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    with pytest.raises(ValueError, match="trust_remote_code"):  # trust_remote_code is never set
        load_causal_lm(str(folder))
    assert not (tmp_path / "ran").exists()
    seen, generate = [], HFGenerator.generate
    caplog.clear()
    monkeypatch.setattr(HFGenerator, "generate",
                        lambda *a, **k: seen.append(torch.get_num_threads()) or generate(*a, **k))  # fmt: skip
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    previous = torch.get_num_threads()
    torch.set_num_threads(max(_torch_default_threads()))  # as torch starts (the test process runs on one)
    argv = f"--model {tmp_path}/lora-run --benchmarks tiny-math --backend hf --decoding greedy --limit 2 --samples 1"
    try:
        with caplog.at_level(logging.INFO):
            assert main([*argv.split(), "--max-new-tokens", "8", "--output", str(tmp_path / "r.json")]) == 0
    finally:
        torch.set_num_threads(previous)
    assert "".join([*capsys.readouterr(), caplog.text]).count("Loading the LoRA adapter") == 1 and seen == [1]
