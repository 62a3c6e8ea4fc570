"""Generation: argmax at temperature 0, a seed per sample, token statistics, the vLLM backend's calls and LoRA rank."""

import json
import math
import sys
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from stapo_trl.evaluation import generation
from stapo_trl.evaluation.generation import GeneratedSample, HFGenerator, VLLMGenerator, build_prompt_text, hf_generate


def test_hf_generate_at_temperature_zero_is_argmax_decoding(tiny_random_model_path):  # as vLLM, whatever the seed
    tokenizer = AutoTokenizer.from_pretrained(tiny_random_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_random_model_path, dtype=torch.float32)
    prompts, expected = [build_prompt_text(tokenizer, p) for p in ["12+34", "7+8"]], []
    for text in prompts:
        ids, new = tokenizer(text, add_special_tokens=False)["input_ids"], []
        while len(new) < 6 and tokenizer.eos_token_id not in new:
            with torch.no_grad():
                new.append(int(model(torch.tensor([ids + new])).logits[0, -1].argmax()))
        expected.append(tokenizer.decode(new, skip_special_tokens=True))
    for seed in (0, 1):
        out = hf_generate(model, tokenizer, prompts, n=2, temperature=0, top_p=1, max_new_tokens=6, seeds=[seed] * 2)
        assert [[s.text for s in row] for row in out] == [[e, e] for e in expected]


def test_each_row_samples_the_warped_distribution_from_its_own_seed_whatever_the_batch(tiny_math_model_path):
    # row r's token: inverse CDF of draw t of the stream seeded seeds[r], over the top-p 0.5 set {0.3, 0.4}
    logits = torch.tensor([0.1, 0.2, 0.3, 0.4]).log().expand(4000, 4)  # (B, V)
    sample = generation._seeded_sampler(1.0, 0.5, list(range(4000)), steps := [])
    tokens = [sample(None, logits).argmax(-1) for _ in range(2)]
    for step, drawn in enumerate(tokens):
        for r in (0, 1, 2, 3999):
            u = torch.rand(2, generator=torch.Generator().manual_seed(r), dtype=torch.float64)[step].item()
            assert drawn[r].item() == (2 if u < 3 / 7 else 3), (step, r)  # the CDF: 0, 0, 3/7, 1
        assert set(drawn.tolist()) == {2, 3} and abs((drawn == 3).double().mean().item() - 4 / 7) < 0.03
    assert not torch.equal(tokens[0], tokens[1])
    entropy = -(3 / 7 * math.log(3 / 7) + 4 / 7 * math.log(4 / 7))
    for (h, p), drawn in zip(steps, tokens, strict=True):
        torch.testing.assert_close(h, torch.full((4000,), entropy))
        torch.testing.assert_close(p, torch.where(drawn == 2, 3 / 7, 4 / 7))
    generator = HFGenerator(tiny_math_model_path, dtype="float32", device="cpu")
    texts = [build_prompt_text(generator.tokenizer, f"{a}+{a + 11}") for a in range(10, 16)]  # 6 prompts
    sampling, runs, stats = {"n": 3, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 16}, [], {}
    for batch_size, first in ((18, 0), (4, 0), (2, 3)):  # first 3: a process holding the last 3 problems
        generator.batch_size = batch_size
        seeds = [7 + 3 * i for i in range(first, 6)]  # evaluate_problems' seed + i * n
        samples = generator.generate(texts[first:], seeds=seeds, stats=stats if batch_size == 18 else None, **sampling)
        runs.append([[s.text for s in row] for row in samples])
        if batch_size == 18:  # the statistics of every sampled token
            assert len(stats["entropy"]) == len(stats["prob"]) == sum(s.num_tokens for row in samples for s in row)
    assert runs[0] == runs[1] and runs[0][3:] == runs[2]
    assert len({text for row in runs[0] for text in row}) > 6  # sampled: not one completion per prompt
    assert all(h >= 0 for h in stats["entropy"]) and all(0 < p <= 1 for p in stats["prob"])


def test_vllm_generator_with_a_fake_vllm(monkeypatch, tmp_path):
    # a stand-in `vllm`: one SamplingParams per prompt, token-id prompts without special tokens, outputs mapped
    calls = {"add_special_tokens": []}
    out = SimpleNamespace(text=r"\boxed{3}", token_ids=[1, 2, 3], finish_reason="stop")
    cut = SimpleNamespace(text=r"\boxed{", token_ids=[1] * 8, finish_reason="length")

    def tokenizer(text, add_special_tokens=True):
        return calls["add_special_tokens"].append(add_special_tokens) or {"input_ids": [ord(c) for c in text]}

    def generate(prompts, params):
        calls["prompts"] = prompts
        return [SimpleNamespace(outputs=[out] * (p.n - 1) + [cut]) for p in params]

    def record(key, result):  # a vllm callable keeping its keyword arguments
        return lambda **kwargs: calls.setdefault(key, []).append(kwargs) or result(kwargs)

    llm = record("llm", lambda _: SimpleNamespace(get_tokenizer=lambda: tokenizer, generate=generate))
    params = record("params", lambda kwargs: SimpleNamespace(n=kwargs["n"]))
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(LLM=llm, SamplingParams=params))
    monkeypatch.setitem(sys.modules, "vllm.platforms", SimpleNamespace(current_platform=SimpleNamespace(is_cpu=bool)))
    generator = VLLMGenerator("some/model", seed=3, tensor_parallel_size=2)
    samples = generator.generate(["ab", "c"], n=4, temperature=0.7, top_p=0.9, max_new_tokens=20480, seeds=[5, 9])
    sampling = {"n": 4, "temperature": 0.7, "top_p": 0.9, "max_tokens": 20480}
    assert calls["params"] == [sampling | {"seed": 5}, sampling | {"seed": 9}]  # vLLM seeds sample j with seed + j
    ((llm,),) = [calls["llm"]]
    assert llm["model"] == "some/model" and llm["tensor_parallel_size"] == 2
    assert llm["gpu_memory_utilization"] == 0.9 and "enforce_eager" not in llm  # GPU defaults
    assert calls["prompts"] == [{"prompt_token_ids": [97, 98]}, {"prompt_token_ids": [99]}]
    assert calls["add_special_tokens"] == [False, False] and [len(s) for s in samples] == [4, 4]
    assert samples[0][0] == GeneratedSample(r"\boxed{3}", 3, True) and samples[0][-1].finished is False
    for config, rank in [({"r": 8}, 8), ({"r": 12}, 16), ({"r": 8, "rank_pattern": {"q": 40}}, 64)]:
        (tmp_path / "adapter_config.json").write_text(json.dumps(config))
        assert generation.vllm_max_lora_rank(str(tmp_path)) == rank
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 1024}))
    with pytest.raises(ValueError, match="LoRA rank 1024 is above vLLM's largest max_lora_rank 512"):
        generation.vllm_max_lora_rank(str(tmp_path))
