"""`benchmarks/stress.py`: the rollout-only noise hook of the stress experiment, its box detection and its exact tests.

With eps = 1 after a box every post-box position is injected, with eps = 0 generation is unchanged, and neither the
trainer's evaluation path nor a plain `generate` after training sees the noise.
"""

import sys
import warnings
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from testing_utils import tiny_stapo_config
from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessorList

from stapo_trl import STAPOConfig


sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))  # the experiment's modules
import stress_stats  # noqa: E402
import stress_trainer  # noqa: E402


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_random_model_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_random_model_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_random_model_path)
    return model.eval(), tokenizer


def test_closed_box_end_and_text_after_last_box():
    assert stress_trainer.closed_box_end(r"so \boxed{74}") == 13
    assert stress_trainer.text_after_last_box(r"so \boxed{74}}") == "}"
    assert stress_trainer.text_after_last_box(r"\boxed{1} then \boxed{2} x") == " x"
    assert stress_trainer.text_after_last_box(r"\boxed{7") is None  # unterminated: not closed
    assert stress_trainer.text_after_last_box(r"\boxed{\frac{1}{3}}.") == "."  # nested braces


def test_first_closed_step_counts_tokens_up_to_the_closing_brace(model_and_tokenizer):
    _, tokenizer = model_and_tokenizer
    ids = tokenizer(r"; \boxed{85}}x", add_special_tokens=False)["input_ids"]
    # "; " and "\" "boxed" "{" "8" "5" "}": the box closes at the 7th token whatever the exact split of "; \"
    close = stress_trainer.first_closed_step(tokenizer, ids)
    assert tokenizer.decode(ids[:close]).endswith(r"\boxed{85}")
    assert not tokenizer.decode(ids[: close - 1]).endswith("}")
    assert stress_trainer.first_closed_step(tokenizer, ids[: close - 1]) is None


def _prompt_with_box(tokenizer):
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "47+38"}], tokenize=False, add_generation_prompt=True
    )
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    box_ids = tokenizer(r"7+8=15; \boxed{85}", add_special_tokens=False)["input_ids"]
    return prompt_ids, box_ids


def _generate(model, tokenizer, input_ids, processor=None, seed=0, new=12):
    torch.manual_seed(seed)
    kwargs = {} if processor is None else {"logits_processor": LogitsProcessorList([processor])}
    return model.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=True,
        top_k=0,
        max_new_tokens=new,
        min_new_tokens=new,  # no EOS: every position is generated
        pad_token_id=tokenizer.pad_token_id,
        **kwargs,
    )


def test_eps_one_after_a_box_injects_every_post_box_position_and_nothing_before(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    prompt_ids, box_ids = _prompt_with_box(tokenizer)
    # The box tokens are given as already generated (prompt_length excludes them): a forced, known closing point.
    # Row 0 holds the closed box, row 1 only its opening (never closed by these 12 random tokens unless sampled).
    rows = [prompt_ids + box_ids, prompt_ids + box_ids[:-1] + [tokenizer.convert_tokens_to_ids("x")]]
    input_ids = torch.tensor(rows)
    processor = stress_trainer.UniformNoiseProcessor(
        tokenizer, len(prompt_ids), eps=1.0, design="post_answer", generator=torch.Generator().manual_seed(0)
    )
    out = _generate(model, tokenizer, input_ids, processor)
    assert processor.closed_at[0] == len(box_ids)  # closed before the first new token
    assert processor.injected[0] == [True] * 12  # one entry per new position: all of row 0's are post-box
    # Row 1: injected exactly from the step at which its own text closes a box (if ever), never before.
    generated = out[1, len(prompt_ids) :].tolist()  # the forced tokens, then the 12 new ones
    close = stress_trainer.first_closed_step(tokenizer, generated)
    expected = [close is not None and t >= close for t in range(len(box_ids), len(generated))]
    assert processor.injected[1] == expected
    assert processor.closed_at[1] == close


def test_eps_one_samples_uniformly_over_the_vocabulary(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    prompt_ids, box_ids = _prompt_with_box(tokenizer)
    scores = torch.randn(3, model.config.vocab_size)
    input_ids = torch.tensor([prompt_ids + box_ids] * 3)
    processor = stress_trainer.UniformNoiseProcessor(
        tokenizer, len(prompt_ids), eps=1.0, design="post_answer", generator=torch.Generator().manual_seed(0)
    )
    out = processor(input_ids, scores)
    assert torch.equal(out, torch.zeros_like(scores))  # softmax of zeros: exactly 1 / V each
    assert torch.equal(processor(input_ids, scores), out) and scores.abs().sum() > 0  # input not modified


def test_eps_zero_leaves_generation_unchanged(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    prompt_ids, box_ids = _prompt_with_box(tokenizer)
    input_ids = torch.tensor([prompt_ids + box_ids] * 4)
    processor = stress_trainer.UniformNoiseProcessor(
        tokenizer, len(prompt_ids), eps=0.0, design="everywhere", generator=torch.Generator().manual_seed(0)
    )
    with_processor = _generate(model, tokenizer, input_ids, processor, seed=3)
    without = _generate(model, tokenizer, input_ids, None, seed=3)
    assert torch.equal(with_processor, without)
    assert not any(any(row) for row in processor.injected)


def test_processor_rejects_bad_settings(model_and_tokenizer):
    _, tokenizer = model_and_tokenizer
    with pytest.raises(ValueError, match="eps=1.5"):
        stress_trainer.UniformNoiseProcessor(tokenizer, 3, eps=1.5, design="everywhere", generator=torch.Generator())
    with pytest.raises(ValueError, match="design='x'"):
        stress_trainer.UniformNoiseProcessor(tokenizer, 3, eps=0.1, design="x", generator=torch.Generator())


def _binary_reward(completions, **kwargs):
    return [float(i % 2) for i in range(len(completions))]  # varies in every group: non-zero advantages


# steps_per_generation 1: TRL's default geometry, where the mask is built in the loss from the training forward (the
# experiment's hooks must see it there too); 2: the mask is built per update from the rollout's values (the recipe's).
@pytest.mark.parametrize("steps_per_generation", [1, 2])
def test_noise_reaches_rollouts_only(tiny_random_model_path, tmp_path, monkeypatch, steps_per_generation):
    prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}+{i % 7}"}]} for i in range(16)])
    args = tiny_stapo_config(
        tmp_path, max_completion_length=6, max_steps=1, seed=0, steps_per_generation=steps_per_generation
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = stress_trainer.StressTrainer(
            tiny_random_model_path, reward_funcs=_binary_reward, args=args, train_dataset=prompts
        )
    trainer.setup_stress(eps=1.0, design="everywhere", seed=0)
    calls = []
    original_call = stress_trainer.UniformNoiseProcessor.__call__
    monkeypatch.setattr(
        stress_trainer.UniformNoiseProcessor,
        "__call__",
        lambda self, i, s: calls.append(1) or original_call(self, i, s),
    )
    trainer.train()
    rollout_calls = len(calls)
    assert rollout_calls > 0
    # eps = 1 everywhere: every generated position of every rollout was drawn uniformly.
    assert all(all(row) for record in trainer._noise_records for row in record.injected)
    assert trainer.mask_stats["injected/tokens"] > 0 and trainer.mask_stats["policy/tokens"] == 0
    # The ground-truth check ran on the one update's mask and agreed with the rule recomputed from its inputs.
    assert trainer.mask_stats["batches"] == 1
    assert trainer.mask_stats["injected/candidate_mismatch"] == trainer.mask_stats["injected/silenced_mismatch"] == 0
    assert "generate" not in vars(trainer.model)  # the hook is gone after the rollout
    tokenizer = trainer.processing_class
    result = stress_trainer.evaluate_junk(
        trainer.model, tokenizer, [[{"role": "user", "content": "1+2"}]], ["3"], k=2, max_new_tokens=4, seed=0
    )
    assert result["num_completions"] == 2
    assert len(calls) == rollout_calls  # evaluation never called the processor


def test_exact_paired_tests():
    assert stress_stats.sign_test([1.0] * 8) == pytest.approx(2 / 256)  # 8 of 8 positive: 2 * (1/2)^8
    assert stress_stats.sign_test([1.0, -1.0, 0.0]) == 1.0  # zeros dropped, 1 vs 1
    assert stress_stats.sign_test([1.0, 2.0, 3.0, -1.0]) == pytest.approx(2 * 5 / 16)  # k = 1 of n = 4
    assert stress_stats.paired_permutation_test([1.0, 2.0, 3.0]) == pytest.approx(
        2 / 8
    )  # only all-same-sign flips reach 6
    assert stress_stats.paired_permutation_test([1.0, -1.0]) == 1.0


def test_attribution_shares_match_one_backward_pass_per_token_kind(tiny_random_model_path, tmp_path):
    # The attribution splits the first-order change of the probe's log p(`}`) over tokens with one probe backward and
    # two finite-difference forwards. Before Adam has state its preconditioner is 1, so each kind's share must equal
    # -lr * <dL_kind/dθ, d log p(`}`)/dθ>, computed here with one explicit backward pass per kind.
    from stapo_trl.trainer import STAPOTrainer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = STAPOConfig(
            output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], per_device_train_batch_size=4,
            num_generations=2, max_completion_length=5, learning_rate=1e-3, s2t_mode="off",
            steps_per_generation=2,  # the experiment's geometry: the mask per update from stored values, not in the loss
        )  # fmt: skip
        prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": "1+2"}]}] * 4)
        trainer = stress_trainer.StressTrainer(
            tiny_random_model_path, reward_funcs=_binary_reward, args=args, train_dataset=prompts
        )
    tokenizer = trainer.processing_class
    probe = stress_trainer.BracketProbe(
        tokenizer, [[{"role": "user", "content": "47+38"}]] * 2, [r"\boxed{85}", r"; \boxed{9}"]
    )
    trainer.setup_stress(eps=0.2, design="post_answer", seed=0, attribution=True, probe=probe)
    trainer.create_optimizer()
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    generator = torch.Generator().manual_seed(0)
    vocab = trainer.model.config.vocab_size
    completion_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
    inputs = {
        "prompt_ids": torch.randint(3, vocab, (4, 3), generator=generator),
        "prompt_mask": torch.ones(4, 3, dtype=torch.long),
        "completion_ids": torch.randint(3, vocab, (4, 5), generator=generator),
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.0, -0.5, 2.0, -1.5]),
        "num_items_in_batch": completion_mask.sum(),
        "stress_kind": torch.tensor([[0, 0, 1, 2, 5], [0, 3, 4, 0, 0], [0, 1, 2, 2, 2], [0, 5, 0, 0, 0]]),
        "stress_candidate": torch.zeros(4, 5, dtype=torch.long),
    }
    loss = trainer._compute_loss(trainer.model, inputs)
    row = trainer.attribution_steps[-1]

    params = [p for p in trainer.model.parameters() if p.requires_grad]
    probe_grad = torch.autograd.grad(probe.log_prob_close(trainer.model), params)
    total = 0.0
    for k, name in enumerate(stress_trainer.KINDS):
        for sign, adv in (("pos", inputs["advantages"] > 0), ("neg", inputs["advantages"] < 0)):
            select = ((inputs["stress_kind"] == k) & adv[:, None]).long()
            if not (select * completion_mask).any():
                assert row[f"{name}/{sign}"] == 0.0
                continue
            loss_c = STAPOTrainer._compute_loss(trainer, trainer.model, {**inputs, "tool_mask": select})
            grads = torch.autograd.grad(loss_c, params, allow_unused=True)
            explicit = -1e-3 * sum(float((g * pg).sum()) for g, pg in zip(grads, probe_grad) if g is not None)
            assert row[f"{name}/{sign}"] == pytest.approx(explicit, rel=0.02, abs=1e-7), (name, sign)
            total += explicit
    whole = torch.autograd.grad(loss, params, allow_unused=True)
    explicit_whole = -1e-3 * sum(float((g * pg).sum()) for g, pg in zip(whole, probe_grad) if g is not None)
    assert total == pytest.approx(explicit_whole, rel=1e-4, abs=1e-9)  # the kinds add up to the whole batch
    assert abs(explicit_whole) > 0
    shares = [row[f"{name}/{sign}"] for name in stress_trainer.KINDS for sign in ("pos", "neg")]
    assert sum(shares) == pytest.approx(explicit_whole, rel=0.02)


def test_the_entry_script_loads_and_parses_its_defaults():
    import stress

    args = stress.parse_args([])
    assert args.design == "post_answer" and args.eps == 0.2 and args.steps == 400 and args.arms == list(stress.ARMS)
