"""Generation (`stapo_trl.evaluation.generation`): HF temperature 0 is argmax decoding (against a hand-written argmax
loop over the model's logits); the vLLM backend's calls to a stand-in `vllm` module (vLLM is absent here; real vLLM
runs are in `tests/integrations/test_vllm.py`) and the LoRA rank it reserves for an adapter."""

import pytest

from stapo_trl.evaluation.generation import GeneratedSample, VLLMGenerator, build_prompt_text, hf_generate


def test_hf_generate_at_temperature_zero_is_argmax_decoding(tiny_random_model_path):
    # Temperature 0 means argmax decoding (as in vLLM): the same tokens as a hand-written argmax loop over the model's
    # logits, whatever the seed. transformers would refuse temperature=0.0 with do_sample=True.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_random_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_random_model_path, dtype=torch.float32)
    prompts = [build_prompt_text(tokenizer, p) for p in ["12+34", "7+8"]]
    expected = []
    for text in prompts:
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]  # (1, P)
        new = []
        with torch.no_grad():
            for _ in range(6):
                next_id = int(
                    model(torch.cat([ids, torch.tensor([new], dtype=torch.long)], dim=1)).logits[0, -1].argmax()
                )
                new.append(next_id)
                if next_id == tokenizer.eos_token_id:
                    break
        expected.append(tokenizer.decode(new, skip_special_tokens=True))
    for seed in (0, 1):
        samples = hf_generate(model, tokenizer, prompts, n=2, temperature=0.0, top_p=1.0, max_new_tokens=6, seed=seed)
        assert [[s.text for s in row] for row in samples] == [[e, e] for e in expected]


def test_vllm_generator_with_a_fake_vllm(monkeypatch):
    # vLLM is GPU-only and absent here: a stand-in module checks the calls we make (SamplingParams(n, temperature,
    # top_p, max_tokens), token-id prompts without extra special tokens) and the mapping of its outputs.
    import sys
    import types

    calls = {}

    class SamplingParams:
        def __init__(self, **kwargs):
            calls["sampling"] = kwargs
            calls.setdefault("seeds", []).append(kwargs["seed"])
            self.n = kwargs["n"]

    class FakeTokenizer:
        def __call__(self, text, add_special_tokens=True):
            calls.setdefault("add_special_tokens", []).append(add_special_tokens)
            return {"input_ids": [ord(c) for c in text]}

    class LLM:
        def __init__(self, **kwargs):
            calls["llm"] = kwargs

        def get_tokenizer(self):
            return FakeTokenizer()

        def generate(self, prompts, params):
            calls["prompts"] = prompts
            assert len(params) == len(prompts)  # one SamplingParams per prompt (its own seed)
            n = params[0].n
            out = types.SimpleNamespace(text=r"\boxed{3}", token_ids=[1, 2, 3], finish_reason="stop")
            cut = types.SimpleNamespace(text=r"\boxed{", token_ids=[1] * 8, finish_reason="length")
            return [types.SimpleNamespace(outputs=[out] * (n - 1) + [cut]) for _ in prompts]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams))
    gpu_platform = types.SimpleNamespace(is_cpu=lambda: False)
    monkeypatch.setitem(sys.modules, "vllm.platforms", types.SimpleNamespace(current_platform=gpu_platform))
    generator = VLLMGenerator("some/model", seed=3, tensor_parallel_size=2)
    samples = generator.generate(["ab", "c"], n=4, temperature=0.7, top_p=0.9, max_new_tokens=20480, seed=5)
    assert calls["sampling"] == {"n": 4, "temperature": 0.7, "top_p": 0.9, "max_tokens": 20480, "seed": 9}
    # vLLM seeds sample j of a request with seed + j: prompt i starts at 5 + 4 i, so no two samples share a seed.
    assert calls["seeds"] == [5, 9]
    assert calls["llm"]["model"] == "some/model" and calls["llm"]["tensor_parallel_size"] == 2
    assert calls["llm"]["gpu_memory_utilization"] == 0.9 and "enforce_eager" not in calls["llm"]  # GPU defaults
    assert calls["prompts"] == [{"prompt_token_ids": [97, 98]}, {"prompt_token_ids": [99]}]
    assert calls["add_special_tokens"] == [False, False]
    assert [len(s) for s in samples] == [4, 4]
    assert samples[0][0] == GeneratedSample(r"\boxed{3}", 3, True)
    assert samples[0][-1].finished is False


def test_vllm_max_lora_rank_is_the_smallest_supported_rank_holding_the_adapter(tmp_path):
    import json

    from stapo_trl.evaluation.generation import vllm_max_lora_rank

    def adapter(name, **config):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "adapter_config.json").write_text(json.dumps(config))
        return str(folder)

    assert vllm_max_lora_rank(adapter("r8", r=8)) == 8
    assert vllm_max_lora_rank(adapter("r12", r=12)) == 16
    assert vllm_max_lora_rank(adapter("pattern", r=8, rank_pattern={"q_proj": 40})) == 64  # a per-module rank
    with pytest.raises(ValueError, match="LoRA rank 1024 is above vLLM's largest max_lora_rank 512"):
        vllm_max_lora_rank(adapter("huge", r=1024))
