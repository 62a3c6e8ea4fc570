"""STAPO costs no extra forward in TRL's default geometry (issue 20, item 4).

With `steps_per_generation` = GA = `num_iterations` = 1, an optimizer update is one micro-batch scored under the
weights that sampled it: the training forward's detached p and H are the rollout policy's, so the mask is built from
them (`s2t_values_source` = "training_forward") instead of from a no-grad scoring forward. These tests check that the
mask is the scoring forward's, bit for bit, and that the forwards per step are `GRPOTrainer`'s.
"""

from pathlib import Path

import pytest
import torch
from test_trainer import length_reward, make_trainer
from testing_utils import ForwardCounter
from trl import GRPOTrainer

from stapo_trl import STAPOConfig, STAPOTrainer, s2t_mask
from stapo_trl.core.stapo_config import s2t_values_source


REPO_ROOT = Path(__file__).resolve().parent.parent


class ScoringForwardReference(STAPOTrainer):
    """Also runs today's scoring forward where it ran before (the scored rollout batch, before TRL's shuffle) and
    carries its p and H in the batch (TRL shuffles and splits every per-row tensor in unison); after each loss, keeps
    whether the mask the trainer built equals the S2T rule applied to those values."""

    checks: list

    def _generate_and_score_completions(self, inputs):
        batch = super()._generate_and_score_completions(inputs)
        logps, entropies = self._policy_logps_and_entropies(batch)  # (B, T) each
        return {**batch, "reference_logps": logps, "reference_entropies": entropies}

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        built = self.s2t_last_batch
        reference = s2t_mask(
            inputs["reference_logps"],
            inputs["reference_entropies"],
            inputs["advantages"],
            self._loss_mask(inputs),
            prob_threshold=self.args.s2t_prob_threshold,
            entropy_quantile=self.args.s2t_entropy_quantile,
            mode=self.args.s2t_mode,
        )
        self.checks.append(
            {
                "same_logps": torch.equal(built.per_token_logps, inputs["reference_logps"]),
                "same_entropies": torch.equal(built.entropies, inputs["reference_entropies"]),
                "same_keep": torch.equal(built.result.keep, reference.keep),
                "same_tau_h": built.result.entropy_threshold == reference.entropy_threshold
                or (built.result.num_candidates == 0 and reference.num_candidates == 0),
                "num_silenced": built.result.num_silenced,
            }
        )
        return loss


@pytest.mark.parametrize(
    "overrides",
    [{}, {"s2t_scope": "generation_batch"}, {"s2t_policy": "current"}, {"s2t_mode": "high_entropy"}],
    ids=["optimizer_step", "generation_batch", "current_policy", "high_entropy"],
)
def test_the_mask_from_the_training_forward_is_the_scoring_forwards_bit_for_bit(
    tiny_random_model_path, tmp_path, overrides
):
    # tau_p = 1: every positive-advantage token is a candidate, so the mask has something to silence at every step;
    # lr 1e-2 so that the weights (and so p and H) change from step to step.
    trainer = make_trainer(
        tiny_random_model_path,
        tmp_path,
        ScoringForwardReference,
        reward=length_reward,
        max_steps=4,
        learning_rate=1e-2,
        s2t_prob_threshold=1.0,
        **overrides,
    )
    assert s2t_values_source(trainer.args) == "training_forward"
    trainer.checks = []
    trainer.train()
    assert len(trainer.checks) == 4
    for step, check in enumerate(trainer.checks):
        assert check["same_logps"] and check["same_entropies"], step
        assert check["same_keep"] and check["same_tau_h"], step
    assert sum(check["num_silenced"] for check in trainer.checks) > 0


def scoring_forwards(model_path, tmp_path, trainer_cls, **overrides) -> int:
    trainer = make_trainer(model_path, tmp_path, trainer_cls, reward=length_reward, max_steps=3, **overrides)
    counter = ForwardCounter(trainer.model)
    trainer.train()
    return counter.count


@pytest.mark.parametrize("scope", ["optimizer_step", "generation_batch", "micro_batch"])
@pytest.mark.parametrize("policy", ["rollout", "current"])
def test_default_geometry_runs_the_forwards_of_grpo_trainer(tiny_random_model_path, tmp_path, scope, policy):
    if policy == "current" and scope == "generation_batch":
        pytest.skip("s2t_policy current needs s2t_scope optimizer_step (refused by STAPOConfig)")
    grpo = scoring_forwards(tiny_random_model_path, tmp_path / "grpo", GRPOTrainer)
    stapo = scoring_forwards(tiny_random_model_path, tmp_path, STAPOTrainer, s2t_scope=scope, s2t_policy=policy)
    assert grpo == 0  # TRL's default geometry: no old-log-prob forward, no reference model (beta 0)
    assert stapo == grpo


@pytest.mark.parametrize(
    "geometry, source",
    [
        (dict(), "training_forward"),
        (dict(s2t_scope="micro_batch", gradient_accumulation_steps=2), "training_forward"),
        (dict(gradient_accumulation_steps=2), "scoring_forward"),  # GA > 1 with steps_per_generation = GA
        (dict(steps_per_generation=4), "old_logps_forward"),  # the paper's geometry: TRL's own forward is reused
        (dict(num_iterations=2), "old_logps_forward"),
        (dict(steps_per_generation=4, s2t_policy="current"), "current_forward"),
    ],
)
def test_values_source_names_the_forward_the_trainer_runs(tmp_path, geometry, source):
    settings = dict(per_device_train_batch_size=4, num_generations=2, use_cpu=True, bf16=False, report_to=[])
    assert s2t_values_source(STAPOConfig(output_dir=str(tmp_path), **settings, **geometry)) == source


def test_ga_above_one_keeps_its_scoring_forward_and_micro_batch_scope_avoids_it(tiny_random_model_path, tmp_path):
    # GA = steps_per_generation = 2: tau_h of an update needs both micro-batches' entropies before the first
    # backward, so the optimizer_step scope scores each rollout batch once more; micro_batch takes p and H from the
    # training forward instead.
    grpo = scoring_forwards(tiny_random_model_path, tmp_path / "grpo", GRPOTrainer, gradient_accumulation_steps=2)
    per_update = scoring_forwards(tiny_random_model_path, tmp_path / "os", STAPOTrainer, gradient_accumulation_steps=2)
    per_micro_step = scoring_forwards(
        tiny_random_model_path, tmp_path / "mb", STAPOTrainer, gradient_accumulation_steps=2, s2t_scope="micro_batch"
    )
    # 3 rollout batches of 8 rows, each scored once more, in chunks of per_device_train_batch_size = 4 rows.
    assert (grpo, per_update, per_micro_step) == (0, 3 * 2, 0)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["--steps_per_generation", "1"], "the loss's own forward (no extra forward) [training_forward]"),
        (["--gradient_accumulation_steps", "2", "--steps_per_generation", "2", "--per_device_train_batch_size", "8"],
         "one extra no-grad forward per rollout batch [scoring_forward]; s2t_scope: micro_batch takes them"),
        ([], "TRL's no-grad old-log-prob forward of the rollout batch (no extra forward) [old_logps_forward]"),
    ],
)  # fmt: skip
def test_dry_run_says_where_p_and_h_come_from_and_names_the_free_alternative(overrides, expected):
    from stapo_trl.cli.dry_run import dry_run_recipe

    report = dry_run_recipe(["--config", str(REPO_ROOT / "recipes" / "demo" / "stapo.yaml"), *overrides], 1)
    assert dict(report.lines)["S2T p and H"].startswith(expected)
