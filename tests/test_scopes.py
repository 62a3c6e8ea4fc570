"""The S2T scopes in the paper's batch geometry (issue 10): tau_h per optimizer update over the rows that really form
it, like-for-like baselines (mask off = the same loss in every scope and geometry), the current-policy option,
non-finite values, pooled log rows and the one source of construction warnings."""

import math
import warnings

import numpy as np
import pytest
import torch
from test_trainer import PROMPTS, hand_inputs, length_reward, make_trainer
from testing_utils import ForwardCounter
from trl import GRPOTrainer

from stapo_trl import STAPOConfig, STAPOTrainer
from stapo_trl.core.stapo_config import untested_combination_warnings


class HandScoredRollouts(GRPOTrainer):
    """Stands in for generation + reward scoring only: `_generate_and_score_completions` returns a hand-made
    rollout batch (`self.hand_rollout`). Placed after `STAPOTrainer` in the MRO, so everything STAPO does around the
    scored batch (rollout values, TRL's shuffle and split, the mask per update, the normalisers) runs for real."""

    def _generate_and_score_completions(self, inputs):
        return {key: value.clone() if torch.is_tensor(value) else value for key, value in self.hand_rollout.items()}


class HandValues(STAPOTrainer, HandScoredRollouts):
    """p and H of the rollout are the hand-made `hand_logps` / `hand_entropies` rows (the model's forward would give
    values no test could derive by hand)."""

    def _rollout_values(self, batch, captured=()):
        return batch["hand_logps"], batch["hand_entropies"], None


def hand_rollout(num_rows, length=2, advantage=1.0):
    """Row r: completion id r + 3 (to find the row after TRL's shuffle), entropies [r/10 + 0.01, r/10 + 0.05] nats,
    every token sampled with p = 0.001 < tau_p (all candidates when A > 0)."""
    rows = torch.arange(num_rows)
    return {
        "prompt_ids": torch.full((num_rows, 2), 5),
        "prompt_mask": torch.ones(num_rows, 2, dtype=torch.long),
        "completion_ids": (rows + 3).unsqueeze(1).repeat(1, length),  # (B, T)
        "completion_mask": torch.ones(num_rows, length, dtype=torch.long),
        "advantages": torch.full((num_rows,), advantage),
        "num_items_in_batch": torch.tensor(float(num_rows * length)),
        "hand_logps": torch.full((num_rows, length), math.log(0.001)),
        "hand_entropies": rows.unsqueeze(1) / 10 + torch.tensor([0.01, 0.05]),  # (B, T)
    }


def run_prepare_inputs(trainer, num_micro_steps):
    """Call `_prepare_inputs` as `training_step` does, one micro-step after another; returns the micro-batches."""
    batches = []
    for _ in range(num_micro_steps):
        batches.append(trainer._prepare_inputs(None))
        trainer._step += 1
    return batches


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_tau_h_is_taken_per_optimizer_update_over_its_own_rows(tiny_random_model_path, tmp_path, grad_accum):
    # The paper's geometry: steps_per_generation = 4 x GA, so one rollout batch feeds 4 optimizer updates.
    # 4 completions per micro-batch -> the rollout batch has 16 x GA rows, each update 4 x GA rows = 8 x GA candidates.
    steps = 4 * grad_accum
    trainer = make_trainer(
        tiny_random_model_path,
        tmp_path,
        HandValues,
        gradient_accumulation_steps=grad_accum,
        steps_per_generation=steps,
    )
    trainer.hand_rollout = hand_rollout(4 * steps)
    batches = run_prepare_inputs(trainer, steps)
    assert len(trainer.s2t_train_batches) == 4  # one mask per optimizer update
    rollout_tau = float(np.quantile(trainer.hand_rollout["hand_entropies"].double().numpy(), 0.75))
    differing = 0
    for update, built in enumerate(trainer.s2t_train_batches):
        rows = [
            int(r) - 3
            for b in batches[update * grad_accum : (update + 1) * grad_accum]
            for r in b["completion_ids"][:, 0]
        ]
        entropies = trainer.hand_rollout["hand_entropies"][rows]  # (4 x GA, 2): this update's own candidates
        # tau_h = numpy's linear-interpolation 0.75-quantile of exactly these 8 x GA entropies
        expected_tau = float(np.quantile(entropies.double().numpy(), 0.75))
        assert built.result.entropy_threshold == pytest.approx(expected_tau, abs=1e-12), update
        assert built.result.num_candidates == 8 * grad_accum
        assert torch.equal(built.result.silenced, built.entropies.double() < expected_tau)
        differing += int((built.result.silenced != (built.entropies.double() < rollout_tau)).sum())
        # every micro-batch of the update carries its rows' keep mask, and the update's exact kept count
        num_kept = 8 * grad_accum - built.result.num_silenced
        for b in batches[update * grad_accum : (update + 1) * grad_accum]:
            assert b["num_items_in_batch"].item() == num_kept * steps / grad_accum
    assert differing > 0  # the rollout-wide tau_h would have silenced other tokens


def test_generation_batch_scope_takes_tau_h_over_the_rollout_batch(tiny_random_model_path, tmp_path):
    trainer = make_trainer(
        tiny_random_model_path, tmp_path, HandValues, steps_per_generation=4, s2t_scope="generation_batch"
    )
    trainer.hand_rollout = hand_rollout(16)
    batches = run_prepare_inputs(trainer, 4)
    (built,) = trainer.s2t_train_batches  # one mask for the 4 updates
    assert built.result.entropy_threshold == pytest.approx(
        np.quantile(trainer.hand_rollout["hand_entropies"].double().numpy(), 0.75)
    )
    # Each update is still normalised by its own kept count (x steps_per_generation / GA for TRL's formula).
    for b in batches:
        assert b["num_items_in_batch"].item() == b["tool_mask"].sum().item() * 4


# TRL's per-step metrics. (The s2t/ counts of a row are those of the masks built in it: "generation_batch" builds one
# mask per rollout batch, at its first step, so its rows differ from the per-update scopes' while their sums agree.)
STEP_METRICS = ("loss", "grad_norm", "entropy", "clip_ratio/region_mean", "reward")


def train_log(tiny_random_model_path, tmp_path, trainer_cls=STAPOTrainer, **overrides):
    """Train a few steps on the tiny random model; returns (per-step log rows, final parameters)."""
    # why: 4 optimizer updates cover two rollout batches in every geometry below; lr 1e-2 so that the weights move
    # enough between updates for the ratio to leave 1 and clipping to act.
    trainer = make_trainer(
        tiny_random_model_path,
        tmp_path / trainer_cls.__name__ / str(sorted(overrides.items())),
        trainer_cls,
        reward=length_reward,
        max_steps=4,
        learning_rate=1e-2,
        **overrides,
    )
    trainer.train()
    rows = [h for h in trainer.state.log_history if "loss" in h]
    return rows, {name: p.detach().clone() for name, p in trainer.model.named_parameters()}


def assert_same_training(reference, other, keys=STEP_METRICS):
    (rows_a, params_a), (rows_b, params_b) = reference, other
    assert len(rows_a) == len(rows_b) == 4
    for step, (a, b) in enumerate(zip(rows_a, rows_b, strict=True)):
        for key in keys:
            if key in a or key in b:
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), (step, key)
    for name, value in params_a.items():
        torch.testing.assert_close(params_b[name], value, msg=f"{name} differs")


@pytest.mark.parametrize(
    "grad_accum, steps_per_generation, num_iterations",
    [(1, 1, 1), (1, 4, 1), (2, 2, 1), (2, 8, 1), (1, 1, 2), (1, 4, 2), (2, 2, 2), (2, 8, 2)],
)
def test_mask_off_is_the_same_objective_in_every_scope(
    tiny_random_model_path, tmp_path, grad_accum, steps_per_generation, num_iterations
):
    geometry = dict(
        gradient_accumulation_steps=grad_accum,
        steps_per_generation=steps_per_generation,
        num_iterations=num_iterations,
    )
    runs = {
        scope: train_log(tiny_random_model_path, tmp_path, s2t_mode="off", s2t_scope=scope, **geometry)
        for scope in ("optimizer_step", "generation_batch", "micro_batch")
    }
    assert any(row.get("clip_ratio/region_mean", 0) > 0 for row in runs["optimizer_step"][0]) or (
        steps_per_generation == grad_accum and num_iterations == 1  # on-policy: the ratio is exactly 1
    )
    assert_same_training(runs["optimizer_step"], runs["generation_batch"])
    assert_same_training(runs["optimizer_step"], runs["micro_batch"])
    assert all(row["s2t/num_silenced"] == 0 for row in runs["micro_batch"][0])
    totals = {scope: sum(row.get("s2t/num_loss_tokens", 0) for row in rows) for scope, (rows, _) in runs.items()}
    assert len(set(totals.values())) == 1, totals  # every scope counted every loss token once per pass


@pytest.mark.parametrize("scope", ["optimizer_step", "generation_batch", "micro_batch"])
def test_threshold_that_never_fires_equals_its_mask_off_twin_in_the_paper_geometry(
    tiny_random_model_path, tmp_path, scope
):
    # steps_per_generation = 4 x GA: the geometry of every Qwen3 recipe and the demo.
    geometry = dict(gradient_accumulation_steps=2, steps_per_generation=8, s2t_scope=scope)
    off = train_log(tiny_random_model_path, tmp_path, s2t_mode="off", **geometry)
    never = train_log(tiny_random_model_path, tmp_path, s2t_prob_threshold=1e-30, **geometry)
    same_scope = ("s2t/num_silenced", "s2t/silenced_ratio", "s2t/num_loss_tokens")
    assert_same_training(off, never, STEP_METRICS + same_scope)


def test_mask_off_equals_grpo_trainer_when_steps_per_generation_is_ga(tiny_random_model_path, tmp_path):
    grpo = train_log(tiny_random_model_path, tmp_path, GRPOTrainer, gradient_accumulation_steps=2)
    stapo = train_log(tiny_random_model_path, tmp_path, s2t_mode="off", gradient_accumulation_steps=2)
    assert_same_training(grpo, stapo, ("loss", "grad_norm", "entropy", "reward"))


class CurrentPolicyCheck(STAPOTrainer):
    """After each `_prepare_inputs`, compares the p of the mask built for this update with a fresh no-grad forward
    of the current weights on the same rows."""

    def _prepare_inputs(self, generation_batch):
        inputs = super()._prepare_inputs(generation_batch)
        built = self.s2t_train_batches[-1]
        rows = built.completion_ids.size(0)
        current, _ = self._policy_logps_and_entropies(inputs)
        self.matches.append(rows == inputs["completion_ids"].size(0) and torch.equal(built.per_token_logps, current))
        return inputs


@pytest.mark.parametrize("policy, expected", [("current", [True] * 8), ("rollout", [True, False, False, False] * 2)])
def test_current_policy_takes_p_and_h_under_the_weights_of_each_update(
    tiny_random_model_path, tmp_path, policy, expected
):
    trainer = make_trainer(
        tiny_random_model_path,
        tmp_path,
        CurrentPolicyCheck,
        reward=length_reward,
        max_steps=8,
        learning_rate=1e-2,
        steps_per_generation=4,
        s2t_policy=policy,
    )
    trainer.matches = []
    trainer.train()
    # Updates 2..4 of a rollout batch run on weights changed by the updates before them: only "current" follows.
    assert trainer.matches == expected


def test_current_policy_costs_one_no_grad_forward_per_update(tiny_random_model_path, tmp_path):
    def scoring_forwards(policy):
        trainer = make_trainer(
            tiny_random_model_path,
            tmp_path,
            reward=length_reward,
            max_steps=4,
            steps_per_generation=4,
            s2t_policy=policy,
        )
        counter = ForwardCounter(trainer.model)
        trainer.train()
        return counter.count

    # steps_per_generation 4 > GA 1: TRL scores the rollout batch (4 chunks of 4), reused by "rollout"; "current"
    # adds one no-grad forward of each update's micro-batch.
    assert scoring_forwards("current") - scoring_forwards("rollout") == 4


def test_non_finite_entropies_are_counted_and_warned_once(tiny_random_model_path, tmp_path):
    trainer = make_trainer(tiny_random_model_path, tmp_path, HandValues, steps_per_generation=2)
    trainer.hand_rollout = hand_rollout(8)
    trainer.hand_rollout["hand_entropies"][0, 0] = float("nan")
    trainer.hand_rollout["hand_entropies"][5, 1] = float("inf")
    with pytest.warns(UserWarning, match="non-finite log-probability or entropy") as record:
        run_prepare_inputs(trainer, 4)  # two rollout batches: the warning is shown once
    assert sum("non-finite" in str(w.message) for w in record) == 1
    trainer.log({})
    row = trainer.state.log_history[-1]
    assert row["s2t/num_nonfinite"] == 2 * 2  # two per rollout batch
    assert row["s2t/num_candidates"] == 2 * (16 - 2)  # non-finite positions are never candidates


def test_log_row_sums_counts_and_pools_ratios_over_its_masks(tiny_random_model_path, tmp_path):
    # Two masks in one log row, with 14 and 4 loss tokens: the row reports sums and pooled ratios, not means.
    trainer = make_trainer(tiny_random_model_path, tmp_path, s2t_prob_threshold=1.0, s2t_mode="all_low_prob")
    first, second = hand_inputs(trainer.model.config.vocab_size, 0), hand_inputs(trainer.model.config.vocab_size, 1)
    second["completion_mask"][:, 1:] = 0  # rows 0 and 2 (A > 0) keep 1 token each -> 2 silenced of 4
    trainer._apply_s2t(first)  # rows 0 and 2: 5 + 4 = 9 silenced of 14
    trainer._apply_s2t(second)
    trainer.log({})
    row = trainer.state.log_history[-1]
    assert (row["s2t/num_silenced"], row["s2t/num_candidates"], row["s2t/num_loss_tokens"]) == (11, 11, 18)
    assert row["s2t/silenced_ratio"] == pytest.approx(11 / 18)  # the mean of 9/14 and 2/4 would be 0.571
    assert row["s2t/num_nonfinite"] == 0


@pytest.mark.parametrize(
    "overrides, message",
    [({"loss_type": "vespo"}, "phi weight"), ({"entropy_coef": 0.01}, "entropy bonus is then averaged over kept")],
)
def test_trainer_warns_at_construction_with_the_shared_messages(tiny_random_model_path, tmp_path, overrides, message):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # config-time warnings of transformers, not under test
        args = STAPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], **overrides)
    with pytest.warns(UserWarning, match=message) as record:
        STAPOTrainer(tiny_random_model_path, reward_funcs=length_reward, args=args, train_dataset=PROMPTS)
    shared = untested_combination_warnings(args)
    assert [str(w.message) for w in record if str(w.message) in shared] == shared


@pytest.mark.parametrize("scope", ["optimizer_step", "micro_batch"])
def test_the_record_of_training_masks_holds_one_pass_over_the_rollout_batch(tiny_random_model_path, tmp_path, scope):
    # The spurious-token logger reads `s2t_train_batches`; it must not grow with the run (it held every micro_batch
    # mask of the run before): 8 steps of steps_per_generation 4 leave the 4 masks of the last rollout batch.
    trainer = make_trainer(
        tiny_random_model_path, tmp_path, reward=length_reward, max_steps=8, steps_per_generation=4, s2t_scope=scope
    )
    trainer.train()
    assert len(trainer.s2t_train_batches) == 4
