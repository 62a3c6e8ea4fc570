"""The product's `STAPOTrainer` (`stapo_trl.STAPOTrainer`): the paper's ablation modes in the loss and in training,
log rows that pool the `s2t/` counts over their masks and leave undefined metrics out, the non-finite warning, the
construction warnings, `builtin:` model names, and a spurious-token logger whose memory is bounded by its caps.

The core's maths (the rule's losses, the per-update normalizer, parity with `GRPOTrainer`, where p and H come from) is
tested in `tests/core/`."""

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import trl
from testing_utils import PROMPTS, REPO, KeepsLogpGrad, hand_scored_batch, policy_forward, text_reward, zero_reward
from transformers import TrainerCallback
from trl import GRPOConfig

from stapo_trl import STAPOConfig, STAPOTrainer, core
from stapo_trl.core.stapo_config import s2t_warnings
from stapo_trl.diagnostics.token_records import token_records
from stapo_trl.run_folder.logs import SpuriousTokenLogger
from stapo_trl.trainer.config import write_run_files


def make_trainer(model_path, tmp_path, trainer_cls=STAPOTrainer, reward=zero_reward, **overrides):
    settings = dict(
        output_dir=str(tmp_path / "run"),
        use_cpu=True,
        bf16=False,  # bf16 on a CPU is slow and not what the maths is checked in
        report_to=[],
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,  # why: a tiny random model; short completions keep a step at ~0.1 s
        logging_steps=1,
        save_strategy="no",
        seed=0,
    )
    settings.update(overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # construction warnings are tested on their own below
        trainer = trainer_cls(model_path, reward_funcs=reward, args=STAPOConfig(**settings), train_dataset=PROMPTS)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps  # set by train() only
    return trainer


class LogpProbe(KeepsLogpGrad, STAPOTrainer):
    """The product's trainer, keeping the training forward's per-token log-probs (`probe_logps`)."""


# ----------------------------------------------------------------------------------------------------------------
# The ablation modes in the loss
# ----------------------------------------------------------------------------------------------------------------
def test_all_low_prob_keeps_the_non_positive_advantage_tokens_and_silenced_tokens_get_zero_gradient(
    tiny_random_model_path, tmp_path
):
    # TRL's default geometry: the mask comes from the loss's own forward. tau_p = 1 and all_low_prob: every
    # positive-advantage token is silenced, so the kept tokens are those of rows 1 (A = -0.5, 3 tokens) and 3 (A = 0,
    # 2 tokens). On-policy the ratio is 1 and each token's clipped surrogate is -A: the dapo loss is
    # (3 * 0.5 + 2 * 0) / 5 = 0.3, where GRPO's would be (3 * 0.5 - 5 * 1 - 4 * 2) / 14.
    trainer = make_trainer(
        tiny_random_model_path, tmp_path, LogpProbe, s2t_prob_threshold=1.0, s2t_mode="all_low_prob"
    )
    inputs = hand_scored_batch(trainer.model.config.vocab_size)
    logps, _ = policy_forward(trainer, inputs)
    loss = trainer._compute_loss(trainer.model, inputs)
    assert loss.item() == pytest.approx(0.3, abs=1e-6)
    loss.backward()
    grad = trainer.probe_logps.grad  # (4, 5): d loss / d log p = -A / K on kept tokens, exactly 0 elsewhere
    assert torch.equal(grad[0], torch.zeros(5)) and torch.equal(grad[2], torch.zeros(5))
    expected = torch.zeros(4, 5)
    expected[1, :3] = 0.5 / 5
    torch.testing.assert_close(grad, expected)
    metrics = trainer._metrics["train"]
    assert (metrics["s2t/num_silenced"], metrics["s2t/num_candidates"]) == ([9.0], [9.0])
    assert metrics["s2t/num_loss_tokens"] == [14.0]
    # The product's diagnostics of the same mask: the mean p of the 9 silenced tokens.
    silenced = (inputs["advantages"][:, None] > 0) & inputs["completion_mask"].bool()
    assert metrics["s2t/silenced_prob_mean"] == [pytest.approx(logps[silenced].exp().mean().item(), rel=1e-5)]


def test_all_tokens_silenced_gives_a_finite_zero_loss_that_backpropagates(tiny_random_model_path, tmp_path):
    trainer = make_trainer(tiny_random_model_path, tmp_path, s2t_prob_threshold=1.0, s2t_mode="all_low_prob")
    inputs = hand_scored_batch(trainer.model.config.vocab_size)
    inputs["advantages"] = torch.tensor([1.0, 0.5, 2.0, 3.0])
    loss = trainer._compute_loss(trainer.model, inputs)
    assert torch.isfinite(loss) and loss.item() == 0.0
    assert loss.requires_grad  # still connected to the graph
    loss.backward()
    grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
    assert grads and all(torch.count_nonzero(g) == 0 for g in grads)
    assert trainer._metrics["train"]["s2t/num_silenced"] == [14.0]


def test_high_entropy_in_the_papers_geometry_silences_above_each_updates_quantile(tiny_random_model_path, tmp_path):
    # A rollout batch of 4 micro-batches, GA 2: 2 optimizer updates. num_iterations = 2 lets the test hand TRL a
    # buffered rollout batch (steps 4-7, the second pass: no generation) whose entropies are hand-made, so every
    # threshold, silenced set and loss below is computed independently of the trainer. tau_p = 1: every
    # positive-advantage token is a candidate; q = 0.75: high_entropy silences those above the 0.25-quantile.
    trainer = make_trainer(
        tiny_random_model_path,
        tmp_path,
        steps_per_generation=4,
        gradient_accumulation_steps=2,
        num_iterations=2,
        s2t_prob_threshold=1.0,
        s2t_mode="high_entropy",
    )
    vocab_size = trainer.model.config.vocab_size
    batches = [hand_scored_batch(vocab_size, seed) for seed in range(4)]
    generator = torch.Generator().manual_seed(7)
    for batch in batches:
        batch["old_per_token_logps"], _ = policy_forward(trainer, batch)  # on-policy: ratio 1
        batch["s2t_entropies"] = torch.rand(4, 5, generator=generator)  # distinct hand entropies (nats)
    trainer._buffered_inputs = batches
    losses, normalizers = [], []
    for step in range(4, 8):
        trainer._step = step
        inputs = trainer._prepare_inputs(None)
        losses.append(trainer._compute_loss(trainer.model, inputs).item())
        normalizers.append(inputs["num_items_in_batch"].item() * 2 / 4)  # TRL: num_items x GA / steps_per_generation
    for update in (0, 1):
        micro = batches[2 * update : 2 * update + 2]
        loss_mask = torch.cat([b["completion_mask"] for b in micro]).bool()  # (8, 5)
        advantages = torch.cat([b["advantages"] for b in micro])[:, None]  # (8, 1)
        entropies = torch.cat([b["s2t_entropies"] for b in micro]).double()
        candidate = loss_mask & (advantages > 0)  # 18 candidates
        tau_h = np.quantile(entropies[candidate].numpy(), 0.25)  # over this update's candidates only
        silenced = candidate & (entropies > tau_h)
        kept = loss_mask & ~silenced
        assert silenced.sum() == 13  # 18 candidates, h = 17 * 0.25 = 4.25: the 5 lowest are kept
        expected = ((-advantages * kept).sum() / kept.sum()).item()
        assert losses[2 * update] + losses[2 * update + 1] == pytest.approx(expected, abs=1e-6)
        assert normalizers[2 * update] == normalizers[2 * update + 1] == kept.sum().item()
    assert trainer._metrics["train"]["s2t/num_silenced"] == [13.0, 13.0]


@pytest.mark.parametrize(
    "mode, steps_per_generation",
    [
        ("all_low_prob", 1),  # TRL's default geometry: the mask from the loss's forward
        ("high_entropy", 4),  # the paper's: 4 updates per rollout batch, p and H from TRL's old-log-prob forward
    ],
)
def test_an_ablation_mode_trains_end_to_end_and_logs_its_diagnostics(
    tiny_random_model_path, tmp_path, mode, steps_per_generation
):
    trainer = make_trainer(
        tiny_random_model_path,
        tmp_path,
        reward=text_reward,
        max_steps=4,
        learning_rate=1e-2,  # why: a tiny random model; the weights must move visibly in a few steps
        steps_per_generation=steps_per_generation,
        s2t_prob_threshold=0.05,  # why: the random model spreads p over ~300 tokens: most are candidates
        s2t_mode=mode,
    )
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    for name, p in trainer.model.named_parameters():
        assert not torch.equal(before[name], p), f"{name} did not change"
    rows = [row for row in trainer.state.log_history if "loss" in row]
    assert len(rows) == 4
    for row in rows:
        quantiles = [row[f"s2t/entropy_p{q}"] for q in (10, 50, 80, 95)]
        assert quantiles == sorted(quantiles) and 0 < quantiles[0] <= math.log(trainer.model.config.vocab_size)
        assert row["s2t/num_silenced"] <= row["s2t/num_candidates"] <= row["s2t/num_loss_tokens"]
        if mode == "all_low_prob":
            assert row["s2t/num_silenced"] == row["s2t/num_candidates"]
        if row["s2t/num_silenced"]:
            assert 0 < row["s2t/silenced_prob_mean"] < 0.05
    silenced = sum(row["s2t/num_silenced"] for row in rows)
    assert 0 < silenced and (mode == "all_low_prob" or silenced < sum(row["s2t/num_candidates"] for row in rows))


# ----------------------------------------------------------------------------------------------------------------
# Log rows: counts summed and ratios pooled over the row's masks, undefined metrics left out, non-finite values
# ----------------------------------------------------------------------------------------------------------------
def hand_micro_batch(advantages, lengths, entropies=None, logps=None):
    """A buffered micro-batch of 2 completions (2 prompt tokens, up to 3 completion tokens) whose rollout p (0.001,
    below the default tau_p) and entropies are hand-made: `_prepare_inputs` builds its update's mask from them alone."""
    completion_mask = (torch.arange(3)[None] < torch.tensor(lengths)[:, None]).long()  # (2, 3)
    return {
        "prompt_ids": torch.full((2, 2), 5),
        "prompt_mask": torch.ones(2, 2, dtype=torch.long),
        "completion_ids": torch.full((2, 3), 7),
        "completion_mask": completion_mask,
        "advantages": torch.tensor(advantages),
        "num_items_in_batch": completion_mask.sum(),
        "old_per_token_logps": torch.full((2, 3), math.log(0.001)) if logps is None else logps,
        "s2t_entropies": torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]) if entropies is None else entropies,
    }


def prepare_two_updates(trainer, batches):
    """The second pass over a buffered rollout batch of 4 micro-batches (GA 2: two updates), as `training_step` calls
    `_prepare_inputs`: one mask per update, built at its first micro-step."""
    trainer._buffered_inputs = batches
    for step in range(4, 8):
        trainer._step = step
        trainer._prepare_inputs(None)


def hand_geometry_trainer(model_path, tmp_path, **overrides):
    # steps_per_generation 4, GA 2, num_iterations 2: steps 4-7 reuse the buffered (hand) rollout batch.
    return make_trainer(
        model_path, tmp_path, steps_per_generation=4, gradient_accumulation_steps=2, num_iterations=2, **overrides
    )


def test_a_log_row_sums_the_counts_and_pools_the_ratios_of_its_masks(tiny_random_model_path, tmp_path):
    trainer = hand_geometry_trainer(tiny_random_model_path, tmp_path, s2t_mode="all_low_prob")
    prepare_two_updates(
        trainer,
        [
            # Update 1: 12 loss tokens, the 6 of the A > 0 rows silenced (ratio 0.5).
            hand_micro_batch([1.0, -1.0], [3, 3]),
            hand_micro_batch([1.0, -1.0], [3, 3]),
            # Update 2: 4 loss tokens, 1 silenced (ratio 0.25).
            hand_micro_batch([1.0, -1.0], [1, 1]),
            hand_micro_batch([-1.0, -1.0], [1, 1]),
        ],
    )
    trainer.log({})
    row = trainer.state.log_history[-1]
    assert (row["s2t/num_silenced"], row["s2t/num_candidates"], row["s2t/num_loss_tokens"]) == (7, 7, 16)
    assert row["s2t/silenced_ratio"] == pytest.approx(7 / 16)  # the mean of the two ratios would be 0.375
    assert row["s2t/candidate_ratio"] == pytest.approx(7 / 16)
    assert row["s2t/num_nonfinite"] == 0
    assert row["s2t/silenced_prob_mean"] == pytest.approx(0.001)
    # The next row starts afresh: its counts are its own masks'.
    prepare_two_updates(trainer, [hand_micro_batch([-1.0, 1.0], [2, 2]) for _ in range(4)])
    trainer.log({})
    row = trainer.state.log_history[-1]
    assert (row["s2t/num_silenced"], row["s2t/num_loss_tokens"]) == (8, 16)
    assert row["s2t/silenced_ratio"] == pytest.approx(0.5)


def test_non_finite_p_or_h_is_warned_once_and_counted(tiny_random_model_path, tmp_path):
    trainer = hand_geometry_trainer(tiny_random_model_path, tmp_path)
    entropies = [torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]) for _ in range(4)]
    logps = [torch.full((2, 3), math.log(0.001)) for _ in range(4)]
    entropies[0][0, 0] = float("nan")  # a candidate's position (A > 0)
    entropies[1][1, 2] = float("nan")  # a loss token with A < 0: counted too
    entropies[2][0, 1] = float("inf")
    logps[3][0, 2] = float("-inf")
    entropies[3][1, 2] = float("nan")  # padding (length 2): not a loss token, not counted
    lengths = [[3, 3], [3, 3], [3, 3], [3, 2]]
    batches = [hand_micro_batch([1.0, -1.0], lengths[i], entropies[i], logps[i]) for i in range(4)]
    with pytest.warns(UserWarning, match="non-finite") as record:
        prepare_two_updates(trainer, batches)  # two masks with non-finite values: one warning
    assert sum("non-finite" in str(w.message) for w in record) == 1
    trainer.log({})
    row = trainer.state.log_history[-1]
    assert row["s2t/num_nonfinite"] == 4 and row["s2t/num_loss_tokens"] == 23
    assert row["s2t/num_candidates"] == 12 - 3  # the A > 0 rows' 12 tokens, less the 3 non-finite ones
    assert math.isfinite(row["s2t/entropy_p50"])  # non-finite values stay out of the quantiles too


def test_undefined_s2t_metrics_are_left_out_of_the_logs(tiny_random_model_path, tmp_path):
    # tau_p = 1e-30: no token is ever a candidate, so tau_h and the silenced-token means are undefined (NaN) at every
    # step. 3 steps with logging_steps 2: step 3 is logged only by the end-of-training summary (train_result.metrics).
    trainer = make_trainer(
        tiny_random_model_path, tmp_path, reward=text_reward, max_steps=3, logging_steps=2, s2t_prob_threshold=1e-30
    )
    result = trainer.train()
    logged = [h for h in trainer.state.log_history if "s2t/silenced_ratio" in h]
    assert len(logged) == 2  # step 2, and step 3 inside the summary
    for entry in logged:
        assert entry["s2t/num_candidates"] == 0 and entry["s2t/silenced_ratio"] == 0
        for key in ("s2t/entropy_threshold", "s2t/silenced_prob_mean", "s2t/silenced_entropy_mean"):
            assert key not in entry, key
        assert entry["s2t/entropy_p50"] > 0  # defined: every loss token has an entropy
        assert None not in entry.values()
    assert None not in result.metrics.values()
    trainer.log_metrics("train", result.metrics)  # formats every value: fails on a None


# ----------------------------------------------------------------------------------------------------------------
# The spurious-token logger: training masks only, bounded by its caps, no batch tensor kept
# ----------------------------------------------------------------------------------------------------------------
def test_training_masks_reach_the_logger_and_evaluation_masks_do_not(tiny_random_model_path, tmp_path):
    trainer = make_trainer(tiny_random_model_path, tmp_path, s2t_prob_threshold=1.0, s2t_mode="all_low_prob")
    logger = SpuriousTokenLogger(trainer)
    trainer.add_callback(logger)
    inputs = hand_scored_batch(trainer.model.config.vocab_size)
    trainer.model.eval()
    with torch.no_grad():
        trainer._compute_loss(trainer.model, dict(inputs))
    assert logger._pending is None and "s2t/num_silenced" not in trainer._metrics["train"]
    assert trainer._metrics["eval"]["s2t/num_silenced"] == [9.0]
    trainer.model.train()
    trainer._compute_loss(trainer.model, dict(inputs))
    # The 9 silenced tokens (rows 0 and 2: 5 + 4); no kept candidate; no reference (tau_p = 1).
    pending = token_records(logger._pending, trainer.processing_class)
    assert [(r["completion_index"], r["position"]) for r in pending] == [(0, t) for t in range(5)] + [
        (2, t) for t in range(4)
    ]
    assert {r["kind"] for r in pending} == {"silenced"}


class WatchedLogger(SpuriousTokenLogger):
    """Checks, at every mask handed to it, that it keeps exactly the capped sample of the masks since the last logging
    step, no more."""

    def __init__(self, trainer, **caps):
        super().__init__(trainer, **caps)
        self.masks, self.capped_masks, self.largest_pending = 0, 0, 0
        self.available = Counter()  # tokens of each kind since the last logging step

    def write_pending(self, args, step):
        self.available = Counter()
        return super().write_pending(args, step)

    def record(self, result, per_token_logps, entropies, advantages, loss_mask, completion_ids):
        super().record(result, per_token_logps, entropies, advantages, loss_mask, completion_ids)
        in_loss = loss_mask.bool()
        positive = in_loss & (advantages[:, None] > 0)
        available = {
            "silenced": int((result.silenced & in_loss).sum()),
            "kept_candidate": int((result.candidate & ~result.silenced & in_loss).sum()),
            "reference": int((positive & ~result.candidate).sum()),
        }
        caps = {"silenced": self.max_silenced, "kept_candidate": self.max_kept_candidates}
        caps["reference"] = self.max_reference
        self.available.update(available)
        pending = (self._pending[..., 0] >= 0).sum(dim=1).tolist()  # the sample's size of each kind
        assert pending == [min(caps[k], self.available[k]) for k in caps], (pending, self.available)
        self.masks += 1
        self.capped_masks += any(available[k] > caps[k] for k in caps)
        self.largest_pending = max(self.largest_pending, sum(pending))


def test_the_logger_keeps_at_most_its_caps_per_mask_and_no_batch_tensor_is_retained(tiny_random_model_path, tmp_path):
    # 8 steps, 4 updates per rollout batch, a logging step every 4 updates: one sample of 4 masks' records waits.
    # tau_p = 1, q = 0.5: every positive-advantage token is a candidate and half are silenced, so the caps bind.
    trainer = make_trainer(
        tiny_random_model_path,
        tmp_path,
        reward=text_reward,
        max_steps=8,
        steps_per_generation=4,
        logging_steps=4,
        s2t_prob_threshold=1.0,
        s2t_entropy_quantile=0.5,
    )
    logger = WatchedLogger(trainer, max_silenced=3, max_kept_candidates=2, max_reference=2)
    trainer.add_callback(logger)
    trainer.train()
    assert logger.masks == 8  # one mask per optimizer update, each handed over once
    assert logger.capped_masks > 0  # the caps were needed
    assert 0 < logger.largest_pending <= 3 + 2 + 2  # one sample of the logging step's masks, within the caps
    assert logger._pending is None  # written at the logging steps
    # No tensor of the batch (2-D) is kept by the trainer, apart from TRL's own rollout buffer, nor by the logger.
    assert held_tensors(trainer, skip={"_buffered_inputs"}) == []
    for callback in trainer.callback_handler.callbacks:
        assert held_tensors(callback, skip={"trainer"}) == [], type(callback).__name__


def held_tensors(obj, skip=(), path="", seen=None):
    """The paths of the tensors of 2 or more dimensions reachable from `obj`'s attributes, through containers,
    dataclasses and `stapo_trl` objects (not modules, optimizers or other libraries' objects)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if torch.is_tensor(obj):
        return [path] if obj.dim() >= 2 else []
    if isinstance(obj, dict):
        children = [(f"{path}[{key!r}]", value) for key, value in obj.items()]
    elif isinstance(obj, (list, tuple, set, frozenset)) or type(obj).__name__ == "deque":
        children = [(f"{path}[{i}]", value) for i, value in enumerate(obj)]
    elif path == "" or type(obj).__module__.startswith("stapo_trl") or hasattr(type(obj), "__dataclass_fields__"):
        children = [(f"{path}.{key}", value) for key, value in vars(obj).items() if key not in skip]
    else:
        return []
    return [found for child_path, child in children for found in held_tensors(child, (), child_path, seen)]


# ----------------------------------------------------------------------------------------------------------------
# Construction
# ----------------------------------------------------------------------------------------------------------------
def build(model_path, tmp_path, config_cls=STAPOConfig, reward=zero_reward, **overrides):
    """A trainer built with its construction warnings recorded (the config's own are silenced: not under test)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = config_cls(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], **overrides)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer = STAPOTrainer(model_path, reward_funcs=reward, args=args, train_dataset=PROMPTS)
    return trainer, [str(w.message) for w in record if issubclass(w.category, UserWarning)]


@pytest.mark.parametrize(
    "overrides",
    [
        {"beta": 0.04},
        {"importance_sampling_level": "sequence"},
        {"loss_type": "vespo"},
        {"top_entropy_quantile": 0.2},
        {"entropy_coef": 0.01},
        {"temperature": 0.7},
        {"loss_type": "dr_grpo"},
        {"gradient_accumulation_steps": 2, "steps_per_generation": 3},
        {"per_device_train_batch_size": 4, "steps_per_generation": 2},  # 4 completions: half a group of 8
    ],
)
def test_the_cores_warnings_are_given_once_at_construction(tiny_random_model_path, tmp_path, overrides):
    trainer, messages = build(tiny_random_model_path, tmp_path, **overrides)
    (expected,) = s2t_warnings(trainer.args, trainer.s2t)  # the core's one list
    assert messages.count(expected) == 1


def test_with_the_mask_off_nothing_about_the_mask_is_warned(tiny_random_model_path, tmp_path):
    _, messages = build(tiny_random_model_path, tmp_path, loss_type="vespo", temperature=0.7, s2t_mode="off")
    assert not [m for m in messages if m.startswith("S2T mask")]
    assert [m for m in messages if m.startswith("STAPO with")] == [
        "STAPO with s2t_prob_threshold=0.002, s2t_entropy_quantile=0.75, s2t_mode='off'; differs from the paper's "
        "objective: s2t_mode='off' (paper 'low_entropy'), loss_type='vespo' (paper 'dapo')."
    ]


@dataclasses.dataclass
class OpenR1StyleConfig(GRPOConfig):
    """A user's config as open-r1 writes one: `trl.GRPOConfig` plus fields of its own, one of them an ablation mode."""

    system_prompt: str | None = None
    s2t_mode: str = "all_low_prob"
    s2t_write_run_files: bool = True


def test_the_products_extras_come_from_any_grpo_config(tiny_random_model_path, tmp_path):
    trainer, messages = build(tiny_random_model_path, tmp_path, config_cls=GRPOConfig)
    assert trainer.s2t == core.stapo_config.S2TSettings() and write_run_files(trainer.args) is True
    assert sum(m.startswith("STAPO with") for m in messages) == 1
    trainer, _ = build(tiny_random_model_path, tmp_path, config_cls=OpenR1StyleConfig, max_steps=2,
                       per_device_train_batch_size=4, num_generations=2, max_completion_length=8, save_strategy="no",
                       s2t_write_run_files=False, logging_steps=1, reward=text_reward)  # fmt: skip
    assert trainer.s2t.mode == "all_low_prob"  # the product's ablations, where the config has them
    trainer.train()  # trains, silencing every candidate
    rows = [row for row in trainer.state.log_history if "loss" in row]
    assert len(rows) == 2 and sum(r["s2t/num_silenced"] for r in rows) == sum(r["s2t/num_candidates"] for r in rows)
    assert not (tmp_path / "metrics.jsonl").exists()  # the config's own s2t_write_run_files=False
    with pytest.raises(ValueError, match=r"s2t_mode='all_low_prob' is not one of \['low_entropy', 'off'\]"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            core.STAPOTrainer(tiny_random_model_path, zero_reward, args=trainer.args, train_dataset=PROMPTS)
    args = trainer.args
    args.s2t_write_run_files = "no"  # a field of the user's class, of the wrong type: refused at construction
    with pytest.raises(ValueError, match=r"^s2t_write_run_files='no' must be a bool"):
        STAPOTrainer(tiny_random_model_path, reward_funcs=zero_reward, args=args, train_dataset=PROMPTS)


def test_a_plain_grpo_config_writes_the_run_files_and_keeps_the_construction_checks(tiny_math_model_path, tmp_path):
    from stapo_trl.rewards import math_accuracy_reward

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = GRPOConfig(
            output_dir=str(tmp_path / "run"), use_cpu=True, bf16=False, report_to=[], per_device_train_batch_size=8,
            num_generations=4, max_completion_length=48, max_steps=2, logging_steps=1, save_strategy="no", seed=0,
        )  # fmt: skip
    dataset = math_prompts(24)
    with pytest.raises(ValueError, match="prompt"):  # the product's construction checks, with a GRPOConfig too
        STAPOTrainer(
            tiny_math_model_path, math_accuracy_reward, args=args, train_dataset=dataset.remove_columns("prompt")
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = STAPOTrainer(tiny_math_model_path, math_accuracy_reward, args=args, train_dataset=dataset)
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "s2t/num_loss_tokens" in row] == [1, 2]
    records = [json.loads(line) for line in (tmp_path / "run" / "spurious_tokens.jsonl").read_text().splitlines()]
    assert records  # the per-token records, with the paper's tau_p (the config has none)


class CtrlCAtStep(TrainerCallback):
    """Send SIGINT to this process once, at the end of `step` (what Ctrl-C in a terminal or a notebook does)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_with_a_plain_grpo_config_saves_a_checkpoint(tiny_random_model_path, tmp_path):
    # As tests/cli/test_callbacks.py does in a notebook, with the config a TRL script passes.
    from stapo_trl.cli.callbacks import add_command_callbacks

    trainer, _ = build(tiny_random_model_path, tmp_path, config_cls=GRPOConfig, max_steps=4, save_strategy="no",
                       per_device_train_batch_size=4, num_generations=2, max_completion_length=8)  # fmt: skip
    trainer.add_callback(CtrlCAtStep(2))
    add_command_callbacks(trainer)  # the one line that gives a script stapo-train's stop signals
    with pytest.raises(KeyboardInterrupt) as excinfo:
        trainer.train()
    assert excinfo.value.step == 2 and (tmp_path / "checkpoint-2" / "trainer_state.json").is_file()
    assert (tmp_path / "metrics.jsonl").is_file()


def math_prompts(n):
    from datasets import Dataset

    from stapo_trl.data import format_prompt

    return Dataset.from_list(
        [{"prompt": format_prompt(f"{a}+{a + 3}"), "solution": str(2 * a + 3)} for a in range(10, 10 + n)]
    )


# What TRL's own script (`trl/scripts/grpo.py`) becomes with its trainer import changed, and nothing else.
def trl_grpo_script() -> str:
    source = (Path(trl.__file__).parent / "scripts" / "grpo.py").read_text()
    original = "from trl import GRPOTrainer, get_dataset, get_peft_config, get_quantization_config"
    assert source.count(original) == 1
    return source.replace(
        original,
        "from stapo_trl import STAPOTrainer as GRPOTrainer\n    from trl import get_dataset, get_peft_config, get_quantization_config",
    )


def test_trls_own_grpo_script_trains_with_the_trainer_import_changed(tiny_math_model_path, tmp_path):
    # The reported case: TRL's scripts/grpo.py and open-r1's grpo.py pass a plain GRPOConfig (or their own subclass),
    # which STAPOTrainer refused. The script from the installed wheel, with only its trainer import changed, trains
    # builtin:tiny-math from a local dataset folder and logs the s2t/ metrics.
    (tmp_path / "data").mkdir()
    math_prompts(24).to_json(tmp_path / "data" / "train.jsonl")
    (tmp_path / "script.py").write_text(trl_grpo_script())
    (tmp_path / "rewards.py").write_text(
        "from stapo_trl.rewards import math_accuracy_reward\n\n\ndef accuracy(completions, solution, **kwargs):\n"
        "    return math_accuracy_reward(completions, solution=solution, **kwargs)\n"
    )
    argv = ["--model_name_or_path", tiny_math_model_path, "--dataset_name", str(tmp_path / "data")]
    argv += ["--reward_funcs", "rewards.accuracy", "--output_dir", str(tmp_path / "out"), "--use_cpu", "true"]
    argv += ["--bf16", "false", "--report_to", "none", "--max_steps", "2", "--logging_steps", "1"]
    argv += ["--per_device_train_batch_size", "8", "--num_generations", "4", "--max_completion_length", "48"]
    argv += ["--save_strategy", "no", "--steps_per_generation", "4", "--gradient_accumulation_steps", "2"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(
        [sys.executable, "script.py", *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "STAPO with s2t_prob_threshold=0.002" in result.stderr  # the one line: GRPOConfig has no S2T field
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "s2t/num_loss_tokens" in row] == [1, 2]
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_builtin_model_names_work_in_the_python_api(tiny_random_model_path, builtin_cache_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("STAPO_TRL_CACHE", str(builtin_cache_dir))  # where the fixture built it
    trainer = make_trainer("builtin:tiny-random", tmp_path)
    assert trainer.model.config._name_or_path == tiny_random_model_path
