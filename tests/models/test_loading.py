"""`stapo_trl.models.loading`: a LoRA adapter folder (a `--use_peft` run's output) loads onto its base model."""

import json
import shutil

import pytest
import torch

from stapo_trl.models.loading import ModelSource, load_causal_lm, resolve_model_source


@pytest.fixture(scope="module")
def lora_dir(tiny_random_model_path, tmp_path_factory):
    """An adapter folder as a LoRA run leaves it: adapter weights (non-zero B), the tokenizer and a config.json."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(tiny_random_model_path)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)  # LoRA starts with B = 0, which would make the adapter a no-op
    out = tmp_path_factory.mktemp("lora-run")
    peft_model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_random_model_path).save_pretrained(out)
    shutil.copy(f"{tiny_random_model_path}/config.json", out / "config.json")  # what makes from_pretrained fail
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        expected = peft_model(ids).logits
    return out, ids, expected


def test_full_model_is_not_an_adapter(tiny_random_model_path):
    assert resolve_model_source(tiny_random_model_path) == ModelSource(tiny_random_model_path)
    model, tokenizer = load_causal_lm(tiny_random_model_path)
    assert not model.training and tokenizer is not None


def test_adapter_folder_loads_onto_its_base(lora_dir, tiny_random_model_path, capsys):
    from transformers import AutoModelForCausalLM

    folder, ids, expected = lora_dir
    with pytest.raises(OSError):  # what stapo-eval hit before
        AutoModelForCausalLM.from_pretrained(folder)
    assert resolve_model_source(str(folder)) == ModelSource(tiny_random_model_path, adapter=str(folder))
    model, tokenizer = load_causal_lm(str(folder))
    assert f"onto its base model {tiny_random_model_path}" in capsys.readouterr().out
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected, rtol=1e-4, atol=1e-4)
        base_logits = AutoModelForCausalLM.from_pretrained(tiny_random_model_path)(ids).logits
    assert (base_logits - expected).abs().max() > 1e-3  # the adapter changes the outputs: it was applied
    assert tokenizer("12+34")["input_ids"]


def test_adapter_base_override_and_missing_base(lora_dir, tiny_random_model_path, tmp_path):
    folder, _, _ = lora_dir
    assert resolve_model_source(str(folder), base_model="/elsewhere/base").base == "/elsewhere/base"
    broken = tmp_path / "adapter"
    shutil.copytree(folder, broken)
    config = json.loads((broken / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = None
    (broken / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="base_model_name_or_path"):
        resolve_model_source(str(broken))
    assert resolve_model_source(str(broken), base_model=tiny_random_model_path).base == tiny_random_model_path
