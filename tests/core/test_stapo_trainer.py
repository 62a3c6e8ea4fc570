"""The core's `STAPOTrainer` on a tiny random Qwen3: hand-computed losses, zero gradients on silenced tokens, the
per-update normalizer, parity with `GRPOTrainer`, where p and H come from, what the mask does to GRPO features."""

import copy
import dataclasses
import inspect
import math
import re
import warnings

import numpy as np
import pytest
import torch
import trl
from testing_utils import ForwardCounter, KeepsLogpGrad, hand_scored_batch, is_scoring_forward, policy_forward
from trl import GRPOConfig, GRPOTrainer

from stapo_trl.core import STAPOConfig, STAPOTrainer, s2t_mask
from stapo_trl.core.stapo_trainer import _FORWARD_KEYS, SUPPORTED_TRL


SETTINGS = dict(use_cpu=True, bf16=False, report_to=[], per_device_train_batch_size=4, num_generations=2, seed=0,
                max_completion_length=8, logging_steps=1, save_strategy="no", learning_rate=1e-2)  # fmt: skip


@pytest.fixture
def build(tiny_model_path, prompts, length_reward, tmp_path):
    """`build(trainer_cls, config_cls, **config)`: a trainer and its construction's warnings from this file."""

    def build(trainer_cls=STAPOTrainer, config_cls=None, name="run", dataset=prompts, peft_config=None, **overrides):
        config_cls = config_cls or (STAPOConfig if issubclass(trainer_cls, STAPOTrainer) else GRPOConfig)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args = config_cls(output_dir=str(tmp_path / name), **SETTINGS | overrides)
        kwargs = {"peft_config": peft_config} if peft_config else {}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = trainer_cls(
                tiny_model_path, reward_funcs=length_reward, args=args, train_dataset=dataset, **kwargs
            )
        trainer.warned = [str(w.message) for w in caught if w.filename == __file__ and w.category is UserWarning]
        return trainer

    return build


class LogpProbe(KeepsLogpGrad, STAPOTrainer):
    pass


def on_policy(trainer, batches, generator):  # rollout batches as TRL buffers them: ratio 1, hand entropies
    for batch in batches:
        batch["old_per_token_logps"], _ = policy_forward(trainer, batch)
        batch["s2t_entropies"] = torch.rand(*batch["completion_mask"].shape, generator=generator)
    trainer._buffered_inputs = batches


def kept_tokens(loss_mask, advantages, entropies, q):  # the rule with tau_p = 1, independently of the core
    candidate = loss_mask & (advantages > 0)
    return loss_mask & ~(candidate & (entropies < np.quantile(entropies[candidate].numpy(), q)))


@pytest.mark.release
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_in_the_default_geometry_the_loss_is_the_mean_over_kept_tokens_and_silenced_tokens_get_zero_gradient(
    build, beta
):
    # The mask from the loss's own forward; tau_p = 1: every A > 0 token a candidate, q = 0.5. beta > 0 (warned):
    # TRL adds beta x KL to each token's loss before the loss mask, so a silenced token loses its KL penalty too.
    trainer = build(LogpProbe, s2t_prob_threshold=1.0, s2t_entropy_quantile=0.5, beta=beta)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    batch = hand_scored_batch(trainer.model.config.vocab_size, seed=0 if beta == 0 else 3)
    batch["tool_mask"] = torch.ones_like(batch["completion_mask"])
    batch["tool_mask"][0, 4] = 0  # a tool-output token: never in the loss, never a candidate
    logps, entropies = policy_forward(trainer, batch)
    batch["ref_per_token_logps"] = logps - 0.3  # KL per token: exp(-0.3) + 0.3 - 1
    loss_mask = (batch["completion_mask"] * batch["tool_mask"]).bool()
    kept = kept_tokens(loss_mask, batch["advantages"][:, None], entropies.double(), 0.5)
    loss = trainer._compute_loss(trainer.model, batch)
    # On-policy the ratio is 1: each kept token's clipped surrogate is -A (+ beta KL); dapo divides by the kept count.
    per_token = -batch["advantages"][:, None] + beta * (math.exp(-0.3) + 0.3 - 1)
    assert loss.item() == pytest.approx(((per_token * kept).sum() / kept.sum()).item(), abs=1e-6)
    loss.backward()
    grad = trainer.probe_logps.grad  # (4, 5): exactly 0 off the kept tokens
    assert torch.equal(grad[~kept], torch.zeros(int((~kept).sum()))) and (beta == 0 or (grad[kept] != 0).all())
    if beta == 0:
        assert kept.sum() == 9 and trainer._metrics["train"]["s2t/num_silenced"] == [4.0]
        torch.testing.assert_close(grad, (-batch["advantages"][:, None] * kept) / kept.sum())
        tau_h = np.quantile(entropies[loss_mask & (batch["advantages"][:, None] > 0)].double().numpy(), 0.5)
        assert trainer._metrics["train"]["s2t/entropy_threshold"][-1] == pytest.approx(tau_h)


@pytest.mark.release
@pytest.mark.parametrize("mode, q, vllm_is", [("low_entropy", 0.5, False), ("high_entropy", 0.75, False),
                                              ("low_entropy", 0.5, True)])  # fmt: skip
def test_each_optimizer_update_gets_its_own_tau_h_and_kept_token_count(build, mode, q, vllm_is):
    # The paper's geometry: 4 micro-batches, GA 2, 2 updates per rollout batch; num_iterations 2 lets the test hand TRL
    # a buffered rollout batch (steps 4-7: no generation). "high_entropy", the library's ablation, silences above the
    # (1 - q)-quantile. vLLM importance sampling: each token's loss times its ratio, the mask and normalizer unchanged.
    from stapo_trl import STAPOConfig as LibraryConfig
    from stapo_trl import STAPOTrainer as LibraryTrainer

    classes = (STAPOTrainer, STAPOConfig) if mode == "low_entropy" else (LibraryTrainer, LibraryConfig)
    trainer = build(*classes, steps_per_generation=4, gradient_accumulation_steps=2, num_iterations=2,
                    s2t_prob_threshold=1.0, s2t_entropy_quantile=q, s2t_mode=mode)  # fmt: skip
    trainer.use_vllm = trainer.vllm_importance_sampling_correction = vllm_is  # what use_vllm=True sets
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2
    vocab, generator = trainer.model.config.vocab_size, torch.Generator().manual_seed(7)
    batches = [hand_scored_batch(vocab, seed, lengths=(5, 3, 4 - seed % 2, 2 + seed % 3)) for seed in range(4)]
    on_policy(trainer, batches, generator)
    for batch in batches[: 4 * vllm_is]:
        batch["importance_sampling_ratio"] = 0.5 + torch.rand(4, 5, generator=generator)
    losses, normalizers = [], []
    for step in range(4, 8):
        trainer._step = step
        inputs = trainer._prepare_inputs(None)
        losses.append(trainer._compute_loss(trainer.model, inputs).item())
        normalizers.append(inputs["num_items_in_batch"].item() * 2 / 4)  # TRL: num_items x GA / steps_per_generation
    silenced_counts = []
    for update in (0, 1):
        micro = batches[2 * update : 2 * update + 2]
        loss_mask = torch.cat([b["completion_mask"] for b in micro]).bool()  # (8, 5)
        advantages = torch.cat([b["advantages"] for b in micro])[:, None]  # (8, 1)
        entropies = torch.cat([b["s2t_entropies"] for b in micro]).double()
        if mode == "low_entropy":  # over the update's two micro-batches only
            kept = kept_tokens(loss_mask, advantages, entropies, q)
        else:
            candidate = loss_mask & (advantages > 0)
            kept = loss_mask & ~(candidate & (entropies > np.quantile(entropies[candidate].numpy(), 1 - q)))
        ratio = torch.cat([b.get("importance_sampling_ratio", torch.ones(4, 5)) for b in micro])
        silenced_counts.append(float((loss_mask & ~kept).sum()))
        expected = ((-advantages * ratio * kept).sum() / kept.sum()).item()
        assert losses[2 * update] + losses[2 * update + 1] == pytest.approx(expected, abs=1e-6)
        assert normalizers[2 * update] == normalizers[2 * update + 1] == kept.sum().item()
    assert trainer._metrics["train"]["s2t/num_silenced"] == silenced_counts and min(silenced_counts) > 0
    assert trainer._metrics["train"]["s2t/num_loss_tokens"] == [
        float(sum(b["completion_mask"].sum() for b in batches[:2])),
        float(sum(b["completion_mask"].sum() for b in batches[2:])),
    ]


@pytest.mark.release
@pytest.mark.parametrize(
    "steps_per_generation, grad_accum, num_iterations, loss_type",
    [
        (1, 1, 1, "dapo"),  # TRL's default geometry: the mask from the loss's forward
        pytest.param(2, 2, 1, "dapo", marks=pytest.mark.slow),  # one extra no-grad forward per rollout batch
        (2, 2, 2, "dapo"),  # TRL's old-log-prob forward; the second pass is off-policy, so clipping acts
        pytest.param(2, 2, 2, "grpo", marks=pytest.mark.slow),
        pytest.param(2, 2, 2, "bnpo", marks=pytest.mark.slow),
        pytest.param(2, 2, 2, "dr_grpo", marks=pytest.mark.slow),
    ],
)
def test_with_the_mask_off_training_equals_grpo_trainer(build, steps_per_generation, grad_accum, num_iterations,
                                                        loss_type):  # fmt: skip
    # steps_per_generation = GA: an update's kept-token normalizer is TRL's own, so s2t_mode="off" is GRPOTrainer
    geometry = dict(max_steps=2, steps_per_generation=steps_per_generation, gradient_accumulation_steps=grad_accum,
                    num_iterations=num_iterations, loss_type=loss_type, epsilon=0.2, epsilon_high=0.28,
                    beta=0.0)  # fmt: skip
    grpo = build(GRPOTrainer, name="grpo", **geometry)
    grpo.train()  # each trainer seeds at construction: build and train one after the other
    stapo = build(name="off", s2t_mode="off", **geometry)
    stapo.train()
    grpo_rows = [row for row in grpo.state.log_history if "loss" in row]
    stapo_rows = [row for row in stapo.state.log_history if "loss" in row]
    for grpo_row, stapo_row in zip(grpo_rows, stapo_rows, strict=True):
        assert {"loss", "grad_norm", "entropy", "clip_ratio/region_mean"} <= grpo_row.keys()
        for key in grpo_row.keys() - {"step_time", "epoch"}:
            assert stapo_row[key] == pytest.approx(grpo_row[key], rel=1e-5, abs=1e-7), key
    if num_iterations > 1:
        assert any(row["clip_ratio/region_mean"] > 0 for row in grpo_rows)  # the comparison covers clipped tokens
    for (name, p_grpo), p_stapo in zip(grpo.model.named_parameters(), stapo.model.parameters(), strict=True):
        torch.testing.assert_close(p_stapo, p_grpo, rtol=1e-5, atol=1e-6, msg=f"{name} differs")


class RolloutValuesCheck(STAPOTrainer):
    """Counts the rollouts; compares the p and H kept for the mask with a fresh forward under the same weights."""

    checking, rollouts = False, 0

    def _generate_and_score_completions(self, inputs):
        batch = super()._generate_and_score_completions(inputs)
        self.rollouts += 1
        if "s2t_entropies" in batch:
            self.checking = True
            logps, entropies = policy_forward(self, batch)
            self.checking = False
            source = "s2t_logps" if "s2t_logps" in batch else "old_per_token_logps"
            error = max((batch[source] - logps).abs().max().item(), (batch["s2t_entropies"] - entropies).abs().max())
            self.checks.append((source, float(error)))
        return batch


@pytest.mark.release
@pytest.mark.parametrize(
    "steps_per_generation, grad_accum, num_iterations, source, stapo_forwards, grpo_forwards",
    [
        pytest.param(1, 1, 1, None, 0, 0, marks=pytest.mark.slow),  # TRL's default geometry: the loss's own forward
        (4, 2, 1, "old_per_token_logps", 4, 4),  # the paper's: TRL's old-log-prob forward (16 rows in 4 chunks)
        pytest.param(2, 2, 2, "old_per_token_logps", 2, 2, marks=pytest.mark.slow),
        (2, 2, 1, "s2t_logps", 2, 0),  # TRL scores nothing: STAPO's one forward per rollout (8 rows in 2 chunks)
    ],
)
def test_p_and_h_are_the_rollout_policys_with_an_extra_forward_only_where_trl_runs_none(
    build, steps_per_generation, grad_accum, num_iterations, source, stapo_forwards, grpo_forwards
):
    def scoring_forwards(trainer_cls):
        trainer = build(trainer_cls, name=trainer_cls.__name__, max_steps=2, steps_per_generation=steps_per_generation,
                        gradient_accumulation_steps=grad_accum, num_iterations=num_iterations)  # fmt: skip
        trainer.checks, count = [], [0]

        def hook(module, args, kwargs):
            count[0] += is_scoring_forward(kwargs) and not getattr(trainer, "checking", False)

        trainer.model.register_forward_pre_hook(hook, with_kwargs=True)
        trainer.train()
        return trainer, count[0]

    stapo, stapo_count = scoring_forwards(RolloutValuesCheck)
    _, grpo_count = scoring_forwards(GRPOTrainer)
    rollouts = 2 * grad_accum // (steps_per_generation * num_iterations)
    assert stapo.rollouts == rollouts
    assert (stapo_count, grpo_count) == (stapo_forwards * rollouts, grpo_forwards * rollouts)
    assert {check[0] for check in stapo.checks} == ({source} if source else set())
    assert max([check[1] for check in stapo.checks], default=0) < 1e-6


class AccumulationRecorder(STAPOTrainer):
    """Records per micro-step transformers' accumulation window and the batch the parent's loss receives."""

    def _compute_loss(self, model, inputs):
        mask = inputs["completion_mask"] * inputs["tool_mask"]
        self.seen.append((self.current_gradient_accumulation_steps, inputs["num_items_in_batch"].item(), mask.sum()))
        return super()._compute_loss(model, inputs)


@pytest.mark.parametrize("steps_per_generation, windows", [(4, [2] * 8), (3, [2, 2, 1])])
def test_an_epoch_ends_inside_an_update_only_where_updates_span_rollout_batches(build, prompts, steps_per_generation,
                                                                                 windows):  # fmt: skip
    # An epoch has (rollout batches) x steps_per_generation micro-steps: with 4 (8 prompts x 2 = one rollout batch =
    # an epoch) no accumulation window is shortened; with 3 and GA 2 (warned) the second update's is, and the core
    # keeps TRL's estimated normalizer.
    trainer = build(AccumulationRecorder, dataset=prompts.select(range(8 if steps_per_generation == 4 else 6)),
                    max_steps=len(windows) // 2 if steps_per_generation == 4 else 2, s2t_prob_threshold=0.05,
                    steps_per_generation=steps_per_generation, gradient_accumulation_steps=2)  # fmt: skip
    assert sum("not a multiple of GA=2" in m for m in trainer.warned) == (steps_per_generation == 3)
    trainer.seen = []
    trainer.train()
    assert [window for window, _, _ in trainer.seen] == windows
    if steps_per_generation == 4:
        assert trainer.state.epoch == 2.0
        for first, second in zip(trainer.seen[::2], trainer.seen[1::2], strict=True):
            assert first[1] * 2 / 4 == second[1] * 2 / 4 == first[2] + second[2]  # the update's kept-token count


@dataclasses.dataclass
class OpenR1StyleConfig(GRPOConfig):
    """A user's config as open-r1 writes one: `trl.GRPOConfig`, fields of its own, one S2T field."""

    benchmarks: list[str] = dataclasses.field(default_factory=list)
    s2t_prob_threshold: float = 0.05  # the random model spreads probability over ~50 tokens


@pytest.mark.parametrize("config_cls", [GRPOConfig, OpenR1StyleConfig])
def test_any_grpo_config_trains_with_its_s2t_values_or_the_papers(build, config_cls):
    trainer = build(config_cls=config_cls, max_steps=2)
    tau_p = 0.05 if config_cls is OpenR1StyleConfig else 0.002
    assert (trainer.s2t.prob_threshold, trainer.s2t.entropy_quantile, trainer.s2t.mode) == (tau_p, 0.75, "low_entropy")
    (line,) = trainer.warned  # the values in effect, and what differs from the paper's objective
    assert line.startswith(f"STAPO with s2t_prob_threshold={tau_p}, s2t_entropy_quantile=0.75, s2t_mode='low_entropy'")
    assert f" {config_cls.__name__} has no s2t_" in line and "epsilon_high=None (paper 0.28)" in line
    if config_cls is OpenR1StyleConfig:  # trains (a plain GRPOConfig: tests/trainer/test_trainers.py)
        trainer.train()
        rows = [row for row in trainer.state.log_history if "loss" in row]
        assert len(rows) == 2 and sum(row["s2t/num_candidates"] for row in rows) > 0


def test_the_papers_configuration_is_silent_and_a_trl_outside_the_tested_range_is_warned_once(build, monkeypatch):
    assert build().warned == [] and build(steps_per_generation=8, gradient_accumulation_steps=2).warned == []
    monkeypatch.setattr(trl, "__version__", "1.17.0")
    assert build().warned == [f"trl 1.17.0 is outside the tested trl{SUPPORTED_TRL}."]


@pytest.mark.release
@pytest.mark.parametrize("loss_type", ["dapo", "cispo", "vespo"])
def test_a_trl_whose_normalizer_differs_is_refused_at_construction(build, monkeypatch, loss_type):
    paper = dict(loss_type=loss_type, steps_per_generation=8, gradient_accumulation_steps=2)
    assert build(**paper)._metrics == {"train": {}, "eval": {}}  # the check left no metric behind
    original = GRPOTrainer._compute_loss  # the PARENT divides by num_items / processes, as TRL main did in July 2026

    def compute_loss(self, model, inputs):
        if self.model.training:
            factor = self.current_gradient_accumulation_steps / self.args.steps_per_generation
            inputs = {**inputs, "num_items_in_batch": inputs["num_items_in_batch"] * factor}
        return original(self, model, inputs)

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", compute_loss)
    with pytest.raises(RuntimeError, match=r"STAPO would train at a wrong scale\. Use trl"):
        build(**paper)
    build(loss_type=loss_type, steps_per_generation=2, gradient_accumulation_steps=2)  # both formulas agree


def test_the_normalizer_check_leaves_no_state_and_the_card_cites_the_paper(build, tmp_path):
    trainer = build(entropy_coef=0.01, use_adaptive_entropy=True)  # the adaptive bonus moves inside TRL's loss
    assert trainer.entropy_coef == 0.01 and trainer._s2t_loss_forward is None and not trainer.model.training
    assert trainer._metrics == {"train": {}, "eval": {}}
    trainer.create_model_card(model_name="tiny-stapo")  # TRL's card from `_name`, `_paper`, `_tag_names`
    card = (tmp_path / "run" / "README.md").read_text()
    assert "2602.15620" in card and "liu2026stapo" in card and "stapo" in card


@pytest.mark.release
def test_the_stashed_loss_forward_goes_only_to_the_call_it_was_made_for(build):
    trainer = build()
    batch = hand_scored_batch(trainer.model.config.vocab_size)
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    stashed = (torch.zeros(4, 5), torch.zeros(4, 5), None)  # not what the model computes
    trainer._s2t_loss_forward = (trainer.model, ids, 5, stashed)
    forward = trainer._get_per_token_logps_and_entropies
    flipped = {key: batch[key].flip(0) for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
    other = forward(trainer.model, ids.flip(0), mask.flip(0), 5, compute_entropy=True)  # other input ids
    torch.testing.assert_close(other[0], policy_forward(trainer, flipped)[0])
    assert forward(trainer.model, ids, mask, 3)[0].shape == (4, 3)  # other logits_to_keep
    twin = copy.deepcopy(trainer.model)  # another model with the same weights
    assert not torch.equal(forward(twin, ids, mask, 5)[0], stashed[0])
    assert forward(trainer.model, ids, mask, 5) is stashed  # the call it was made for, once
    assert trainer._s2t_loss_forward is None
    torch.testing.assert_close(forward(trainer.model, ids, mask, 5)[0], policy_forward(trainer, batch)[0])


@pytest.mark.parametrize(
    "change, error",
    [
        (lambda logps: logps + 1e-3, r"old_per_token_logps from no forward it saw, where s2t_path is 'old_logps'"),
        (lambda logps: None, r"old_per_token_logps missing, where s2t_path is 'old_logps'"),
        (lambda logps: logps.clone(), None),  # a copy still gives its entropies, with no extra forward
    ],
    ids=["changed", "missing", "copied"],
)
def test_trls_rollout_scoring_is_checked_by_value(build, monkeypatch, change, error):
    original = GRPOTrainer._generate_and_score_completions  # the PARENT changes its old log-probs

    def generate_and_score(self, inputs):
        batch = original(self, inputs)
        batch["old_per_token_logps"] = change(batch["old_per_token_logps"])
        return batch

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", generate_and_score)
    trainer = build(max_steps=1, steps_per_generation=4, gradient_accumulation_steps=2)
    if error:
        with pytest.raises(RuntimeError, match=error):
            trainer.train()
    else:
        counter = ForwardCounter(trainer.model)
        trainer.train()
        assert counter.count == 4  # TRL's old-log-prob forward of 16 rows in chunks of 4, and nothing else


@pytest.mark.release
def test_the_multimodal_forward_keys_are_the_ones_trls_loss_passes():
    # against the call in the installed TRL's source (trl 1.14's forward signature is (*args, **kwargs))
    call = inspect.getsource(GRPOTrainer._compute_loss).split("self._get_per_token_logps_and_entropies(")[1]
    passed = re.findall(r"(\w+)=inputs\.get\(\"\1\"\)", call.split("\n        )")[0])
    assert set(passed) == set(_FORWARD_KEYS) and len(passed) == len(_FORWARD_KEYS) == 10


def test_opsm_judges_only_sequences_the_mask_never_touches():
    # OPSM drops A < 0 sequences whose mean KL is high; S2T silences tokens of A > 0 sequences only
    generator = torch.Generator().manual_seed(0)
    logps = torch.rand(6, 7, generator=generator).log() * 4
    entropies = torch.rand(6, 7, generator=generator)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])[:, None]
    loss_mask = torch.ones(6, 7)
    result = s2t_mask(logps, entropies, advantages[:, 0], loss_mask, prob_threshold=0.1, entropy_quantile=0.5)
    assert result.num_silenced > 0
    sampling = logps + torch.rand(6, 7, generator=generator)  # off-policy by up to 1 nat per token
    dropped = 0
    for threshold in (0.1, 0.4, 0.6):
        with_mask = GRPOTrainer.get_off_policy_mask(advantages, logps, sampling, loss_mask * result.keep, threshold)
        without = GRPOTrainer.get_off_policy_mask(advantages, logps, sampling, loss_mask, threshold)
        assert torch.equal(with_mask, without)
        dropped += int((without == 0).sum())
    assert dropped > 0


@pytest.mark.parametrize("lora", [False, True])
def test_every_pass_uses_the_rollout_time_mask_and_lora_trains_with_the_adapter_policy(build, lora):
    # num_iterations 2: p and H stay the rollout's, so each update's mask is the same on both passes though the
    # weights moved; PEFT: p and H of the model with its adapter, only the adapter's weights train.
    from peft import LoraConfig

    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]) if lora else None
    trainer = build(max_steps=2 if lora else 4, steps_per_generation=4, gradient_accumulation_steps=2,
                    num_iterations=1 if lora else 2, s2t_prob_threshold=0.05, peft_config=peft_config)  # fmt: skip
    trained = [n for n, _ in trainer.model.named_parameters() if "lora_B" in n or not lora]
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    assert trained and all(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters() if n in trained)
    rows = [row for row in trainer.state.log_history if "loss" in row]
    assert len(rows) == (2 if lora else 4) and sum(row["s2t/num_silenced"] for row in rows) > 0
    if not lora:
        for key in ("s2t/num_silenced", "s2t/num_candidates", "s2t/num_loss_tokens", "s2t/entropy_threshold"):
            assert [row[key] for row in rows[:2]] == [row[key] for row in rows[2:]], key
        for row in rows:
            assert 0.0 <= row["s2t/silenced_ratio"] <= row["s2t/candidate_ratio"] <= 1.0
            assert row["s2t/num_silenced"] <= row["s2t/num_candidates"] <= row["s2t/num_loss_tokens"]
        assert rows[0]["loss"] != rows[2]["loss"]  # the weights (and so the ratios) did move
