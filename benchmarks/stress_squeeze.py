#!/usr/bin/env python
r"""The mechanism of the stress experiment in isolation: uniform junk after `\boxed{}` trained with A > 0, A < 0, both.

    python benchmarks/stress_squeeze.py          # ~1 min of CPU (3 arms x 150 Adam steps on the SFT demo model)

On the built-in SFT model (`builtin:tiny-math`), take 64 training contexts "prompt + gold completion ending in
`\boxed{sum}`" (32 more held out). Each step draws, per context, a token y uniformly over the vocabulary and applies
the policy-gradient loss of that token with advantage +1 (`pos`: -log pi(y)), -1 (`neg`: +log pi(y)) or both with
independent draws (`both`: the two cancel in expectation, as reward-neutral junk does under GRPO, where it is
equally likely in correct and wrong completions). `neg` alone is what is left when S2T silences the positive side
(the paper's rule never silences negative-advantage tokens). AdamW lr 1e-4, no weight decay, grad clip 1.0.
Prints p(`}`) and p(EOS) at the post-box position of the held-out contexts every 50 steps, and the tokens closest
to EOS in the model's (tied) output embedding.
"""

import os


os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from stapo_trl.data import INSTRUCTION, tiny_math_completion  # noqa: E402
from stapo_trl.models import resolve_model_path  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    path = resolve_model_path("builtin:tiny-math")
    tokenizer = AutoTokenizer.from_pretrained(path)
    close, eos = tokenizer.convert_tokens_to_ids("}"), tokenizer.eos_token_id

    def context(a: int, b: int) -> list[int]:
        messages = [{"role": "user", "content": f"{a}+{b}\n{INSTRUCTION}"}]
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tokenizer(prompt + tiny_math_completion(a, b), add_special_tokens=False)["input_ids"]

    generator = torch.Generator().manual_seed(0)
    pairs = [(int(a), int(b)) for a, b in torch.randint(10, 100, (96, 2), generator=generator)]

    def left_pad(rows):
        width = max(map(len, rows))
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])
        return ids, torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])

    train_ids, train_mask = left_pad([context(a, b) for a, b in pairs[:64]])
    held_ids, held_mask = left_pad([context(a, b) for a, b in pairs[64:]])

    def run(arm: str, steps: int = 150, lr: float = 1e-4, seed: int = 0):
        model = AutoModelForCausalLM.from_pretrained(path)
        model.train()
        vocab = model.config.vocab_size
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        draws = torch.Generator().manual_seed(seed)
        history = []
        for step in range(steps + 1):
            if step % 50 == 0:
                with torch.no_grad():
                    logits = model(input_ids=held_ids, attention_mask=held_mask).logits[:, -1]
                    logp = torch.log_softmax(logits, -1)
                history.append((step, float(logp[:, close].exp().mean()), float(logp[:, eos].exp().mean())))
            if step == steps:
                break
            logp = torch.log_softmax(model(input_ids=train_ids, attention_mask=train_mask).logits[:, -1], -1)
            y_pos = torch.randint(0, vocab, (logp.size(0),), generator=draws)
            y_neg = torch.randint(0, vocab, (logp.size(0),), generator=draws)
            pos = -logp.gather(1, y_pos[:, None]).mean()  # advantage +1
            neg = logp.gather(1, y_neg[:, None]).mean()  # advantage -1
            loss = {"neg": neg, "pos": pos, "both": pos + neg}[arm]
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        return history

    for arm in ("both", "neg", "pos"):
        cells = " ".join(f"step {s}: p(}})={pc:.2e} p(eos)={pe:.3f}" for s, pc, pe in run(arm))
        print(arm, cells)
    with torch.no_grad():
        weight = AutoModelForCausalLM.from_pretrained(path).get_output_embeddings().weight
        unit = torch.nn.functional.normalize(weight, dim=-1)
        similarity = unit @ unit[eos]
        order = similarity.argsort(descending=True)[:6]
        closest = [(tokenizer.convert_ids_to_tokens(int(i)), round(float(similarity[i]), 3)) for i in order]
        print("tokens closest to EOS in the (tied) output embedding:", closest)


if __name__ == "__main__":
    main()
