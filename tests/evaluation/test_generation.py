"""HF generation (`stapo_trl.evaluation.generation`): temperature 0 is argmax decoding, checked against a
hand-written argmax loop over the model's logits."""

from stapo_trl.evaluation.generation import (
    build_prompt_text,
    hf_generate,
)


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
