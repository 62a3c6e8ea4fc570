import copy
import inspect
import math
import re
import warnings

import numpy as np
import pytest
import torch
import trl
from datasets import Dataset
from testing_utils import ForwardCounter, KeepsLogpGrad, hand_scored_batch, length_reward, policy_forward
from trl import GRPOConfig, GRPOTrainer

from stapo_trl.core import STAPOConfig, STAPOTrainer, s2t_mask
from stapo_trl.core.stapo_trainer import _FORWARD_KEYS, SUPPORTED_TRL


SETTINGS = dict(use_cpu=True, bf16=False, report_to=[], per_device_train_batch_size=4, num_generations=2, seed=0,
                max_completion_length=8, logging_steps=1, save_strategy="no", learning_rate=1e-2)  # fmt: skip
PROMPTS = Dataset.from_list([{"prompt": f"{i}+{i % 7}="} for i in range(64)])  # plain text: no chat template needed


@pytest.fixture
def build(tiny_random_model_path, tmp_path):
    def build(trainer_cls=STAPOTrainer, config_cls=None, name="run", num_prompts=64, peft_config=None, **overrides):
        config_cls = config_cls or (STAPOConfig if issubclass(trainer_cls, STAPOTrainer) else GRPOConfig)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            args = config_cls(output_dir=str(tmp_path / name), **SETTINGS | overrides)
            trainer = trainer_cls(tiny_random_model_path, length_reward, args, PROMPTS.select(range(num_prompts)),
                                  peft_config=peft_config)  # fmt: skip
        trainer.warned = [str(w.message) for w in caught if w.filename == __file__ and w.category is UserWarning]
        return trainer

    return build


def kept_tokens(loss_mask, advantages, entropies, q, high=False):  # the rule (or "high_entropy") with tau_p = 1
    candidate = loss_mask & (advantages > 0)
    tau_h = np.quantile(entropies[candidate].numpy(), 1 - q if high else q)
    return loss_mask & ~(candidate & (entropies > tau_h if high else entropies < tau_h))


@pytest.mark.release
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_in_the_default_geometry_the_loss_is_the_mean_over_kept_tokens_and_silenced_tokens_get_zero_gradient(
    build, beta
):
    # tau_p = 1: every A > 0 token a candidate, q = 0.5; beta > 0 (warned): a silenced token loses its KL penalty too
    probe = type("LogpProbe", (KeepsLogpGrad, STAPOTrainer), {})  # keeps the log-probs' gradient
    trainer = build(probe, s2t_prob_threshold=1.0, s2t_entropy_quantile=0.5, beta=beta)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    batch = hand_scored_batch(trainer.model.config.vocab_size, seed=0 if beta == 0 else 3)
    batch["tool_mask"] = (torch.arange(20) != 4).long().view(4, 5)  # (0, 4): tool output, no loss, no candidate
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
    # The paper's geometry: 4 micro-batches, GA 2; num_iterations 2: steps 4-7 reuse the hand rollout batch. The
    # library's "high_entropy" silences above the (1 - q)-quantile; vLLM IS: each token's loss times its ratio.
    import stapo_trl

    classes = (STAPOTrainer, STAPOConfig) if mode == "low_entropy" else (stapo_trl.STAPOTrainer, stapo_trl.STAPOConfig)
    trainer = build(*classes, steps_per_generation=4, gradient_accumulation_steps=2, num_iterations=2,
                    s2t_prob_threshold=1.0, s2t_entropy_quantile=q, s2t_mode=mode)  # fmt: skip
    trainer.use_vllm = trainer.vllm_importance_sampling_correction = vllm_is  # what use_vllm=True sets
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2
    vocab, g = trainer.model.config.vocab_size, torch.Generator().manual_seed(7)
    batches = [hand_scored_batch(vocab, seed, lengths=(5, 3, 4 - seed % 2, 2 + seed % 3)) for seed in range(4)]
    for batch in batches:  # rollout batches as TRL buffers them: ratio 1, hand entropies
        batch["old_per_token_logps"], _ = policy_forward(trainer, batch)
        batch["s2t_entropies"] = torch.rand(*batch["completion_mask"].shape, generator=g)
        batch["importance_sampling_ratio"] = 0.5 + torch.rand(4, 5, generator=g) if vllm_is else torch.ones(4, 5)
    trainer._buffered_inputs = batches
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
        kept = kept_tokens(loss_mask, advantages, entropies, q, high=mode != "low_entropy")  # over this update only
        ratio = torch.cat([b["importance_sampling_ratio"] for b in micro])
        silenced_counts.append(float((loss_mask & ~kept).sum()))
        expected = ((-advantages * ratio * kept).sum() / kept.sum()).item()
        assert losses[2 * update] + losses[2 * update + 1] == pytest.approx(expected, abs=1e-6)
        assert normalizers[2 * update] == normalizers[2 * update + 1] == kept.sum().item()
    assert trainer._metrics["train"]["s2t/num_silenced"] == silenced_counts and min(silenced_counts) > 0
    loss_tokens = [float(sum(b["completion_mask"].sum() for b in update)) for update in (batches[:2], batches[2:])]
    assert trainer._metrics["train"]["s2t/num_loss_tokens"] == loss_tokens


@pytest.mark.release
@pytest.mark.parametrize("steps_per_generation, grad_accum, num_iterations, loss_type, max_steps", [
    (1, 1, 1, "dapo", 1), pytest.param(2, 2, 1, "dapo", 2, marks=pytest.mark.slow),  # the loss's forward; an extra one
    (2, 2, 2, "dapo", 2),  # TRL's old-log-prob forward; the second pass is off-policy, so clipping acts
    *(pytest.param(2, 2, 2, loss, 2, marks=pytest.mark.slow) for loss in ("grpo", "bnpo", "dr_grpo"))])  # fmt: skip
def test_with_the_mask_off_training_equals_grpo_trainer(build, steps_per_generation, grad_accum, num_iterations,
                                                        loss_type, max_steps):  # fmt: skip
    geometry = dict(max_steps=max_steps, steps_per_generation=steps_per_generation, num_iterations=num_iterations,
                    gradient_accumulation_steps=grad_accum, loss_type=loss_type, epsilon_high=0.28)  # fmt: skip
    (grpo := build(GRPOTrainer, name="grpo", **geometry)).train()  # each seeds at construction: build, train, build
    (stapo := build(name="off", s2t_mode="off", **geometry)).train()
    grpo_rows, stapo_rows = ([row for row in t.state.log_history if "loss" in row] for t in (grpo, stapo))
    for grpo_row, stapo_row in zip(grpo_rows, stapo_rows, strict=True):
        assert {"loss", "grad_norm", "entropy", "clip_ratio/region_mean"} <= grpo_row.keys()
        for key in grpo_row.keys() - {"step_time", "epoch"}:
            assert stapo_row[key] == pytest.approx(grpo_row[key], rel=1e-5, abs=1e-7), key
    assert num_iterations == 1 or any(row["clip_ratio/region_mean"] > 0 for row in grpo_rows)  # clipped tokens too
    for (name, p_grpo), p_stapo in zip(grpo.model.named_parameters(), stapo.model.parameters(), strict=True):
        torch.testing.assert_close(p_stapo, p_grpo, rtol=1e-5, atol=1e-6, msg=f"{name} differs")


class Recorder(STAPOTrainer):  # the p and H kept for the mask against a fresh forward (one more); per micro-step:
    def _compute_loss(self, model, inputs):  # transformers' window, the batch the parent's loss gets
        mask = inputs["completion_mask"] * inputs.get("tool_mask", 1)
        self.seen.append((self.current_gradient_accumulation_steps, inputs["num_items_in_batch"].item(), mask.sum()))
        return super()._compute_loss(model, inputs)

    def _generate_and_score_completions(self, inputs):
        batch = super()._generate_and_score_completions(inputs)
        if "s2t_entropies" in batch:
            logps, entropies = policy_forward(self, batch)
            source = "s2t_logps" if "s2t_logps" in batch else "old_per_token_logps"
            error = max((batch[source] - logps).abs().max().item(), (batch["s2t_entropies"] - entropies).abs().max())
            self.checks.append((source, float(error)))
        return batch


@pytest.mark.release
@pytest.mark.parametrize("steps_per_generation, grad_accum, num_iterations, source, stapo_forwards, grpo_forwards", [
    *(pytest.param(*p, marks=pytest.mark.slow) for p in [(1, 1, 1, None, 0, 0), (4, 2, 1, "old_per_token_logps", 4, 4),
                                                         (2, 2, 2, "old_per_token_logps", 2, 2)]),
    (2, 2, 1, "s2t_logps", 2, 0)])  # fmt: skip  # TRL scores nothing: STAPO's one forward per rollout, in 2 chunks
def test_p_and_h_are_the_rollout_policys_with_an_extra_forward_only_where_trl_runs_none(build, steps_per_generation,
        grad_accum, num_iterations, source, stapo_forwards, grpo_forwards):  # fmt: skip  # one step: one rollout batch
    def scoring_forwards(trainer_cls):
        trainer = build(trainer_cls, name=trainer_cls.__name__, max_steps=1, steps_per_generation=steps_per_generation,
                        gradient_accumulation_steps=grad_accum, num_iterations=num_iterations)  # fmt: skip
        trainer.checks, trainer.seen, counter = [], [], ForwardCounter(trainer.model)
        trainer.train()
        return trainer, counter.count

    (stapo, stapo_count), (_, grpo_count) = scoring_forwards(Recorder), scoring_forwards(GRPOTrainer)
    assert (stapo_count - len(stapo.checks), grpo_count) == (stapo_forwards, grpo_forwards)
    assert {check[0] for check in stapo.checks} == ({source} if source else set())
    assert max([check[1] for check in stapo.checks], default=0) < 1e-6


@pytest.mark.parametrize(  # 4: the update's normalizer also in test_each_optimizer_update_gets_its_own_tau_h_and_...
    "steps_per_generation, windows", [pytest.param(4, [2] * 4, marks=pytest.mark.slow), (3, [2, 2, 1])]
)
def test_an_epoch_ends_inside_an_update_only_where_updates_span_rollout_batches(build, steps_per_generation,
                                                                                 windows):  # fmt: skip
    # 4: a rollout batch is an epoch, no window shortened; 3 and GA 2 (warned): the second update's, TRL's normalizer
    trainer = build(Recorder, num_prompts=8 if steps_per_generation == 4 else 6, max_steps=2,
                    s2t_prob_threshold=0.05, steps_per_generation=steps_per_generation,
                    gradient_accumulation_steps=2)  # fmt: skip
    assert sum("not a multiple of GA=2" in m for m in trainer.warned) == (steps_per_generation == 3)
    trainer.seen, trainer.checks = [], []
    trainer.train()
    assert [window for window, _, _ in trainer.seen] == windows
    if steps_per_generation == 4:
        assert trainer.state.epoch == 1.0
        for first, second in zip(trainer.seen[::2], trainer.seen[1::2], strict=True):
            assert first[1] * 2 / 4 == second[1] * 2 / 4 == first[2] + second[2]  # the update's kept-token count


@pytest.mark.release
def test_the_stashed_forward_goes_to_its_call_the_papers_config_is_silent_and_a_trl_of_another_normalizer_is_refused(
        build, monkeypatch):  # fmt: skip  # also: only TRL's scoring is checked, the forward keys, the card
    trainer = build(steps_per_generation=4, gradient_accumulation_steps=2)  # s2t_path "old_logps"
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
    assert not torch.equal(forward(copy.deepcopy(trainer.model), ids, mask, 5)[0], stashed[0])  # a same-weight twin
    assert forward(trainer.model, ids, mask, 5) is stashed and trainer._s2t_loss_forward is None  # its call, once
    torch.testing.assert_close(forward(trainer.model, ids, mask, 5)[0], policy_forward(trainer, batch)[0])
    trainer.model.train()
    original, rows = GRPOTrainer._generate_and_score_completions, list(PROMPTS.select([i // 2 for i in range(16)]))
    for change, error in [
        (lambda logps: logps + 1e-3, r"old_per_token_logps from no forward it saw, where s2t_path is 'old_logps'"),
        (lambda logps: None, r"old_per_token_logps missing, where s2t_path is 'old_logps'"),
        (lambda logps: logps.clone(), None),  # a copy still gives its entropies, with no extra forward
    ]:

        def changed(self, inputs, change=change):  # the PARENT changes its old log-probs
            batch = original(self, inputs)
            return batch | {"old_per_token_logps": change(batch["old_per_token_logps"])}

        monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", changed)
        if error:
            with pytest.raises(RuntimeError, match=error):
                trainer._generate_and_score_completions(rows)
        else:
            counter = ForwardCounter(trainer.model)
            assert trainer._generate_and_score_completions(rows)["s2t_entropies"].shape == (16, 8)
            assert counter.count == 4  # TRL's old-log-prob forward of 16 rows in chunks of 4, and nothing else
    call = inspect.getsource(GRPOTrainer._compute_loss).split("self._get_per_token_logps_and_entropies(")[1]
    passed = re.findall(r"(\w+)=inputs\.get\(\"\1\"\)", call.split("\n        )")[0])
    assert set(passed) == set(_FORWARD_KEYS) and len(passed) == len(_FORWARD_KEYS) == 10
    assert build().warned == [] and build(steps_per_generation=8, gradient_accumulation_steps=2).warned == []
    trainer = build(entropy_coef=0.01, use_adaptive_entropy=True)  # the adaptive bonus moves inside TRL's loss
    assert trainer.entropy_coef == 0.01 and trainer._s2t_loss_forward is None and not trainer.model.training
    assert trainer._metrics == {"train": {}, "eval": {}}
    trainer.create_model_card(model_name="tiny-stapo")  # TRL's card from `_name`, `_paper`, `_tag_names`
    card = open(f"{trainer.args.output_dir}/README.md").read()
    assert all(tag in card for tag in ("2602.15620", "liu2026stapo", "stapo"))
    monkeypatch.setattr(trl, "__version__", "1.17.0")
    assert build().warned == [f"trl 1.17.0 is outside the tested trl{SUPPORTED_TRL}."]
    original = GRPOTrainer._compute_loss  # a PARENT dividing by num_items / processes (TRL main in July 2026): refused

    def compute_loss(self, model, inputs):
        if self.model.training:
            factor = self.current_gradient_accumulation_steps / self.args.steps_per_generation
            inputs = {**inputs, "num_items_in_batch": inputs["num_items_in_batch"] * factor}
        return original(self, model, inputs)

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", compute_loss)
    for loss_type in ("dapo", "cispo", "vespo"):
        with pytest.raises(RuntimeError, match=r"STAPO would train at a wrong scale\. Use trl"):
            build(loss_type=loss_type, steps_per_generation=8, gradient_accumulation_steps=2)
    build(loss_type="cispo", steps_per_generation=2, gradient_accumulation_steps=2)  # both formulas agree


def test_opsm_judges_only_sequences_the_mask_never_touches():
    # OPSM drops A < 0 sequences whose mean KL is high, S2T silences tokens of A > 0 sequences only
    generator = torch.Generator().manual_seed(0)
    logps, entropies = torch.rand(6, 7, generator=generator).log() * 4, torch.rand(6, 7, generator=generator)
    advantages, loss_mask = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])[:, None], torch.ones(6, 7)
    result = s2t_mask(logps, entropies, advantages[:, 0], loss_mask, prob_threshold=0.1, entropy_quantile=0.5)
    sampling = logps + torch.rand(6, 7, generator=generator)  # off-policy by up to 1 nat per token
    opsm = lambda mask, t: GRPOTrainer.get_off_policy_mask(advantages, logps, sampling, mask, t)  # noqa: E731
    for threshold in (0.1, 0.4, 0.6):
        assert torch.equal(opsm(loss_mask * result.keep, threshold), opsm(loss_mask, threshold))
    assert sum(int((opsm(loss_mask, t) == 0).sum()) for t in (0.1, 0.4, 0.6)) > 0 and result.num_silenced > 0


@pytest.mark.parametrize("lora", [False, pytest.param(True, marks=pytest.mark.slow)])  # in the default suite too:
# tests/recipes/test_recipes.py::test_lora_demo_recipe_trains_only_the_adapter
def test_every_pass_uses_the_rollout_time_mask_and_lora_trains_with_the_adapter_policy(build, lora):
    # num_iterations 2: each update's mask is the rollout's on both passes though the weights moved; PEFT: adapter's
    peft_config = None
    if lora:  # peft: an extra, absent from the other Pythons' release check
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    trainer = build(max_steps=1 if lora else 4, steps_per_generation=4, gradient_accumulation_steps=2,
                    num_iterations=1 if lora else 2, s2t_prob_threshold=0.05, peft_config=peft_config)  # fmt: skip
    trained = [n for n, _ in trainer.model.named_parameters() if "lora_B" in n or not lora]
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    assert trained and all(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters() if n in trained)
    rows = [row for row in trainer.state.log_history if "loss" in row]
    assert len(rows) == (1 if lora else 4) and sum(row["s2t/num_silenced"] for row in rows) > 0
    if not lora:
        for key in ("s2t/num_silenced", "s2t/num_candidates", "s2t/num_loss_tokens", "s2t/entropy_threshold"):
            assert [row[key] for row in rows[:2]] == [row[key] for row in rows[2:]], key
        assert all(0.0 <= row["s2t/silenced_ratio"] <= row["s2t/candidate_ratio"] <= 1.0 for row in rows)
        assert all(row["s2t/num_silenced"] <= row["s2t/num_candidates"] <= row["s2t/num_loss_tokens"] for row in rows)
        assert rows[0]["loss"] != rows[2]["loss"]  # the weights (and so the ratios) did move
