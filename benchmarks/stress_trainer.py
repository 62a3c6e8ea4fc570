r"""The stress experiment's machinery (`stress.py`): where boxes close, the rollout-only noise (a transformers
`LogitsProcessor`), the trainer that installs it and checks the mask at the injected positions, the `}` probe and the
noise-free held-out measurement."""

from __future__ import annotations

import functools
import statistics
from collections import Counter, defaultdict
from types import SimpleNamespace
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import LogitsProcessor, LogitsProcessorList

from stapo_trl.core.s2t import linear_quantile
from stapo_trl.grading import find_boxes, is_correct
from stapo_trl.trainer import STAPOTrainer


RECIPE = "recipes/demo/stapo.yaml"


ARMS = ("low_entropy", "off", "high_entropy", "all_low_prob")


DESIGNS = {"post_answer": 0.2, "everywhere": 0.02}  # design -> default eps


DEFAULT_STEPS = {"post_answer": 400, "everywhere": 300}


# Token kinds of the attribution (a completion's tokens, by where they are and where they were drawn from).
# answer: up to the token that closes the first box (all tokens of a completion without a box, not injected);
# junk1 / pi1: injected / policy-sampled non-EOS token at the first position after the box; junk / pi: the same at
# later positions (design `everywhere`: injected tokens before the box are `junk` too); eos: policy-sampled EOS after
# the box.
KINDS = ("answer", "junk1", "junk", "pi1", "pi", "eos")


def closed_box_end(text: str) -> int | None:
    r"""Character index just past the last closed `\boxed{...}` of `text`, or `None` when no box is closed.

    Uses the grader's box finder ([`~stapo_trl.grading.extract_boxed_answer`]'s), so "closed" means what the reward
    reads: nested braces are matched, an unterminated box is not closed.
    """
    ends = [end for content, _, end in find_boxes(text) if content is not None]
    return ends[-1] if ends else None


def text_after_last_box(text: str) -> str | None:
    """The text after the last closed box (`None` when there is no closed box)."""
    end = closed_box_end(text)
    return None if end is None else text[end:]


def first_closed_step(tokenizer, token_ids: list[int]) -> int | None:
    r"""Number of tokens k such that `token_ids[:k]` is the shortest prefix whose text holds a closed box.

    `None` when no prefix does. Decoded with special tokens skipped, as the reward sees the completion.
    """
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    if closed_box_end(text) is None:
        return None
    for k in range(1, len(token_ids) + 1):
        if closed_box_end(tokenizer.decode(token_ids[:k], skip_special_tokens=True)) is not None:
            return k
    return None  # unreachable


class UniformNoiseProcessor(LogitsProcessor):
    r"""Sample from (1 - eps) pi + eps uniform over the vocabulary, at post-answer positions or everywhere.

    Drawn as a two-stage mixture: each (row, position) draws u ~ U(0, 1) from the processor's own generator; when
    u < eps (and the position is eligible) the row's scores are replaced by zeros, so the sampler draws uniformly
    over all `scores.size(-1)` ids; otherwise the scores are untouched. The marginal is exactly the mixture, and the
    positions drawn from the uniform part are recorded in `injected`.

    Args:
        tokenizer: decodes the generated tokens (special tokens skipped) to find a closed `\boxed{...}`.
        prompt_length (`int`): length of the (left-padded) prompt block of `input_ids` in this `generate` call.
        eps (`float`): mixing weight of the uniform distribution, in [0, 1].
        design (`str`): `"post_answer"` (only once a closed box is in the generated text) or `"everywhere"`.
        generator (`torch.Generator`): the noise's random stream (the sampler's own stream is not consumed).

    Attributes:
        injected (`list[list[bool]]`): per generated row, per generated position: drawn from the uniform part.
        closed_at (`list[int | None]`): per row, the number of generated tokens when the box first closed.

    Raises:
        ValueError: for `eps` outside [0, 1] or an unknown `design`.
    """

    def __init__(self, tokenizer, prompt_length: int, eps: float, design: str, generator: torch.Generator):
        if not 0.0 <= eps <= 1.0:
            raise ValueError(f"eps={eps!r} must be in [0, 1]")
        if design not in DESIGNS:
            raise ValueError(f"design={design!r} is not one of {list(DESIGNS)}")
        self.tokenizer, self.prompt_length, self.eps, self.design = tokenizer, prompt_length, eps, design
        self.generator = generator
        self.injected: list[list[bool]] = []
        self.closed_at: list[int | None] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        batch_size = input_ids.size(0)
        if not self.injected:
            self.injected = [[] for _ in range(batch_size)]
            self.closed_at = [None] * batch_size
        generated = input_ids.size(1) - self.prompt_length  # tokens generated so far
        for row in range(batch_size):
            if self.closed_at[row] is None and generated > 0:
                text = self.tokenizer.decode(input_ids[row, self.prompt_length :].tolist(), skip_special_tokens=True)
                if closed_box_end(text) is not None:
                    self.closed_at[row] = generated
        eligible = torch.tensor(
            [self.design == "everywhere" or c is not None for c in self.closed_at], device=scores.device
        )
        draw = torch.rand(batch_size, generator=self.generator) < self.eps
        inject = eligible & draw.to(scores.device)
        for row in range(batch_size):
            self.injected[row].append(bool(inject[row]))
        if inject.any():
            scores = scores.clone()
            scores[inject] = 0.0  # uniform over the vocabulary
        return scores


class StressTrainer(STAPOTrainer):
    """[`~stapo_trl.STAPOTrainer`] whose rollouts (not its evaluation) sample with [`UniformNoiseProcessor`].

    The processor is passed to the policy's `generate` only inside `_generate_single_turn` (TRL 1.16's
    transformers generation path, the one that samples rollouts); `model.generate` everywhere else, and evaluation,
    is untouched. Each scored generation batch gets `stress_kind` ((B, T) long, an index into `KINDS`) and
    `stress_injected` ((B, T) bool), which TRL shuffles and splits with the rest of the batch.

    Set after construction: `noise_eps` (float), `noise_design` (str), `noise_seed` (int), `attribution` (bool),
    `probe` ([`BracketProbe`] or None).
    """

    noise_eps: float = 0.0
    noise_design: str = "post_answer"
    attribution: bool = False
    probe = None
    last_mask = None  # the last mask with its inputs (SimpleNamespace: result, per_token_logps, entropies, ...)

    def setup_stress(self, eps: float, design: str, seed: int, attribution: bool = False, probe=None) -> None:
        """Set the noise (eps, design, seed of its own random stream) and the evidence collectors."""
        self.noise_eps, self.noise_design, self.attribution, self.probe = eps, design, attribution, probe
        self._noise_generator = torch.Generator().manual_seed(10_000 + seed)
        self._noise_records: list[UniformNoiseProcessor] = []
        self.mask_stats: Counter = Counter()
        self.bracket_counts: Counter = Counter()
        self.attribution_sums: dict[str, float] = defaultdict(float)
        self.attribution_steps: list[dict[str, float]] = []

    # ---- the noise, rollouts only
    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        model = self.accelerator.unwrap_model(self.model)
        original = model.generate
        tokenizer = self.processing_class

        @functools.wraps(original)
        def noisy_generate(*args, **kwargs):
            prompt_length = kwargs["input_ids"].size(1)
            processor = UniformNoiseProcessor(
                tokenizer, prompt_length, self.noise_eps, self.noise_design, self._noise_generator
            )
            kwargs["logits_processor"] = LogitsProcessorList([processor])
            output = original(*args, **kwargs)
            self._noise_records.append(processor)
            return output

        model.generate = noisy_generate  # instance attribute, removed below: nothing else ever sees it
        try:
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        finally:
            del model.generate

    def _generate_and_score_completions(self, inputs):
        self._noise_records = []
        output = super()._generate_and_score_completions(inputs)
        if not self.model.training:
            return output
        completion_ids = output["completion_ids"]  # (B, T)
        batch_size, length = completion_ids.shape
        injected_rows = [row for record in self._noise_records for row in record.injected]
        closed_rows = [c for record in self._noise_records for c in record.closed_at]
        if len(injected_rows) != batch_size:
            raise RuntimeError(f"noise records for {len(injected_rows)} rows, batch has {batch_size}")
        injected = torch.zeros(batch_size, length, dtype=torch.bool)
        kind = torch.zeros(batch_size, length, dtype=torch.long)
        eos_ids = set(self.eos_token_ids)
        completion_mask = output["completion_mask"].cpu()
        ids = completion_ids.cpu()
        for row in range(batch_size):
            n = min(len(injected_rows[row]), length)
            injected[row, :n] = torch.tensor(injected_rows[row][:n], dtype=torch.bool)
            closed = closed_rows[row]
            for t in range(length):
                if not completion_mask[row, t]:
                    continue
                first = closed is not None and t == closed
                if injected[row, t]:
                    kind[row, t] = KINDS.index("junk1" if first else "junk")
                elif closed is not None and t >= closed:
                    name = "eos" if int(ids[row, t]) in eos_ids else ("pi1" if first else "pi")
                    kind[row, t] = KINDS.index(name)
        device = completion_ids.device
        output["stress_injected"] = injected.to(device)
        output["stress_kind"] = kind.to(device)
        # Filled in by `_observe_mask` once the mask of these rows exists (TRL shuffles and splits the
        # rollout batch first; these per-row tensors travel with their rows).
        output["stress_candidate"] = torch.zeros_like(kind).to(device)
        if self.probe is not None:
            self.probe.record(self, self.state.global_step)
        return output

    def _compute_s2t_mask(self, per_token_logps, entropies, advantages, loss_mask, completion_ids):
        """The trainer's mask (the core's hook), kept with its inputs for the checks below."""
        result = super()._compute_s2t_mask(per_token_logps, entropies, advantages, loss_mask, completion_ids)
        self.last_mask = SimpleNamespace(
            result=result,
            per_token_logps=per_token_logps,
            entropies=entropies,
            advantages=advantages,
            loss_mask=loss_mask,
            completion_ids=completion_ids,
        )
        return result

    def _prepare_inputs(self, generation_batch):
        """TRL's micro-batch; when an optimizer update's mask was just built, the ground-truth check and the candidate
        classes on exactly the rows it covered (one optimizer update: the core's window of micro-batches)."""
        last = self.last_mask
        inputs = super()._prepare_inputs(generation_batch)
        if self.model.training and self.last_mask is not last and "stress_injected" in inputs:
            micro_batches = self._buffered_inputs
            steps_per_generation, grad_accum = len(micro_batches), self.args.gradient_accumulation_steps
            window = grad_accum if steps_per_generation % grad_accum == 0 else steps_per_generation
            index = self._step % steps_per_generation
            start = index - index % window
            self._observe_mask(micro_batches[start : start + window])
        return inputs

    def _observe_mask(self, micro_batches: list[dict]) -> None:
        """The ground-truth check and the candidate classes (written into each batch's `stress_candidate`) on the rows
        the trainer's last mask covered: one optimizer update (`_prepare_inputs`), or the micro-batch whose loss
        built it (`_compute_loss`, TRL's default geometry)."""
        rows = {"completion_ids": torch.cat([b["completion_ids"] for b in micro_batches])}  # (ΣB, T)
        injected = torch.cat([b["stress_injected"] for b in micro_batches]).cpu()
        kind = torch.cat([b["stress_kind"] for b in micro_batches]).cpu()
        classes = self._candidate_classes(rows).split([b["completion_ids"].size(0) for b in micro_batches])
        for batch, cls in zip(micro_batches, classes, strict=True):
            batch["stress_candidate"] = cls.to(batch["completion_ids"].device)
        self._check_mask(rows, injected, kind)

    def _candidate_classes(self, output: dict) -> torch.Tensor:
        """(B, T) long: 0 = not a candidate, 1 = candidate below the q-quantile of candidate entropies (what
        `low_entropy` silences), 2 = candidate at or above it. The same classes in every arm (`off` included)."""
        batch = self.last_mask
        classes = torch.zeros(output["completion_ids"].shape, dtype=torch.long)
        if batch is None or not torch.equal(batch.completion_ids.cpu(), output["completion_ids"].cpu()):
            return classes
        candidate = batch.result.candidate.cpu()
        if candidate.any():
            entropies = batch.entropies.cpu()
            tau_h = linear_quantile(entropies[candidate].float(), self.args.s2t_entropy_quantile)
            classes[candidate & (entropies < tau_h)] = 1
            classes[candidate & ~(entropies < tau_h)] = 2
        return classes

    # ---- ground truth: the mask at injected positions
    def _check_mask(self, output: dict, injected: torch.Tensor, kind: torch.Tensor) -> None:
        """Recompute the S2T rule from the mask's own inputs and count agreement at injected / other positions."""
        batch = self.last_mask
        if batch is None or batch.completion_ids.shape != output["completion_ids"].shape:
            return
        if not torch.equal(batch.completion_ids.cpu(), output["completion_ids"].cpu()):
            return  # the last mask was not built on this batch: nothing to check
        logps = batch.per_token_logps.double().cpu()
        entropies = batch.entropies.double().cpu()
        advantages = batch.advantages.reshape(-1, 1).double().cpu()
        in_loss = batch.loss_mask.bool().cpu()
        result = batch.result
        tau_p, tau_h = self.args.s2t_prob_threshold, result.entropy_threshold
        candidate_ref = in_loss & (advantages > 0) & (logps.exp() < tau_p)
        mode = self.args.s2t_mode
        if mode == "low_entropy":
            silenced_ref = candidate_ref & (entropies < tau_h)
        elif mode == "high_entropy":
            silenced_ref = candidate_ref & (entropies > tau_h)
        elif mode == "all_low_prob":
            silenced_ref = candidate_ref.clone()
        else:
            silenced_ref = torch.zeros_like(candidate_ref)
        candidate, silenced = result.candidate.cpu(), result.silenced.cpu()
        ids = output["completion_ids"].cpu()
        close_id = self.processing_class.convert_tokens_to_ids("}")
        stats = self.mask_stats
        for name, where in (("injected", injected & in_loss), ("policy", ~injected & in_loss)):
            stats[f"{name}/tokens"] += int(where.sum())
            stats[f"{name}/positive"] += int((where & (advantages > 0)).sum())
            stats[f"{name}/candidates"] += int((candidate & where).sum())
            stats[f"{name}/silenced"] += int((silenced & where).sum())
            stats[f"{name}/candidate_mismatch"] += int((candidate != candidate_ref)[where].sum())
            stats[f"{name}/silenced_mismatch"] += int((silenced != silenced_ref)[where].sum())
        stats["batches"] += 1
        stats["batches_with_candidates"] += int(result.num_candidates > 0)
        # The closing brace after the box: where it was drawn from, the sign of its advantage, and the mask.
        post = in_loss & (ids == close_id) & (kind != KINDS.index("answer"))
        for name, where in (("junk", post & injected), ("policy", post & ~injected)):
            for sign, adv in (("pos", advantages > 0), ("neg", advantages < 0), ("zero", advantages == 0)):
                cell = where & adv
                self.bracket_counts[f"{name}/{sign}"] += int(cell.sum())
                self.bracket_counts[f"{name}/{sign}/silenced"] += int((cell & silenced).sum())
        for k, name in enumerate(KINDS):
            for sign, adv in (("pos", advantages > 0), ("neg", advantages < 0)):
                cell = in_loss & (kind == k) & adv
                self.mask_stats[f"kind/{name}/{sign}/tokens"] += int(cell.sum())
                self.mask_stats[f"kind/{name}/{sign}/silenced"] += int((cell & silenced).sum())

    # ---- attribution: which tokens move log p(`}` | ...\\boxed{gold})
    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        logps, entropies, aux = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        if self.attribution and torch.is_grad_enabled() and logps.requires_grad:
            self._attribution_logps = logps  # the loss's own forward: its log-probs carry the graph
        return logps, entropies, aux

    def _compute_loss(self, model, inputs):
        self._attribution_logps = None
        loss = super()._compute_loss(model, inputs)
        if self._s2t_mask_in_loss and model.training and "stress_injected" in inputs:
            self._observe_mask([inputs])  # the mask of this micro-batch was just built from the loss's forward
        if self.attribution and self.probe is not None and model.training and "stress_kind" in inputs:
            if self._attribution_logps is not None:
                self._attribute(model, inputs, loss, self._attribution_logps)
        return loss

    def _attribute(self, model, inputs: dict, loss: torch.Tensor, logps: torch.Tensor) -> None:
        """Per-token first-order change of the probe's mean log p(`}`) caused by this micro-batch's update.

        Δθ ≈ -lr P ∂L/∂θ with P = 1 / (sqrt(v̂) + ε) (Adam's preconditioner of the current state; no momentum, no
        clipping). With L = L(logp_1 ... logp_n) and g = ∂log p(`}`)/∂θ of the probe, Δ log p(`}`) ≈
        -lr Σ_t (∂L/∂logp_t) D_t where D_t = ∂logp_t/∂θ · (P g) is a directional derivative, taken by forward-mode
        differentiation (`torch.func.jvp`, one forward). So every token gets its share, and the shares add up to the
        whole micro-batch's.
        """
        params = [p for p in model.parameters() if p.requires_grad]
        coeff = torch.autograd.grad(loss, logps, retain_graph=True)[0].detach()  # (B, T) ∂L/∂logp_t
        probe_grad = torch.autograd.grad(self.probe.log_prob_close(model), params)
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)
        group = optimizer.param_groups[0]
        lr, beta2, adam_eps = group["lr"], group["betas"][1], group["eps"]
        direction = []
        for p, g in zip(params, probe_grad, strict=True):
            state = optimizer.state.get(p, {})
            if "exp_avg_sq" in state:
                v_hat = state["exp_avg_sq"] / (1 - beta2 ** float(state["step"]))
                direction.append(g / (v_hat.sqrt() + adam_eps))
            else:
                direction.append(g.clone())
        norm = torch.sqrt(sum((d * d).sum() for d in direction)).item()
        if norm == 0.0:
            return
        names = [name for name, p in model.named_parameters() if p.requires_grad]
        # D_t exactly, by forward-mode differentiation along the direction (a float32 central difference lost ~10 %
        # of the smallest shares to rounding on some CPUs); functional: the weights are never modified.
        # (sdpa's fused CPU kernel has no forward-mode derivative: its math form has.)
        with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
            _, derivative = torch.func.jvp(
                lambda *weights: self._completion_logps(model, inputs, dict(zip(names, weights, strict=True))),
                tuple(p.detach() for p in params),
                tuple(direction),
            )  # (B, T) D_t
        share = -lr * coeff * derivative  # (B, T)
        kind = inputs["stress_kind"]
        advantages = inputs["advantages"].reshape(-1, 1)
        mask = inputs["completion_mask"].bool()
        close = inputs["completion_ids"] == self.probe.close_id
        row: dict[str, float] = {"step": float(self.state.global_step)}
        for k, name in enumerate(KINDS):
            for sign, adv in (("pos", advantages > 0), ("neg", advantages < 0)):
                cell = mask & (kind == k) & adv
                row[f"{name}/{sign}"] = float(share[cell].sum())
                row[f"{name}/{sign}/close"] = float(share[cell & close].sum())
        for c, label in ((1, "cand_lowH"), (2, "cand_highH")):
            for k, name in enumerate(KINDS):
                cell = mask & (kind == k) & (inputs["stress_candidate"] == c)
                row[f"{label}/{name}"] = float(share[cell].sum())
                row[f"{label}/{name}/close"] = float(share[cell & close].sum())
        for key, value in row.items():
            if key != "step":
                self.attribution_sums[key] += value
        self.attribution_steps.append(row)

    @staticmethod
    def _completion_logps(model, inputs: dict, weights: dict) -> torch.Tensor:
        """(B, T) log-probs of the completion tokens under `model` with `weights` (T = 1: no temperature scaling)."""
        completion_ids = inputs["completion_ids"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        logits = torch.func.functional_call(model, weights, args=(), kwargs=kwargs, strict=False).logits
        logits = logits[:, -completion_ids.size(1) - 1 : -1].float()
        return torch.log_softmax(logits, dim=-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)


class BracketProbe:
    r"""p(`}`), p(EOS) and entropy right after `\boxed{<gold>}` on fixed held-out problems (no noise, no sampling).

    Args:
        tokenizer: the policy's tokenizer (chat template, `}` and EOS tokens).
        prompts (`list[list[dict]]`), completions (`list[str]`): the probe contexts, gold completions ending in a box.
    """

    def __init__(self, tokenizer, prompts, completions):
        self.close_id = tokenizer.convert_tokens_to_ids("}")
        self.eos_id = tokenizer.eos_token_id
        rows = []
        for prompt, completion in zip(prompts, completions, strict=True):
            text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True) + completion
            rows.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        width = max(map(len, rows))
        pad = tokenizer.pad_token_id
        self.input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])  # left-padded (N, W)
        self.attention_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        self.history: list[dict[str, float]] = []

    def _last_logits(self, model) -> torch.Tensor:
        device = next(model.parameters()).device
        out = model(input_ids=self.input_ids.to(device), attention_mask=self.attention_mask.to(device))
        return out.logits[:, -1, :].float()  # (N, V): the next token after the closed box

    def log_prob_close(self, model) -> torch.Tensor:
        """Mean over the probe contexts of log p(`}` | context) (a scalar with grad)."""
        return torch.log_softmax(self._last_logits(model), dim=-1)[:, self.close_id].mean()

    @torch.no_grad()
    def record(self, trainer, step: int) -> None:
        model = trainer.model
        was_training = model.training
        model.eval()
        logp = torch.log_softmax(self._last_logits(model), dim=-1)
        model.train(was_training)
        p = logp.exp()
        self.history.append(
            dict(
                step=step,
                p_close=float(p[:, self.close_id].mean()),
                p_eos=float(p[:, self.eos_id].mean()),
                entropy=float(-(p * logp).sum(-1).mean()),
            )
        )


@torch.no_grad()
def evaluate_junk(model, tokenizer, prompts, solutions, *, k: int, max_new_tokens: int, seed: int) -> dict[str, Any]:
    r"""Sample `k` completions per problem at T = 1 (plain `generate`, no processor) and measure the post-answer junk.

    Returns:
        `dict`: `accuracy` (share of correct completions, last box graded), `junk_rate` (share of all completions
        with non-blank text after their last closed box), `brace_junk_rate` (those whose post-box text starts with
        `}`, e.g. `\\boxed{74}}`), `boxed_rate`, `post_box_entropy` (mean entropy in nats of
        the policy at the first position after the box closed, over completions with a closed box), and
        `junk_examples` (the 10 most common post-box texts).
    """
    model.eval()
    device = next(model.parameters()).device
    eos_id = tokenizer.eos_token_id
    correct = junk = brace = boxed = total = 0
    entropies: list[float] = []
    examples: Counter = Counter()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        for start in range(0, len(prompts), 50):
            chunk = list(range(start, min(start + 50, len(prompts))))
            texts = [
                tokenizer.apply_chat_template(prompts[i], tokenize=False, add_generation_prompt=True) for i in chunk
            ]
            batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
            batch = batch.to(device)
            out = model.generate(
                **batch,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=max_new_tokens,
                num_return_sequences=k,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=eos_id,
                return_dict_in_generate=True,
                output_logits=True,
            )
            generated = out.sequences[:, batch["input_ids"].shape[1] :]
            logits = torch.stack(out.logits, dim=1).float()  # (N, L, V)
            for j in range(generated.size(0)):
                ids = generated[j].tolist()
                if eos_id in ids:
                    ids = ids[: ids.index(eos_id) + 1]
                text = tokenizer.decode(ids, skip_special_tokens=True)
                total += 1
                correct += is_correct(text, solutions[chunk[j // k]])
                after = text_after_last_box(text)
                if after is None:
                    continue
                boxed += 1
                if after.strip():
                    junk += 1
                    brace += after.lstrip().startswith("}")
                    examples[after[:20]] += 1
                step = first_closed_step(tokenizer, ids)
                if step is not None and step < logits.size(1):
                    logp = torch.log_softmax(logits[j, step], dim=-1)
                    entropies.append(float(-(logp.exp() * logp).sum()))
    return dict(
        accuracy=correct / total,
        junk_rate=junk / total,
        brace_junk_rate=brace / total,
        boxed_rate=boxed / total,
        post_box_entropy=statistics.mean(entropies) if entropies else float("nan"),
        junk_examples=examples.most_common(10),
        num_completions=total,
    )
