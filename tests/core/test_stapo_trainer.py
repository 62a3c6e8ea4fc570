"""The core's `STAPOTrainer` on a tiny random Qwen3: training, hand-computed losses, exact zero gradients on silenced
tokens, the per-update normalizer, parity with `GRPOTrainer`, and where p and H come from (TRL's
`tests/experimental/test_gmpo_trainer.py` is the shape)."""

import warnings

import numpy as np
import pytest
import torch
from testing_utils import KeepsLogpGrad, hand_scored_batch, policy_forward
from trl import GRPOConfig, GRPOTrainer

from stapo_trl.core import STAPOConfig, STAPOTrainer


def make_trainer(model_path, dataset, reward, output_dir, trainer_cls=STAPOTrainer, **overrides):
    config_cls = STAPOConfig if issubclass(trainer_cls, STAPOTrainer) else GRPOConfig
    settings = dict(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=False,  # bf16 on a CPU is slow and not what the maths is checked in
        report_to=[],
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,  # why: a tiny model; short completions keep a step at ~0.1 s
        logging_steps=1,
        save_strategy="no",
        seed=0,
        learning_rate=1e-2,  # why: a tiny random model; the weights must move visibly in a few steps
    )
    settings.update(overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return trainer_cls(model_path, reward_funcs=reward, args=config_cls(**settings), train_dataset=dataset)


class LogpProbe(KeepsLogpGrad, STAPOTrainer):
    """The core's trainer, keeping the training forward's per-token log-probs (`probe_logps`)."""


@pytest.mark.parametrize(
    "steps_per_generation, grad_accum",
    [(1, 1), (2, 2), (8, 2)],  # TRL's default; one update per rollout batch with GA 2; the paper's 4 updates / rollout
)
def test_training_changes_every_parameter_and_logs_the_s2t_metrics(
    tiny_model_path, prompts, length_reward, tmp_path, steps_per_generation, grad_accum
):
    # tau_p = 0.05: the random model spreads probability over ~50 tokens, so many tokens are candidates.
    trainer = make_trainer(
        tiny_model_path,
        prompts,
        length_reward,
        tmp_path,
        max_steps=4,
        s2t_prob_threshold=0.05,
        steps_per_generation=steps_per_generation,
        gradient_accumulation_steps=grad_accum,
    )
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    for name, p in trainer.model.named_parameters():
        assert not torch.equal(before[name], p), f"{name} did not change"
    rows = [row for row in trainer.state.log_history if "loss" in row]
    assert len(rows) == 4
    for row in rows:
        assert 0.0 <= row["s2t/silenced_ratio"] <= row["s2t/candidate_ratio"] <= 1.0
        assert row["s2t/num_silenced"] <= row["s2t/num_candidates"] <= row["s2t/num_loss_tokens"]
    assert sum(row["s2t/num_silenced"] for row in rows) > 0


def test_in_the_default_geometry_the_loss_is_the_mean_over_kept_tokens_and_silenced_tokens_get_zero_gradient(
    tiny_model_path, prompts, length_reward, tmp_path
):
    # TRL's default geometry: the mask comes from the loss's own forward. tau_p = 1 makes every positive-advantage
    # token a candidate (rows 0 and 2: 5 + 4 = 9); q = 0.5 silences those below the median of their entropies.
    trainer = make_trainer(
        tiny_model_path, prompts, length_reward, tmp_path, LogpProbe, s2t_prob_threshold=1.0, s2t_entropy_quantile=0.5
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by train() only
    batch = hand_scored_batch(trainer.model.config.vocab_size, seed=0)
    batch["tool_mask"] = torch.ones_like(batch["completion_mask"])
    batch["tool_mask"][0, 4] = 0  # a tool-output token: never in the loss, never a candidate
    _, entropies = policy_forward(trainer, batch)
    loss_mask = (batch["completion_mask"] * batch["tool_mask"]).bool()  # 13 loss tokens
    candidate = loss_mask & (batch["advantages"][:, None] > 0)  # 4 + 4 = 8
    tau_h = np.quantile(entropies[candidate].double().numpy(), 0.5)  # an independent reference
    silenced = candidate & (entropies.double() < tau_h)
    kept = loss_mask & ~silenced
    assert silenced.sum() == 4 and kept.sum() == 9

    loss = trainer._compute_loss(trainer.model, batch)
    # On-policy the ratio is 1, so each kept token's clipped surrogate is -A; dapo divides by the kept count.
    expected = (-batch["advantages"][:, None] * kept).sum() / kept.sum()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    loss.backward()
    grad = trainer.probe_logps.grad  # (4, 5): d loss / d log p = -A / K on kept tokens, exactly 0 elsewhere
    assert torch.equal(grad[~kept], torch.zeros(int((~kept).sum())))
    torch.testing.assert_close(grad, (-batch["advantages"][:, None] * kept) / kept.sum())
    assert trainer._metrics["train"]["s2t/num_silenced"] == [4.0]
    assert trainer._metrics["train"]["s2t/entropy_threshold"][-1] == pytest.approx(tau_h)


def test_each_optimizer_update_gets_its_own_tau_h_and_kept_token_count(
    tiny_model_path, prompts, length_reward, tmp_path
):
    # The paper's geometry: a rollout batch of 4 micro-batches, GA 2, so 2 optimizer updates per rollout batch.
    # num_iterations = 2 lets the test hand TRL a buffered rollout batch (steps 4-7 of the second pass: no
    # generation). p and H are the rollout's (`old_per_token_logps` and the entropies kept beside them): here hand
    # entropies, so every tau_h, silenced set and normalizer below is computed independently of the trainer.
    trainer = make_trainer(
        tiny_model_path,
        prompts,
        length_reward,
        tmp_path,
        LogpProbe,
        steps_per_generation=4,
        gradient_accumulation_steps=2,
        num_iterations=2,
        s2t_prob_threshold=1.0,
        s2t_entropy_quantile=0.5,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2
    batches = [
        hand_scored_batch(trainer.model.config.vocab_size, seed, lengths=(5, 3, 4 - seed % 2, 2 + seed % 3))
        for seed in range(4)
    ]
    generator = torch.Generator().manual_seed(7)
    for batch in batches:
        batch["old_per_token_logps"], _ = policy_forward(trainer, batch)  # on-policy: ratio 1
        batch["s2t_entropies"] = torch.rand(4, 5, generator=generator)  # distinct hand entropies
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
        candidate = loss_mask & (advantages > 0)
        tau_h = np.quantile(entropies[candidate].numpy(), 0.5)  # over the update's two micro-batches only
        kept = loss_mask & ~(candidate & (entropies < tau_h))
        expected = ((-advantages * kept).sum() / kept.sum()).item()
        assert losses[2 * update] + losses[2 * update + 1] == pytest.approx(expected, abs=1e-6)
        assert normalizers[2 * update] == normalizers[2 * update + 1] == kept.sum().item()
    assert trainer._metrics["train"]["s2t/num_loss_tokens"] == [
        float(sum(b["completion_mask"].sum() for b in batches[:2])),
        float(sum(b["completion_mask"].sum() for b in batches[2:])),
    ]


@pytest.mark.parametrize(
    "steps_per_generation, grad_accum, num_iterations, loss_type",
    [
        (1, 1, 1, "dapo"),  # TRL's default geometry: the mask from the loss's forward
        (2, 2, 1, "dapo"),  # one extra no-grad forward per rollout batch
        (2, 2, 2, "dapo"),  # TRL's old-log-prob forward; the second pass is off-policy, so clipping acts
        (2, 2, 2, "grpo"),
        (2, 2, 2, "bnpo"),
        (2, 2, 2, "dr_grpo"),
    ],
)
def test_with_the_mask_off_training_equals_grpo_trainer(
    tiny_model_path, prompts, length_reward, tmp_path, steps_per_generation, grad_accum, num_iterations, loss_type
):
    """When steps_per_generation = GA the kept-token normalizer of an update is TRL's own: `s2t_mode="off"` is then
    GRPOTrainer, loss for loss and weight for weight."""
    geometry = dict(
        max_steps=3,
        steps_per_generation=steps_per_generation,
        gradient_accumulation_steps=grad_accum,
        num_iterations=num_iterations,
        loss_type=loss_type,
        epsilon=0.2,
        epsilon_high=0.28,
        beta=0.0,
    )
    grpo = make_trainer(tiny_model_path, prompts, length_reward, tmp_path / "grpo", GRPOTrainer, **geometry)
    grpo.train()  # each trainer seeds at construction: build and train one after the other
    stapo = make_trainer(tiny_model_path, prompts, length_reward, tmp_path / "off", s2t_mode="off", **geometry)
    stapo.train()
    grpo_rows = [row for row in grpo.state.log_history if "loss" in row]
    stapo_rows = [row for row in stapo.state.log_history if "loss" in row]
    for grpo_row, stapo_row in zip(grpo_rows, stapo_rows, strict=True):
        assert {"loss", "grad_norm", "entropy", "clip_ratio/region_mean"} <= grpo_row.keys()
        for key in grpo_row.keys() - {"step_time", "epoch"}:  # every TRL metric of the row, wall-clock apart
            assert stapo_row[key] == pytest.approx(grpo_row[key], rel=1e-5, abs=1e-7), key
    if num_iterations > 1:
        assert any(row["clip_ratio/region_mean"] > 0 for row in grpo_rows)  # the comparison covers clipped tokens
    for (name, p_grpo), p_stapo in zip(grpo.model.named_parameters(), stapo.model.parameters(), strict=True):
        torch.testing.assert_close(p_stapo, p_grpo, rtol=1e-5, atol=1e-6, msg=f"{name} differs")


class RolloutValuesCheck(STAPOTrainer):
    """After each rollout is scored, compares the p and H kept for the mask with a fresh no-grad forward under the
    same (sampling) weights."""

    checking = False

    def _generate_and_score_completions(self, inputs):
        batch = super()._generate_and_score_completions(inputs)
        if "s2t_entropies" in batch:
            self.checking = True  # the check's own forward is not the trainer's
            logps, entropies = policy_forward(self, batch)
            self.checking = False
            kept_logps = batch.get("s2t_logps", batch.get("old_per_token_logps"))
            self.checks.append(
                (
                    "s2t_logps" if "s2t_logps" in batch else "old_per_token_logps",
                    (kept_logps - logps).abs().max().item(),
                    (batch["s2t_entropies"] - entropies).abs().max().item(),
                )
            )
        return batch


@pytest.mark.parametrize(
    "steps_per_generation, grad_accum, source, extra_forwards",
    [
        (1, 1, None, 0),  # TRL's default geometry: the loss's own forward
        (4, 2, "old_per_token_logps", 0),  # the paper's geometry: TRL's old-log-prob forward, entropies added
        (2, 2, "s2t_logps", 2 * 2),  # 2 rollout batches of 8 rows, each scored once in 2 chunks of 4
    ],
)
def test_p_and_h_are_the_rollout_policys_with_an_extra_forward_only_where_trl_runs_none(
    tiny_model_path, prompts, length_reward, tmp_path, steps_per_generation, grad_accum, source, extra_forwards
):
    def scoring_forwards(trainer_cls):
        trainer = make_trainer(
            tiny_model_path,
            prompts,
            length_reward,
            tmp_path / trainer_cls.__name__,
            trainer_cls,
            max_steps=2,
            steps_per_generation=steps_per_generation,
            gradient_accumulation_steps=grad_accum,
        )
        trainer.checks, trainer.checking, count = [], False, [0]

        from testing_utils import is_scoring_forward  # the fused-LM-head forward of TRL >= 1.15, no-cache before

        def hook(module, args, kwargs):
            scoring = is_scoring_forward(kwargs) and not trainer.checking
            count[0] += bool(scoring)

        trainer.model.register_forward_pre_hook(hook, with_kwargs=True)
        trainer.train()
        return trainer, count[0]

    stapo, stapo_count = scoring_forwards(RolloutValuesCheck)
    _, grpo_count = scoring_forwards(GRPOTrainer)
    assert stapo_count - grpo_count == extra_forwards
    if source is None:
        assert stapo.checks == []
    else:
        assert stapo.checks and {check[0] for check in stapo.checks} == {source}
        assert max(max(check[1:]) for check in stapo.checks) < 1e-6


class AccumulationRecorder(STAPOTrainer):
    """Records, at every micro-step, transformers' accumulation window and the batch the parent's loss receives."""

    def _compute_loss(self, model, inputs):
        self.seen.append(
            (
                self.current_gradient_accumulation_steps,
                inputs["num_items_in_batch"].item(),
                (inputs["completion_mask"] * inputs["tool_mask"]).sum().item(),
            )
        )
        return super()._compute_loss(model, inputs)


def test_an_epoch_never_ends_inside_an_exact_update(tiny_model_path, prompts, length_reward, tmp_path):
    # TRL's normalizer uses transformers' `current_gradient_accumulation_steps`, which is shortened for the last
    # window of an epoch when the epoch's micro-steps are not a multiple of GA. An epoch has (rollout batches) x
    # steps_per_generation x num_iterations micro-steps, so when steps_per_generation is a multiple of GA (the exact
    # path) no window is shortened. 8 prompts x 2 generations = one rollout batch of 16 = an epoch; 4 updates = 2 epochs.
    trainer = make_trainer(
        tiny_model_path,
        prompts.select(range(8)),
        length_reward,
        tmp_path,
        AccumulationRecorder,
        max_steps=4,
        steps_per_generation=4,
        gradient_accumulation_steps=2,
        s2t_prob_threshold=0.05,
    )
    trainer.seen = []
    trainer.train()
    assert trainer.state.epoch == 2.0 and len(trainer.seen) == 8
    assert {window for window, _, _ in trainer.seen} == {2}
    for first, second in zip(trainer.seen[::2], trainer.seen[1::2], strict=True):
        # TRL divides by num_items x GA / steps_per_generation: the update's kept-token count, exactly
        assert first[1] * 2 / 4 == second[1] * 2 / 4 == first[2] + second[2]


def test_when_an_update_spans_rollout_batches_the_window_can_shorten_and_it_is_warned(
    tiny_model_path, prompts, length_reward, tmp_path
):
    # steps_per_generation 3, GA 2: an epoch (6 prompts x 2 = 12 completions = one rollout batch) has 3 micro-steps,
    # so its second update is shortened to 1 micro-step. The core then keeps TRL's estimated normalizer, and says so.
    with pytest.warns(UserWarning, match="not a multiple of gradient_accumulation_steps"):
        trainer = AccumulationRecorder(
            tiny_model_path,
            reward_funcs=length_reward,
            args=STAPOConfig(
                output_dir=str(tmp_path),
                use_cpu=True,
                bf16=False,
                report_to=[],
                per_device_train_batch_size=4,
                num_generations=2,
                max_completion_length=8,
                save_strategy="no",
                max_steps=2,
                steps_per_generation=3,
                gradient_accumulation_steps=2,
            ),
            train_dataset=prompts.select(range(6)),
        )
    trainer.seen = []
    trainer.train()
    assert [window for window, _, _ in trainer.seen] == [2, 2, 1]


def test_a_grpo_config_is_refused(tiny_model_path, prompts, length_reward, tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[])
    with pytest.raises(TypeError, match="STAPOConfig"):
        STAPOTrainer(tiny_model_path, reward_funcs=length_reward, args=args, train_dataset=prompts)


def test_the_model_card_cites_the_paper(tiny_model_path, prompts, length_reward, tmp_path):
    trainer = make_trainer(tiny_model_path, prompts, length_reward, tmp_path)
    trainer.create_model_card(model_name="tiny-stapo")
    card = (tmp_path / "README.md").read_text()
    assert "2602.15620" in card and "liu2026stapo" in card and "stapo" in card
