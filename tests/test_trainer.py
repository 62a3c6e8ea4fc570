"""`STAPOTrainer`: the S2T mask in TRL's loss, hand-computed losses, exact zero gradients, parity with
`GRPOTrainer`, gradient-accumulation normalisation and end-to-end training in both scopes."""

import warnings

import pytest
import torch
from datasets import Dataset
from testing_utils import ForwardCounter
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import split_tensor_dict

from stapo_trl import STAPOConfig, STAPOTrainer, s2t_mask


def zero_reward(completions, **kwargs):
    return [0.0] * len(completions)


def length_reward(completions, **kwargs):
    """Varies within a group, so advantages are non-zero and the policy gets a gradient."""
    return [float(len(c[0]["content"] if isinstance(c, list) else c) % 4) for c in completions]


PROMPTS = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}+{i % 7}"}]} for i in range(64)])


def make_trainer(model_path, tmp_path, trainer_cls=STAPOTrainer, reward=zero_reward, **overrides):
    config_cls = STAPOConfig if issubclass(trainer_cls, STAPOTrainer) else GRPOConfig
    settings = dict(
        output_dir=str(tmp_path / trainer_cls.__name__),
        use_cpu=True,
        bf16=False,  # bf16 on CPU is slow and not what the maths is checked in
        report_to=[],
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,  # tiny model, short completions: keeps each step ~0.1 s
        logging_steps=1,
        save_strategy="no",
        seed=0,
    )
    settings.update(overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = config_cls(**settings)
        trainer = trainer_cls(model_path, reward_funcs=reward, args=args, train_dataset=PROMPTS)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps  # set by train() only
    return trainer


def hand_inputs(vocab_size, seed=0):
    """A scored batch of 4 completions (3 prompt tokens, up to 5 completion tokens).

    Advantages [+1, -0.5, +2, 0]; completion lengths [5, 3, 4, 2] -> 14 loss tokens.
    """
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([5, 3, 4, 2])
    completion_mask = (torch.arange(5).unsqueeze(0) < lengths.unsqueeze(1)).long()  # (4, 5)
    return {
        "prompt_ids": torch.randint(3, vocab_size, (4, 3), generator=generator),
        "prompt_mask": torch.ones(4, 3, dtype=torch.long),
        "completion_ids": torch.randint(3, vocab_size, (4, 5), generator=generator),
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.0, -0.5, 2.0, 0.0]),
        "num_items_in_batch": completion_mask.sum(),
    }


class LogpProbe(STAPOTrainer):
    """Keeps the training forward's per-token log-probs so a test can read their gradient."""

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        logps, entropies, aux = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if torch.is_grad_enabled():
            logps.retain_grad()
            self.probe_logps = logps
        return logps, entropies, aux


@pytest.mark.parametrize("scope", ["generation_batch", "micro_batch"])
def test_dapo_loss_is_mean_over_kept_tokens_and_silenced_tokens_get_zero_gradient(
    tiny_random_model_path, tmp_path, scope
):
    # tau_p = 1 and mode all_low_prob: every positive-advantage token is silenced, so the kept tokens are those of
    # rows 1 (A = -0.5, 3 tokens) and 3 (A = 0, 2 tokens). On-policy the ratio is 1, so each token's clipped
    # surrogate is -A: loss = (3 * 0.5 + 2 * 0) / 5 = 0.3, not (3 * 0.5 - 5 * 1 - 4 * 2) / 14 as GRPO would give.
    trainer = make_trainer(
        tiny_random_model_path, tmp_path, LogpProbe, s2t_prob_threshold=1.0, s2t_mode="all_low_prob", s2t_scope=scope
    )
    inputs = hand_inputs(trainer.model.config.vocab_size)
    if scope == "generation_batch":
        inputs = trainer._apply_s2t(inputs)
        assert inputs["num_items_in_batch"].item() == 5
    loss = trainer._compute_loss(trainer.model, inputs)
    assert loss.item() == pytest.approx(0.3, abs=1e-6)
    loss.backward()
    grad = trainer.probe_logps.grad  # (4, 5): d loss / d log p = -A / K on kept tokens
    expected = torch.zeros(4, 5)
    expected[1, :3] = 0.5 / 5
    assert torch.equal(grad[0], torch.zeros(5)) and torch.equal(grad[2], torch.zeros(5))  # exactly zero
    torch.testing.assert_close(grad, expected)


def test_all_tokens_silenced_gives_finite_zero_loss_that_backpropagates(tiny_random_model_path, tmp_path):
    trainer = make_trainer(tiny_random_model_path, tmp_path, s2t_prob_threshold=1.0, s2t_mode="all_low_prob")
    inputs = hand_inputs(trainer.model.config.vocab_size)
    inputs["advantages"] = torch.tensor([1.0, 0.5, 2.0, 3.0])
    inputs = trainer._apply_s2t(inputs)
    assert inputs["num_items_in_batch"].item() == 0
    loss = trainer._compute_loss(trainer.model, inputs)
    assert torch.isfinite(loss) and loss.item() == 0.0
    assert loss.requires_grad  # still connected to the graph
    loss.backward()
    grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
    assert grads and all(torch.count_nonzero(g) == 0 for g in grads)


def test_low_entropy_mask_is_built_from_the_policy_forward(tiny_random_model_path, tmp_path):
    trainer = make_trainer(tiny_random_model_path, tmp_path, s2t_prob_threshold=1.0, s2t_entropy_quantile=0.5)
    inputs = hand_inputs(trainer.model.config.vocab_size)
    masked = trainer._apply_s2t(inputs)
    logps, entropies = trainer._policy_logps_and_entropies(inputs)
    reference = s2t_mask(
        logps, entropies, inputs["advantages"], inputs["completion_mask"], prob_threshold=1.0, entropy_quantile=0.5
    )
    # 9 positive-advantage tokens (rows 0 and 2); the median splits them: 4 silenced, 5 kept.
    assert reference.num_candidates == 9 and reference.num_silenced == 4
    assert torch.equal(masked["tool_mask"].bool(), reference.keep)
    assert masked["num_items_in_batch"].item() == 14 - 4
    assert torch.equal(masked["completion_mask"], inputs["completion_mask"])  # the attention mask is never edited
    log = trainer._metrics["train"]
    assert log["s2t/num_silenced"][-1] == 4 and log["s2t/silenced_ratio"][-1] == pytest.approx(4 / 14)
    assert log["s2t/candidate_ratio"][-1] == pytest.approx(9 / 14)
    assert log["s2t/entropy_threshold"][-1] == pytest.approx(reference.entropy_threshold)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("how", ["mode_off", "threshold_never_fires"])
def test_parity_with_grpo_trainer_when_nothing_is_silenced(tiny_random_model_path, tmp_path, loss_type, how):
    """Guards against TRL changing under us: with no token silenced, loss and gradients are GRPOTrainer's."""
    s2t = {"s2t_mode": "off"} if how == "mode_off" else {"s2t_prob_threshold": 1e-30}
    shared = dict(loss_type=loss_type, epsilon=0.2, epsilon_high=0.28, beta=0.0)
    grpo = make_trainer(tiny_random_model_path, tmp_path, GRPOTrainer, **shared)
    stapo = make_trainer(tiny_random_model_path, tmp_path, STAPOTrainer, **shared, **s2t)
    inputs = hand_inputs(grpo.model.config.vocab_size)
    # Off-policy old log-probs so that the ratio differs from 1 and clipping acts on some tokens.
    logps, _ = stapo._policy_logps_and_entropies(inputs)
    noise = torch.randn(logps.shape, generator=torch.Generator().manual_seed(1)) * 0.3
    inputs["old_per_token_logps"] = logps + noise

    grpo_loss = grpo._compute_loss(grpo.model, dict(inputs))
    stapo_inputs = stapo._apply_s2t(dict(inputs))
    assert not stapo_inputs["tool_mask"].eq(0).any()
    stapo_loss = stapo._compute_loss(stapo.model, stapo_inputs)
    assert stapo_loss.item() == pytest.approx(grpo_loss.item(), rel=1e-6, abs=1e-7)
    assert grpo._metrics["train"]["clip_ratio/region_mean"][-1] > 0  # the comparison covers clipped tokens
    grpo_loss.backward()
    stapo_loss.backward()
    for (name, p_grpo), p_stapo in zip(grpo.model.named_parameters(), stapo.model.parameters(), strict=True):
        torch.testing.assert_close(p_stapo.grad, p_grpo.grad, msg=f"gradient of {name} differs")


def test_gradient_accumulation_normalises_by_kept_tokens_of_the_optimizer_step(tiny_random_model_path, tmp_path):
    # GA = 2 micro-batches of different token counts, one optimizer step per generation batch.
    trainer = make_trainer(
        tiny_random_model_path,
        tmp_path,
        gradient_accumulation_steps=2,
        s2t_prob_threshold=1.0,
        s2t_mode="all_low_prob",
    )
    first, second = hand_inputs(trainer.model.config.vocab_size, 0), hand_inputs(trainer.model.config.vocab_size, 1)
    second["completion_mask"][:, 1:] = 0  # 4 loss tokens instead of 14
    second["advantages"] = torch.tensor([-1.0, -2.0, 0.5, -4.0])
    generation_batch = {key: torch.cat([first[key], second[key]]) for key in first if key != "num_items_in_batch"}
    generation_batch["num_items_in_batch"] = generation_batch["completion_mask"].sum()
    micro_batches = split_tensor_dict(trainer._apply_s2t(generation_batch), 2)
    trainer._set_optimizer_step_normalisers(micro_batches)
    total = sum(trainer._compute_loss(trainer.model, batch).item() for batch in micro_batches)
    # Kept (A <= 0) tokens: first batch rows 1 (3 x 0.5) and 3 (2 x 0); second batch rows 0, 1, 3 (1 token each,
    # -A = 1, 2, 4). Token mean over the step: (1.5 + 0 + 1 + 2 + 4) / (5 + 3) = 8.5 / 8.
    assert total == pytest.approx(8.5 / 8, abs=1e-6)


def test_each_optimizer_step_of_a_generation_batch_gets_its_own_exact_count(tiny_random_model_path, tmp_path):
    # steps_per_generation = 4, GA = 2: two optimizer steps per generation batch; TRL would divide both by half of
    # the generation batch's count, STAPO divides each by its own kept count.
    trainer = make_trainer(
        tiny_random_model_path,
        tmp_path,
        gradient_accumulation_steps=2,
        steps_per_generation=4,
        s2t_mode="off",
    )
    vocab = trainer.model.config.vocab_size
    batches = [hand_inputs(vocab, seed) for seed in range(4)]
    batches[2]["completion_mask"][:, 2:] = 0  # optimizer step 1 has fewer tokens
    batches[3]["completion_mask"][:, 1:] = 0
    for batch in batches:
        batch["old_per_token_logps"] = trainer._policy_logps_and_entropies(batch)[0]
        batch["tool_mask"] = torch.ones_like(batch["completion_mask"])
    trainer._set_optimizer_step_normalisers(batches)
    losses = [trainer._compute_loss(trainer.model, batch).item() for batch in batches]

    def token_mean(step_batches):
        num = sum((-b["advantages"].unsqueeze(1) * b["completion_mask"]).sum() for b in step_batches)
        return (num / sum(b["completion_mask"].sum() for b in step_batches)).item()

    assert losses[0] + losses[1] == pytest.approx(token_mean(batches[:2]), abs=1e-6)
    assert losses[2] + losses[3] == pytest.approx(token_mean(batches[2:]), abs=1e-6)


@pytest.mark.parametrize(
    "grad_accum, steps_per_generation, extra_forwards",
    [
        (1, 1, 0),  # TRL's default geometry: the mask comes from the training forward (test_default_geometry.py)
        (1, 2, 0),  # steps_per_generation > GA: TRL computes old log-probs; the mask reuses that forward's entropies
        (
            2,
            2,
            2 * 2,
        ),  # GA > 1 with steps_per_generation = GA: 2 rollout batches of 8 rows, each scored once more in 2 chunks
    ],
)
def test_generation_batch_scope_runs_one_extra_forward_only_when_trl_runs_none(
    tiny_random_model_path, tmp_path, grad_accum, steps_per_generation, extra_forwards
):
    # per_device_train_batch_size 4 -> the scoring forward runs in chunks of 4 rows.
    def scoring_forwards(trainer_cls):
        trainer = make_trainer(
            tiny_random_model_path,
            tmp_path,
            trainer_cls,
            reward=length_reward,
            max_steps=2,
            gradient_accumulation_steps=grad_accum,
            steps_per_generation=steps_per_generation,
        )
        counter = ForwardCounter(trainer.model)
        trainer.train()
        return counter.count

    assert scoring_forwards(STAPOTrainer) - scoring_forwards(GRPOTrainer) == extra_forwards


@pytest.mark.parametrize("scope", ["generation_batch", "micro_batch"])
def test_train_end_to_end_changes_weights_and_logs_s2t_metrics(tiny_random_model_path, tmp_path, scope):
    # tau_p = 0.05: the random-init model spreads probability over ~50 tokens, so many tokens are candidates.
    trainer = make_trainer(
        tiny_random_model_path,
        tmp_path,
        reward=length_reward,
        max_steps=3,
        learning_rate=1e-2,
        s2t_prob_threshold=0.05,
        s2t_scope=scope,
    )
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    for name, p in trainer.model.named_parameters():
        assert not torch.equal(before[name], p), f"{name} did not change"
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == 3
    for entry in logged:
        for key in ("s2t/silenced_ratio", "s2t/candidate_ratio", "s2t/num_candidates", "s2t/num_silenced"):
            assert key in entry, key
        # tau_h is defined (and logged) exactly when there was a candidate
        assert ("s2t/entropy_threshold" in entry) == (entry["s2t/num_candidates"] > 0), entry
        assert 0.0 <= entry["s2t/silenced_ratio"] <= entry["s2t/candidate_ratio"] <= 1.0
    assert sum(entry["s2t/num_silenced"] for entry in logged) > 0


def test_undefined_s2t_metrics_are_left_out_of_the_logs(tiny_random_model_path, tmp_path):
    # tau_p = 1e-30: no token is ever a candidate, so tau_h and the silenced-token means are undefined (NaN) at every
    # step. 3 steps with logging_steps 2: step 3 is logged only by the end-of-training summary (train_result.metrics).
    trainer = make_trainer(
        tiny_random_model_path, tmp_path, reward=length_reward, max_steps=3, logging_steps=2, s2t_prob_threshold=1e-30
    )
    result = trainer.train()
    logged = [h for h in trainer.state.log_history if "s2t/silenced_ratio" in h]
    assert len(logged) == 2  # step 2, and step 3 inside the summary
    for entry in logged:
        assert entry["s2t/num_candidates"] == 0 and entry["s2t/silenced_ratio"] == 0
        assert "s2t/entropy_threshold" not in entry and "s2t/silenced_prob_mean" not in entry
        assert None not in entry.values()
    assert None not in result.metrics.values()
    trainer.log_metrics("train", result.metrics)  # formats every value: fails on a None


def test_builtin_model_names_work_in_the_python_api(tiny_random_model_path, builtin_cache_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("STAPO_TRL_CACHE", str(builtin_cache_dir))  # where the fixture built it
    trainer = make_trainer("builtin:tiny-random", tmp_path)
    assert trainer.model.config._name_or_path == tiny_random_model_path


def test_trainer_rejects_grpo_config_and_warns_on_constant_denominator(tiny_random_model_path, tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[])
    with pytest.raises(TypeError, match="STAPOConfig"):
        STAPOTrainer(tiny_random_model_path, reward_funcs=zero_reward, args=args, train_dataset=PROMPTS)
    args = STAPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], loss_type="dr_grpo")
    with pytest.warns(UserWarning, match="constant denominator"):
        STAPOTrainer(tiny_random_model_path, reward_funcs=zero_reward, args=args, train_dataset=PROMPTS)
