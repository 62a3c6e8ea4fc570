"""S2T diagnostics: the gradient-norm identity and the paper's bounds against autograd, the histogram quantile's
error bound, hand-derived metrics and per-token records, the collision probability of the fused head, and a real
short run whose records and figures are written."""

import json
import math
import sys
import types
import warnings

import pytest
import torch
from datasets import Dataset
from testing_utils import tiny_stapo_config

from stapo_trl import STAPOConfig, STAPOTrainer, s2t_mask
from stapo_trl.callbacks import SpuriousTokenLogger
from stapo_trl.core.s2t import S2TBatch, S2TResult, linear_quantile
from stapo_trl.core.s2t_metrics import (
    ENTROPY_MIN,
    HISTOGRAM_QUANTILE_REL_ERROR,
    entropy_histogram,
    histogram_quantile,
    logit_grad_norm_bounds,
    logit_grad_norm_sq,
    policy_gradient_weight,
    s2t_diagnostic_metrics,
)
from stapo_trl.diagnostic_plots import plot_diagnostics
from stapo_trl.metrics_log import SPURIOUS_TOKENS_FILENAME, read_token_records
from stapo_trl.token_records import spurious_token_records


# ----------------------------------------------------------------------------------------------------------------
# Gradient norm w.r.t. the logits
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("vocab_size", [2, 7, 300, 5000])
@pytest.mark.parametrize("scale", [0.1, 1.0, 4.0, 12.0])  # near-uniform ... very peaked distributions
def test_logit_grad_norm_matches_autograd_and_lies_within_the_paper_bounds(vocab_size, scale):
    generator = torch.Generator().manual_seed(vocab_size * 100 + int(scale * 10))
    num_tokens = 64
    logits = (torch.randn(num_tokens, vocab_size, generator=generator, dtype=torch.float64) * scale).requires_grad_()
    # Half the sampled tokens are the least likely ones: the low-probability regime the paper is about.
    probs = torch.softmax(logits.detach(), dim=-1)
    sampled = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # (N,)
    sampled[::2] = probs[::2].argmin(dim=-1)
    weight = torch.randn(num_tokens, generator=generator, dtype=torch.float64) * 2  # w = ratio * A, any sign

    log_probs = torch.log_softmax(logits, dim=-1)
    loss = -(weight * log_probs.gather(1, sampled.unsqueeze(1)).squeeze(1)).sum()  # tokens have separate logits
    loss.backward()
    autograd_sq = logits.grad.square().sum(dim=-1)  # (N,)

    p = probs.gather(1, sampled.unsqueeze(1)).squeeze(1)
    collision = probs.square().sum(dim=-1)
    entropy = -(probs * torch.log(probs.clamp(min=1e-300))).sum(dim=-1)
    torch.testing.assert_close(logit_grad_norm_sq(p, collision, weight), autograd_sq, rtol=1e-10, atol=1e-12)
    lower, upper = logit_grad_norm_bounds(p, entropy, weight, vocab_size)
    assert torch.all(lower <= autograd_sq * (1 + 1e-9) + 1e-12)
    assert torch.all(autograd_sq <= upper * (1 + 1e-9) + 1e-12)


def test_upper_bound_is_tight_at_the_uniform_distribution_and_lower_bound_at_a_point_mass():
    vocab_size = 50
    p = torch.tensor([1 / vocab_size], dtype=torch.float64)
    w = torch.tensor([1.5], dtype=torch.float64)
    exact = logit_grad_norm_sq(p, torch.tensor([1 / vocab_size], dtype=torch.float64), w)
    lower, upper = logit_grad_norm_bounds(p, torch.tensor([math.log(vocab_size)], dtype=torch.float64), w, vocab_size)
    torch.testing.assert_close(upper, exact)
    # Point mass on another token (p = 0, H = 0, sum pi^2 = 1): ||pi - e_a||^2 = 2; both bounds give 2.
    zero = torch.zeros(1, dtype=torch.float64)
    lower, upper = logit_grad_norm_bounds(zero, zero, w, vocab_size)
    torch.testing.assert_close(lower, 2 * w**2)
    torch.testing.assert_close(upper, 2 * w**2)


def test_policy_gradient_weight_is_zero_exactly_where_the_clip_acts():
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0, 2.0])
    ratio = torch.tensor([1.1, 1.3, 0.9, 0.7, 1.0])  # eps_low 0.2, eps_high 0.28: rows 1 and 3 are clipped
    w = policy_gradient_weight(advantages.unsqueeze(1), torch.log(ratio).unsqueeze(1), 0.2, 0.28).squeeze(1)
    torch.testing.assert_close(w, torch.tensor([1.1, 0.0, -0.9, 0.0, 2.0]))
    assert torch.equal(policy_gradient_weight(advantages), advantages.unsqueeze(1))  # on-policy: w = A


# ----------------------------------------------------------------------------------------------------------------
# Entropy quantiles from the log-spaced histogram
# ----------------------------------------------------------------------------------------------------------------
def test_histogram_quantile_is_within_its_stated_error_of_the_exact_quantile():
    generator = torch.Generator().manual_seed(0)
    # Entropies spanning 1e-9 .. 20 nats (LLM-like: most tokens near 0), exact zeros and heavy ties.
    values = torch.exp(torch.randn(20_001, generator=generator) * 4 - 3).clamp(max=20.0)
    values[:500] = 0.0
    values[500:1500] = 0.25
    histogram = entropy_histogram(values)
    assert histogram.sum().item() == values.numel()
    for q in [0.0, 0.01, 0.1, 0.25, 0.5, 0.8, 0.95, 0.999, 1.0]:
        exact = linear_quantile(values.double(), q)
        estimate = histogram_quantile(histogram, q)
        assert abs(estimate - exact) <= HISTOGRAM_QUANTILE_REL_ERROR * exact + ENTROPY_MIN / 2 + 1e-12, q
    assert math.isnan(histogram_quantile(entropy_histogram(torch.empty(0)), 0.5))


def test_histograms_of_parts_add_up_to_the_histogram_of_the_whole():
    values = torch.rand(1000, generator=torch.Generator().manual_seed(1)) * 3
    parts = entropy_histogram(values[:300]) + entropy_histogram(values[300:])
    torch.testing.assert_close(parts, entropy_histogram(values))


# ----------------------------------------------------------------------------------------------------------------
# A hand-built batch
# ----------------------------------------------------------------------------------------------------------------
VOCAB = ["<pad>", "1", "+", "2", "=", "3", "<eos>"]


class CharTokenizer:
    """decode(ids) = the concatenated vocabulary strings."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(VOCAB[i] for i in ids)


def hand_batch():
    """Two completions, tau_p = 0.01, q = 0.5.

    Row 0 ("1+2=3", A = +1, 5 loss tokens): p = [0.5, 0.001, 0.002, 0.9, 0.005], H = [0.1, 0.2, 0.9, 0.3, 0.5].
      Candidates (p < 0.01): positions 1, 2, 4 with H = 0.2, 0.9, 0.5 -> tau_h = median = 0.5 (h = 2 * 0.5 = 1).
      Silenced (H < 0.5): position 1 ("+"). Kept candidates: positions 2 ("2") and 4 ("3").
      Other positive-advantage tokens: positions 0 ("1") and 3 ("=").
    Row 1 (A = -1, 3 loss tokens + 2 padding): never a candidate. Its padding carries garbage that must be ignored.
    Collision probabilities sum pi^2 (each >= p^2): row 0 [0.3, 0.6, 0.6, 0.82, 0.6], row 1 [0.5, 0.5, 0.5].
    """
    probs = torch.tensor([[0.5, 0.001, 0.002, 0.9, 0.005], [0.2, 0.0005, 0.3, 1e-9, 1e-9]])
    entropies = torch.tensor([[0.1, 0.2, 0.9, 0.3, 0.5], [0.4, 0.05, 0.6, 99.0, 99.0]])
    collision = torch.tensor([[0.3, 0.6, 0.6, 0.82, 0.6], [0.5, 0.5, 0.5, 1.0, 1.0]])
    loss_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    advantages = torch.tensor([1.0, -1.0])
    completion_ids = torch.tensor([[1, 2, 3, 4, 5], [5, 4, 3, 0, 0]])
    logps = torch.log(probs)
    result = s2t_mask(logps, entropies, advantages, loss_mask, prob_threshold=0.01, entropy_quantile=0.5)
    return S2TBatch(
        result=result,
        per_token_logps=logps,
        entropies=entropies,
        advantages=advantages,
        loss_mask=loss_mask,
        completion_ids=completion_ids,
        mode="train",
        log_collision=torch.log(collision),
    )


def test_hand_batch_metrics():
    batch = hand_batch()
    assert batch.result.entropy_threshold == pytest.approx(0.5)
    assert batch.result.silenced.nonzero().tolist() == [[0, 1]]
    metrics = s2t_diagnostic_metrics(
        batch.result,
        batch.per_token_logps,
        batch.entropies,
        batch.advantages,
        batch.loss_mask,
        log_collision=batch.log_collision,
    )
    # Loss-token entropies sorted: [0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.9] (n = 8, h = 7 q):
    # p10: h = 0.7 -> 0.05 + 0.7 * 0.05 = 0.085; p50: h = 3.5 -> 0.35; p80: h = 5.6 -> 0.56; p95: h = 6.65 -> 0.795.
    for key, exact in [("p10", 0.085), ("p50", 0.35), ("p80", 0.56), ("p95", 0.795)]:
        assert metrics[f"s2t/entropy_{key}"] == pytest.approx(exact, rel=HISTOGRAM_QUANTILE_REL_ERROR)
    assert metrics["s2t/silenced_prob_mean"] == pytest.approx(0.001)
    assert metrics["s2t/silenced_entropy_mean"] == pytest.approx(0.2)
    # ||g||^2 = A^2 (1 - 2p + sum pi^2). Row 0: 0.3, 1.598, 1.596, 0.02, 1.59; row 1: 1.1, 1.499, 0.9 (sum 8.603).
    # Candidates: 1.598 + 1.596 + 1.59 = 4.784; silenced: 1.598.
    assert metrics["s2t/grad_norm_share_candidates"] == pytest.approx(4.784 / 8.603)
    assert metrics["s2t/grad_norm_share_silenced"] == pytest.approx(1.598 / 8.603)


def test_metrics_are_nan_when_undefined():
    batch = hand_batch()
    advantages = torch.zeros(2)  # all groups all-correct: no candidate, every w = 0
    result = s2t_mask(batch.per_token_logps, batch.entropies, advantages, batch.loss_mask, prob_threshold=0.01)
    metrics = s2t_diagnostic_metrics(
        result, batch.per_token_logps, batch.entropies, advantages, batch.loss_mask, log_collision=batch.log_collision
    )
    for key in (
        "silenced_prob_mean",
        "silenced_entropy_mean",
        "grad_norm_share_candidates",
        "grad_norm_share_silenced",
    ):
        assert math.isnan(metrics[f"s2t/{key}"]), key
    assert metrics["s2t/entropy_p50"] == pytest.approx(0.35, rel=HISTOGRAM_QUANTILE_REL_ERROR)
    no_collision = s2t_diagnostic_metrics(
        batch.result, batch.per_token_logps, batch.entropies, batch.advantages, batch.loss_mask
    )
    assert math.isnan(no_collision["s2t/grad_norm_share_silenced"])
    assert no_collision["s2t/silenced_prob_mean"] == pytest.approx(0.001)


def test_metrics_reduced_over_two_processes_equal_the_single_process_metrics():
    """Split the hand batch by rows between two emulated processes: one all-reduce of sums and counts each."""
    batch = hand_batch()
    full = s2t_diagnostic_metrics(
        batch.result,
        batch.per_token_logps,
        batch.entropies,
        batch.advantages,
        batch.loss_mask,
        log_collision=batch.log_collision,
    )

    def part(rows):
        r = batch.result
        result = S2TResult(r.keep[rows], r.candidate[rows], r.silenced[rows], r.entropy_threshold, 0, 0, 0)
        return (
            result,
            batch.per_token_logps[rows],
            batch.entropies[rows],
            batch.advantages[rows],
            batch.loss_mask[rows],
        )

    other = {}

    def keep_other(local):
        other["local"] = local
        return local

    s2t_diagnostic_metrics(*part(slice(1, 2)), log_collision=batch.log_collision[1:], reduce=keep_other)
    reduced = s2t_diagnostic_metrics(
        *part(slice(0, 1)), log_collision=batch.log_collision[:1], reduce=lambda local: local + other["local"]
    )
    assert reduced == pytest.approx(full)


def test_hand_batch_records():
    records = spurious_token_records(
        hand_batch(),
        CharTokenizer(),
        step=7,
        prob_threshold=0.01,
        context_tokens=2,
        max_silenced=10,
        max_kept_candidates=10,
        max_reference=10,
    )
    got = [(r["kind"], r["token"], r["position"], r["context"]) for r in records]
    # Context: up to 2 completion tokens each side, never past the last loss token.
    assert got == [
        ("silenced", "+", 1, "1⟦+⟧2="),
        ("kept_candidate", "2", 2, "1+⟦2⟧=3"),
        ("kept_candidate", "3", 4, "2=⟦3⟧"),
        ("reference", "1", 0, "⟦1⟧+2"),
        ("reference", "=", 3, "+2⟦=⟧3"),
    ]
    silenced = records[0]
    assert silenced["silenced"] is True and silenced["candidate"] is True
    assert all(r["silenced"] is False for r in records[1:])
    assert [r["candidate"] for r in records[1:]] == [True, True, False, False]
    assert silenced["prob"] == pytest.approx(0.001) and silenced["logprob"] == pytest.approx(math.log(0.001))
    assert silenced["entropy"] == pytest.approx(0.2) and silenced["advantage"] == 1.0
    assert silenced["logit_grad_norm"] == pytest.approx(math.sqrt(1 - 0.002 + 0.6))  # |A| sqrt(1 - 2p + sum pi^2)
    assert silenced["entropy_threshold"] == pytest.approx(0.5) and silenced["prob_threshold"] == 0.01
    assert silenced["step"] == 7 and silenced["token_id"] == 2 and silenced["completion_index"] == 0
    json.dumps(records)  # JSON-serialisable


def test_records_are_capped_and_deterministic():
    batch = hand_batch()
    kwargs = {"step": 3, "max_silenced": 0, "max_kept_candidates": 1, "max_reference": 1}
    first = spurious_token_records(batch, CharTokenizer(), **kwargs)
    assert [r["kind"] for r in first] == ["kept_candidate", "reference"]
    assert first == spurious_token_records(batch, CharTokenizer(), **kwargs)


# ----------------------------------------------------------------------------------------------------------------
# The trainer: collision probability, metrics, records and figures
# ----------------------------------------------------------------------------------------------------------------
def _make_trainer(model_path, tmp_path, train_dataset, reward, **overrides):
    settings = {
        "output_dir": str(tmp_path / "run"),
        "use_cpu": True,
        "bf16": False,  # bf16 on CPU is slow and not what the maths is checked in
        "report_to": [],
        "per_device_train_batch_size": 8,
        "num_generations": 4,
        "max_completion_length": 32,  # tiny-math answers are ~30 tokens
        "logging_steps": 1,
        "save_strategy": "no",
        "seed": 0,
    }
    settings.update(overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = STAPOConfig(**settings)
        return STAPOTrainer(model_path, reward_funcs=reward, args=args, train_dataset=train_dataset)


def _zero_reward(completions, **kwargs):
    return [0.0] * len(completions)


PROMPTS = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}+{i % 7}"}]} for i in range(16)])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_head_collision_probability_equals_the_softmax_of_the_logits(
    tiny_random_model_path, tmp_path, temperature
):
    trainer = _make_trainer(tiny_random_model_path, tmp_path, PROMPTS, _zero_reward, temperature=temperature)
    generator = torch.Generator().manual_seed(0)
    vocab = trainer.model.config.vocab_size
    inputs = {
        "prompt_ids": torch.randint(3, vocab, (3, 4), generator=generator),
        "prompt_mask": torch.ones(3, 4, dtype=torch.long),
        "completion_ids": torch.randint(3, vocab, (3, 6), generator=generator),
        "completion_mask": torch.ones(3, 6, dtype=torch.long),
    }
    logps, _ = trainer._policy_logps_and_entropies(inputs)
    log_collision = trainer._s2t_log_collision
    assert log_collision is not None and log_collision.shape == logps.shape
    with torch.no_grad():
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        logits = trainer.model(input_ids=input_ids).logits[:, 3:-1] / temperature  # positions predicting completions
        probs = torch.softmax(logits.double(), dim=-1)
    torch.testing.assert_close(log_collision.double(), torch.log(probs.square().sum(-1)), rtol=1e-5, atol=1e-5)
    sampled = probs.gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logps.double(), torch.log(sampled), rtol=1e-5, atol=1e-5)


def test_diagnostics_can_be_switched_off(tiny_random_model_path, tmp_path):
    args = tiny_stapo_config(tmp_path, max_steps=1, logging_steps=1, s2t_diagnostics=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = STAPOTrainer(tiny_random_model_path, reward_funcs=_zero_reward, args=args, train_dataset=PROMPTS)
    trainer.train()
    logged = next(h for h in trainer.state.log_history if "loss" in h)
    assert "s2t/silenced_ratio" in logged and "s2t/entropy_p50" not in logged
    assert trainer._s2t_collision is None  # the LM head is not asked for log Σ π²


def test_on_step_end_logs_each_training_batch_once(tmp_path):
    class FakeAccelerator:
        num_processes, process_index, is_main_process = 1, 0, True

    class FakeTrainer:
        accelerator = FakeAccelerator()
        processing_class = CharTokenizer()
        args = types.SimpleNamespace(s2t_prob_threshold=0.01)
        s2t_train_batches = []
        s2t_last_eval_batch = None

    trainer = FakeTrainer()
    args = types.SimpleNamespace(output_dir=str(tmp_path), seed=0, report_to=[])
    state = types.SimpleNamespace(is_world_process_zero=True, global_step=0)
    logger = SpuriousTokenLogger(trainer, context_tokens=2)
    logger.on_train_begin(args, state, None)
    log, no_log = types.SimpleNamespace(should_log=True), types.SimpleNamespace(should_log=False)
    logger.on_step_end(args, state, log)  # no batch yet
    trainer.s2t_train_batches = [hand_batch()]
    state.global_step = 1
    logger.on_step_end(args, state, no_log)  # not a logging step
    trainer.s2t_train_batches.append(hand_batch())  # a second optimizer update's mask before the logging step
    eval_batch = hand_batch()
    eval_batch.mode = "eval"
    trainer.s2t_last_eval_batch = eval_batch  # an evaluation in between keeps its own record (issue 12, item 6)
    state.global_step = 2
    logger.on_step_end(args, state, log)  # both training masks written
    state.global_step = 3
    logger.on_step_end(args, state, log)  # same masks: skipped
    logger.on_train_end(args, state, None)
    records = read_token_records(tmp_path)
    assert [r["step"] for r in records] == [2] * 10
    assert logger.silenced_counts == {"+": 2}


def test_tracker_table_of_top_silenced_strings(tmp_path, monkeypatch):
    logged = []

    class Table:
        def __init__(self, dataframe):
            self.dataframe = dataframe

    fake_wandb = types.SimpleNamespace(run=object(), Table=Table, log=logged.append)
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb)

    class FakeTrainer:
        accelerator = types.SimpleNamespace(num_processes=1, process_index=0, is_main_process=True)
        processing_class = CharTokenizer()
        args = types.SimpleNamespace(s2t_prob_threshold=0.01)

    logger = SpuriousTokenLogger(FakeTrainer(), path=str(tmp_path / "tokens.jsonl"))
    args = types.SimpleNamespace(output_dir=str(tmp_path), seed=0, report_to=["wandb"])
    logger.log_batch(hand_batch(), step=1, args=args)
    logger.close()
    (entry,) = logged
    table = entry["s2t/top_silenced_tokens"].dataframe
    assert table.to_dict("list") == {"token": ["+"], "silenced": [1], "kept_candidate_sampled": [0]}


def _tiny_math_dataset():
    from stapo_trl.data import load_prompt_dataset

    return load_prompt_dataset("builtin:tiny-math", split="train", limit=64)


def test_real_run_writes_records_metrics_and_figures(tiny_math_model_path, tmp_path):
    from stapo_trl.rewards import math_accuracy_reward

    # tau_p = 0.05 (not 0.002): a few steps on a 300-token model must produce candidates to record and plot.
    trainer = _make_trainer(
        tiny_math_model_path,
        tmp_path,
        _tiny_math_dataset(),
        math_accuracy_reward,
        max_steps=4,
        learning_rate=3e-4,
        per_device_train_batch_size=16,
        num_generations=8,
        steps_per_generation=2,
        logging_steps=2,
        s2t_prob_threshold=0.05,
        max_completion_length=40,
    )
    from stapo_trl.callbacks import MetricsLogCallback

    trainer.add_callback(MetricsLogCallback())
    trainer.add_callback(SpuriousTokenLogger(trainer, max_kept_candidates=16, max_reference=16))
    trainer.train()

    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == 2
    for entry in logged:
        for q in ("p10", "p50", "p80", "p95"):
            assert entry[f"s2t/entropy_{q}"] is not None and entry[f"s2t/entropy_{q}"] >= 0
        quantiles = [entry[f"s2t/entropy_{q}"] for q in ("p10", "p50", "p80", "p95")]
        assert quantiles == sorted(quantiles)
        share = entry.get("s2t/grad_norm_share_candidates")  # absent when undefined (every w = 0)
        assert share is None or 0 <= entry.get("s2t/grad_norm_share_silenced", 0) <= share <= 1

    run_dir = tmp_path / "run"
    records = read_token_records(run_dir / SPURIOUS_TOKENS_FILENAME)
    assert records, "no positive-advantage token recorded"
    assert {r["step"] for r in records} <= {2, 4}
    assert sum(r["kind"] == "silenced" for r in records) == sum(
        h.get("s2t/num_silenced") or 0 for h in logged
    )  # every silenced token of each logged batch (steps_per_generation = logging_steps: one mask per log)
    for r in records:
        assert r["silenced"] == (r["kind"] == "silenced") and "⟦" in r["context"]
        assert r["candidate"] == (r["prob"] < 0.05)

    figures = plot_diagnostics([run_dir], tmp_path / "figures")
    names = {path.name for path in figures}
    assert {"s2t_entropy_quantiles.png", "s2t_ratios.png", "s2t_prob_entropy.png", "s2t_top_tokens.png"} <= names
    for path in figures:
        assert path.stat().st_size > 1000
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Two runs overlay on the same figures.
    assert len(plot_diagnostics([run_dir, run_dir], tmp_path / "overlay", labels=["a", "b"])) == 4


@pytest.mark.parametrize("max_steps, logging_steps", [(3, 2), (1, 4), (5, 2)])
def test_masks_after_the_last_logging_step_still_reach_the_token_file(
    tiny_math_model_path, tmp_path, max_steps, logging_steps
):
    """max_steps not a multiple of logging_steps: the final row of metrics.jsonl counts the last masks' silenced
    tokens, and spurious_tokens.jsonl records every one of them too (it used to stop at the last logging step)."""
    from stapo_trl.callbacks import MetricsLogCallback
    from stapo_trl.metrics_log import read_metrics
    from stapo_trl.rewards import math_accuracy_reward

    trainer = _make_trainer(
        tiny_math_model_path, tmp_path, _tiny_math_dataset(), math_accuracy_reward, max_steps=max_steps,
        per_device_train_batch_size=16, num_generations=8, logging_steps=logging_steps,
        s2t_prob_threshold=1.0,  # why: every positive-advantage token is a candidate, so every mask silences some
        max_completion_length=40,  # why: room for the answer, so that some rewards (advantages) are positive
    )  # fmt: skip
    trainer.add_callback(MetricsLogCallback())
    trainer.add_callback(SpuriousTokenLogger(trainer, max_silenced=100_000))
    trainer.train()
    rows = [row for row in read_metrics(str(tmp_path / "run")) if "s2t/num_silenced" in row]
    silenced = round(sum(row["s2t/num_silenced"] for row in rows))
    assert rows[-1]["step"] == max_steps and silenced > 0
    records = read_token_records(tmp_path / "run" / SPURIOUS_TOKENS_FILENAME)
    assert sum(r["kind"] == "silenced" for r in records) == silenced
    assert max(r["step"] for r in records) == max_steps


# ----------------------------------------------------------------------------------------------------------------
# Ratios over seeds are pooled from the counts, as the accuracy table pools them (issue 23, item 7)
# ----------------------------------------------------------------------------------------------------------------

# Two seeds, two logging steps. Step 4: seed 0 silences 1 of 100 loss tokens (ratio 0.01), seed 1 none of 900 (0):
# pooled 1 / 1000 = 0.001, where the mean of the two ratios was 0.005. Step 8: 0 of 100 and 3 of 300 (0.01): pooled
# 3 / 400 = 0.0075 (mean 0.005). Candidates: step 4, 2 + 0 of 1000 = 0.002 (mean 0.01); step 8, 0 + 6 of 400 = 0.015
# (mean 0.01).
SEED_ROWS = [
    [
        {"step": 4, "reward": 0.5, "entropy": 0.3, "s2t/silenced_ratio": 0.01, "s2t/num_silenced": 1,
         "s2t/candidate_ratio": 0.02, "s2t/num_candidates": 2, "s2t/num_loss_tokens": 100},
        {"step": 8, "reward": 0.6, "entropy": 0.2, "s2t/silenced_ratio": 0.0, "s2t/num_silenced": 0,
         "s2t/candidate_ratio": 0.0, "s2t/num_candidates": 0, "s2t/num_loss_tokens": 100},
    ],
    [
        {"step": 4, "reward": 0.4, "entropy": 0.4, "s2t/silenced_ratio": 0.0, "s2t/num_silenced": 0,
         "s2t/candidate_ratio": 0.0, "s2t/num_candidates": 0, "s2t/num_loss_tokens": 900},
        {"step": 8, "reward": 0.7, "entropy": 0.1, "s2t/silenced_ratio": 0.01, "s2t/num_silenced": 3,
         "s2t/candidate_ratio": 0.02, "s2t/num_candidates": 6, "s2t/num_loss_tokens": 300},
    ],
]  # fmt: skip


def _panel_points(fig, title_start: str):
    import numpy as np

    ax = next(ax for ax in fig.axes if ax.get_title().startswith(title_start))
    return [(list(np.asarray(line.get_xdata())), list(np.asarray(line.get_ydata()))) for line in ax.lines], ax


def test_compare_figure_pools_the_silenced_ratio_over_seeds():
    """`stapo-train compare` draws compare.png with `plot_training_curves` (this figure): the silenced-ratio points
    averaged the seeds' ratios, zeros included (0.005 and 0.005 here)."""
    import matplotlib.pyplot as plt

    from stapo_trl.plots import TRAINING_CURVES, training_curves_figure

    fig = training_curves_figure({"stapo": SEED_ROWS}, curves=TRAINING_CURVES)
    try:
        points, ax = _panel_points(fig, "S2T silenced-token ratio")
        assert points == [([4, 8], [pytest.approx(0.001), pytest.approx(0.0075)])]
        assert ax.get_legend_handles_labels()[1] == ["stapo (2 seeds, pooled), 0 at 0/2 logged steps"]
        # The linear panels keep the mean over seeds (reward: (0.5 + 0.4) / 2 and (0.6 + 0.7) / 2, no smoothing).
        reward, _ = _panel_points(fig, "reward")
        assert reward[0][1] == [pytest.approx(0.45), pytest.approx(0.65)]
    finally:
        plt.close(fig)


def test_stapo_plot_pools_ratios_of_a_folder_of_seeds(tmp_path):
    """`stapo-plot ARM_FOLDER` (the compare layout) reads the seeds and draws the same pooled points; the diagnostics'
    ratio panel (silenced and candidate ratios) pools both ratios too."""
    from stapo_trl.diagnostic_plots import _mean_series
    from stapo_trl.metrics_log import load_run

    for seed, rows in enumerate(SEED_ROWS):
        (tmp_path / "arm" / f"seed{seed}").mkdir(parents=True)
        (tmp_path / "arm" / f"seed{seed}" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    seeds = load_run(str(tmp_path / "arm"))
    assert _mean_series(seeds, "s2t/silenced_ratio") == ([4, 8], [pytest.approx(0.001), pytest.approx(0.0075)])
    assert _mean_series(seeds, "s2t/candidate_ratio") == ([4, 8], [pytest.approx(0.002), pytest.approx(0.015)])
    # Not a ratio of counts: the mean over seeds (entropy (0.3 + 0.4) / 2, (0.2 + 0.1) / 2).
    assert _mean_series(seeds, "entropy") == ([4, 8], [pytest.approx(0.35), pytest.approx(0.15)])


def test_pooled_ratio_skips_steps_without_counts_and_zero_denominators():
    from stapo_trl.metrics_log import pooled_ratio_series

    seeds = [
        [{"step": 1, "s2t/num_silenced": 0, "s2t/num_loss_tokens": 0}, {"step": 2, "s2t/num_silenced": 2,
         "s2t/num_loss_tokens": 10}, {"step": 3, "s2t/num_silenced": 1, "s2t/num_loss_tokens": 10}],
        [{"step": 1, "s2t/num_silenced": 0, "s2t/num_loss_tokens": 0}, {"step": 2, "s2t/num_silenced": 0,
         "s2t/num_loss_tokens": 30}],
    ]  # fmt: skip
    # Step 1: no loss token in either seed (undefined, left out); step 2: 2 / 40; step 3: seed 1 did not log it.
    assert pooled_ratio_series(seeds, "s2t/silenced_ratio") == {2: pytest.approx(0.05)}
    assert pooled_ratio_series(seeds, "reward") is None
    # A seed without the counts (a file from before they were logged): no pooled series, the mean is drawn.
    assert pooled_ratio_series([seeds[0], [{"step": 2, "s2t/silenced_ratio": 0.1}]], "s2t/silenced_ratio") is None
