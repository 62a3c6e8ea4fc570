"""`STAPOTrainer`: TRL's `GRPOTrainer` with the S2T mask of STAPO in the loss.

Only *which tokens count* changes: the keep mask of [`s2t_mask`] joins the loss mask in the numerator and the
denominator of the parent's loss, and the token-count normaliser of `dapo`/`cispo`/`vespo` becomes the global count
of kept tokens of each optimizer update. The parent's `_compute_loss` is called, never copied, so every other GRPO
option keeps working. This file imports torch, accelerate and trl, and the rest of this folder only.
"""

from __future__ import annotations

import textwrap
import warnings

import torch
from accelerate.utils import is_peft_model
from trl import GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import get_config_model_id

from .s2t import S2TBatch, S2TResult, s2t_mask
from .s2t_metrics import CollisionProbabilityRecorder, s2t_diagnostic_metrics
from .stapo_config import STAPOConfig, check_loss_type, s2t_values_source, untested_combination_warnings


# Extra model inputs the parent forwards to `_get_per_token_logps_and_entropies` (multimodal models).
_FORWARD_INPUT_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)
# Keys STAPOTrainer adds to a scored rollout batch. TRL shuffles and splits every per-row tensor of the batch in
# unison, so each micro-batch carries its own rows' values: the loss mask and tool mask before silencing, and (policy
# "rollout") the log-probs, entropies and log Σ π² of the no-grad scoring forward.
_LOSS_MASK, _TOOL_MASK = "s2t_loss_mask", "s2t_tool_mask"
_ROLLOUT_LOGPS, _ROLLOUT_ENTROPIES, _ROLLOUT_COLLISION = "s2t_per_token_logps", "s2t_entropies", "s2t_log_collision"
# Per-mask counts that a log row sums (and pools into ratios) instead of averaging; see `STAPOTrainer.log`.
_COUNT_METRICS = ("s2t/num_silenced", "s2t/num_candidates", "s2t/num_loss_tokens", "s2t/num_nonfinite")


class STAPOTrainer(GRPOTrainer):
    r"""
    Trainer for [STAPO](https://huggingface.co/papers/2602.15620): GRPO whose loss silences rare spurious tokens.

    A token is silenced when its completion has a positive advantage, it was sampled with probability below τ_p and
    its entropy is below the q-quantile τ_h of such candidates over the paper's mini-batch, i.e. one optimizer update
    (Sec. 3, the S2T rule). Silenced tokens leave the numerator *and* the denominator of the loss ("dynamic
    valid-token averaging"). Everything else is [`~trl.GRPOTrainer`]: the arguments, generation (transformers, vLLM
    server/colocate), rewards, PEFT, DeepSpeed.

    Which tokens τ_h is taken over, under which policy p and H are taken, and what normalises the loss
    (`args.s2t_scope`, `args.s2t_policy`; `dapo`/`cispo`/`vespo`):

    | scope | τ_h over the candidates of | p and H from | normaliser of each update |
    |---|---|---|---|
    | `optimizer_step` (default) | one optimizer update: its GA micro-batches, all processes | `s2t_policy`: the rollout batch's no-grad scoring forward (`rollout`), or one no-grad forward at the update's start (`current`) | the update's global kept-token count (exact) |
    | `generation_batch` | the rollout batch: all `steps_per_generation` micro-batches, all processes | the rollout batch's no-grad scoring forward | the update's global kept-token count (exact) |
    | `micro_batch` | one micro-step, all processes | the training forward (current policy) | the update's global loss-token count (the kept count when GA = 1) |

    The rollout forward is TRL's old-log-prob forward when TRL runs one (vLLM importance sampling,
    `steps_per_generation` > GA, `num_iterations` > 1), otherwise one extra no-grad forward per rollout batch, except
    in TRL's default geometry (`steps_per_generation` = GA = `num_iterations` = 1): there the update is one
    micro-batch scored under the weights that sampled it, so the mask is built from the training forward's own
    detached values, the same mask bit for bit with no extra forward ([`s2t_values_source`] says which). When
    `steps_per_generation` is not a multiple of GA, the first two scopes fall back to `generation_batch` with TRL's
    estimated normaliser (a warning says so). With `s2t_mode="off"` every scope gives the same loss and gradients:
    the like-for-like baseline of the paper's comparisons. The per-loss-type normalisation is in `docs/stapo.md`.

    How the mask reaches the parent's loss: it is multiplied into `inputs["tool_mask"]`, which TRL reads only as a
    loss mask (`completion_mask` is also the attention mask and is never edited), and `inputs["num_items_in_batch"]`
    is replaced by the kept-token count.

    Metrics (reduced over all processes; counts are summed over a log row's masks and ratios pooled, so every scope
    reports the same numbers for the same tokens) under `s2t/`: `silenced_ratio` (Σ silenced / Σ loss tokens),
    `candidate_ratio`, `num_silenced`, `num_candidates`, `num_loss_tokens`, `num_nonfinite` (loss tokens with a
    non-finite log-probability or entropy: never candidates, warned once), `entropy_threshold` (τ_h in nats, mean
    over the row's masks; left out when no mask had a candidate). TRL's `entropy` and `clip_ratio/*` are computed by
    the parent over the kept tokens. With `args.s2t_diagnostics` (on by default) also the diagnostics of
    [`s2t_diagnostic_metrics`]. The masks built since the current pass over a rollout batch began are kept in
    `s2t_train_batches` ([`S2TBatch`]: the mask with its inputs), the last evaluation mask in `s2t_last_eval_batch`,
    for callbacks that record tokens. The trainer writes no files of its own.

    Args:
        model, reward_funcs, train_dataset, ...: as [`~trl.GRPOTrainer`].
        args ([`STAPOConfig`], *optional*): defaults to `STAPOConfig("<model>-STAPO")`.

    Raises:
        TypeError: if `args` is not an [`STAPOConfig`].
        ValueError: if `args.loss_type` is one whose normalisation STAPO does not know.
    """

    _tag_names = ["trl", "grpo", "stapo"]
    _name = "STAPO"
    _paper = {
        "title": "STAPO: Stabilizing Reinforcement Learning for LLMs by Silencing Rare Spurious Tokens",
        "id": "2602.15620",
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @article{liu2026stapo,
                title        = {{STAPO: Stabilizing Reinforcement Learning for LLMs by Silencing Rare Spurious Tokens}},
                author       = {Shiqi Liu and Zeyu He and Guojian Zhan and Letian Tao and Zhilong Zheng and Jiang Wu and Yinuo Wang and Yang Guan and Kehua Sheng and Bo Zhang and Keqiang Li and Jingliang Duan and Shengbo Eben Li},
                year         = 2026,
                eprint       = {arXiv:2602.15620},
            }"""),
    }

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: STAPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        *pargs,
        **kwargs,
    ):
        if args is None:
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = STAPOConfig(f"{model_name.split('/')[-1]}-STAPO")
        if not isinstance(args, STAPOConfig):
            raise TypeError(
                f"STAPOTrainer needs `args` to be a STAPOConfig, got {type(args).__name__}. "
                "Build it with STAPOConfig(...) (it accepts every GRPOConfig field)."
            )
        check_loss_type(args.loss_type)  # STAPOConfig refuses it; a field changed after construction
        for message in untested_combination_warnings(args):
            warnings.warn(message, stacklevel=2)
        self._s2t_captured: list[tuple[torch.Tensor, ...]] | None = None
        self._s2t_forward_cache: tuple | None = None
        self._s2t_log_collision: torch.Tensor | None = None  # log Σ π² of the last policy forward (diagnostics)
        self._s2t_built_windows: set[int] = set()  # windows of the buffered rollout batch whose mask is built
        self._s2t_nonfinite_warned = False
        # The masks built in training since the current pass over the rollout batch began (read by the spurious-
        # token logger), and the last evaluation mask: training and evaluation each keep their own record.
        self.s2t_train_batches: list[S2TBatch] = []
        self.s2t_last_eval_batch: S2TBatch | None = None
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, *pargs, **kwargs)
        self._s2t_collision = None
        if self.args.s2t_diagnostics:
            self._s2t_collision = CollisionProbabilityRecorder(
                self.model.get_base_model() if is_peft_model(self.model) else self.model,
                temperature=self.temperature,
                cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32,
            )

    @property
    def s2t_last_batch(self) -> S2TBatch | None:
        """The last training mask built on this process (`None` before the first)."""
        return self.s2t_train_batches[-1] if self.s2t_train_batches else None

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's `log`, with the `s2t/` counts summed and the ratios pooled over the row, and undefined keys left out.

        Each mask appends its global counts; a row reports Σ counts and Σ silenced / Σ loss tokens (not a mean of
        per-mask ratios), so every scope and logging interval gives the same numbers for the same tokens. TRL turns
        an all-NaN metric into `None` (which breaks `Trainer.log_metrics` and is not a number for trackers):
        `s2t/entropy_threshold` is NaN when there is no candidate and `s2t/silenced_*_mean` when nothing is silenced,
        so such keys are left out of the row instead. The values are global, so every process does the same.
        """
        metrics = self._metrics["train" if self.model.training else "eval"]
        if metrics.get("s2t/num_loss_tokens"):
            for key in _COUNT_METRICS:
                metrics[key] = [sum(metrics[key])]
            num_loss_tokens = max(metrics["s2t/num_loss_tokens"][0], 1.0)
            metrics["s2t/silenced_ratio"] = [metrics["s2t/num_silenced"][0] / num_loss_tokens]
            metrics["s2t/candidate_ratio"] = [metrics["s2t/num_candidates"][0] / num_loss_tokens]
        for key in [k for k, values in metrics.items() if k.startswith("s2t/") and all(v != v for v in values)]:
            del metrics[key]  # v != v: NaN
        super().log(logs, start_time)

    # ------------------------------------------------------------------------------------------------------------
    # The S2T mask
    # ------------------------------------------------------------------------------------------------------------
    def _gather_1d(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate a 1-D tensor of any length across processes (a collective: every rank must call it)."""
        if self.accelerator.num_processes == 1:
            return tensor
        sizes = self.accelerator.gather(torch.tensor([tensor.numel()], device=tensor.device))  # (P,)
        # At least 1: when every rank is empty, `view(-1, 0)` below cannot infer P (all ranks still gather once).
        max_size = max(int(sizes.max()), 1)
        padded = tensor.new_zeros(max_size)
        padded[: tensor.numel()] = tensor
        gathered = self.accelerator.gather(padded).view(-1, max_size)  # (P, max_size)
        return torch.cat([row[:size] for row, size in zip(gathered, sizes.tolist(), strict=True)])

    def _build_s2t_mask(
        self,
        per_token_logps,
        entropies,
        advantages,
        loss_mask,
        completion_ids,
        log_collision=None,
        old_per_token_logps=None,
    ) -> S2TResult:
        """Apply [`s2t_mask`] with the config's τ_p, q and mode over all processes, log `s2t/*`, keep the batch.

        `log_collision` ((B, T) log Σ π², optional) and `old_per_token_logps` ((B, T), optional: the ratio of the
        gradient-norm shares; `None` = on-policy) feed only the diagnostics.
        """
        mode = "train" if self.model.training else "eval"
        result = s2t_mask(
            per_token_logps,
            entropies,
            advantages,
            loss_mask,
            prob_threshold=self.args.s2t_prob_threshold,
            entropy_quantile=self.args.s2t_entropy_quantile,
            mode=self.args.s2t_mode,
            gather=self._gather_1d,
        )
        num_loss_tokens = max(result.num_loss_tokens, 1)
        metrics = self._metrics[mode]
        metrics["s2t/silenced_ratio"].append(result.num_silenced / num_loss_tokens)
        metrics["s2t/candidate_ratio"].append(result.num_candidates / num_loss_tokens)
        metrics["s2t/entropy_threshold"].append(result.entropy_threshold)
        metrics["s2t/num_silenced"].append(float(result.num_silenced))
        metrics["s2t/num_candidates"].append(float(result.num_candidates))
        metrics["s2t/num_loss_tokens"].append(float(result.num_loss_tokens))
        metrics["s2t/num_nonfinite"].append(float(result.num_nonfinite))
        if result.num_nonfinite and not self._s2t_nonfinite_warned:
            self._s2t_nonfinite_warned = True
            warnings.warn(
                f"{result.num_nonfinite} loss tokens have a non-finite log-probability or entropy (NaN or inf): they "
                "are never S2T candidates, but this means numerical trouble upstream (logits, dtype, LM head). "
                "Counted in s2t/num_nonfinite; this warning is shown once per run.",
                stacklevel=2,
            )
        if self.args.s2t_diagnostics:
            log_ratio = None if old_per_token_logps is None else per_token_logps - old_per_token_logps
            diagnostics = s2t_diagnostic_metrics(
                result,
                per_token_logps,
                entropies,
                advantages,
                loss_mask,
                log_collision=log_collision,
                log_ratio=log_ratio,
                epsilon_low=self.epsilon_low,
                epsilon_high=self.epsilon_high,
                reduce=lambda t: self.accelerator.reduce(t, reduction="sum"),
            )
            for name, value in diagnostics.items():
                metrics[name].append(value)
        batch = S2TBatch(
            result=result,
            per_token_logps=per_token_logps.detach(),
            entropies=entropies.detach(),
            advantages=advantages.detach(),
            loss_mask=loss_mask,
            completion_ids=completion_ids,
            mode=mode,
            log_collision=log_collision,
        )
        if mode == "train":
            self.s2t_train_batches.append(batch)
        else:
            self.s2t_last_eval_batch = batch
        return result

    @staticmethod
    def _loss_mask(inputs: dict) -> torch.Tensor:
        """(B, T) int: the parent's loss mask, `completion_mask * tool_mask` (tool_mask only when present)."""
        completion_mask = inputs["completion_mask"]
        return completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]

    @staticmethod
    def _with_keep(inputs: dict, result: S2TResult, num_items_in_batch: float | torch.Tensor) -> dict:
        """A shallow copy of `inputs` whose pure loss mask (`tool_mask`) includes `keep`."""
        completion_mask = inputs["completion_mask"]
        keep = result.keep.to(completion_mask.dtype)  # (B, T)
        tool_mask = keep if "tool_mask" not in inputs else inputs["tool_mask"] * keep
        num_items = torch.as_tensor(num_items_in_batch, dtype=torch.float32, device=completion_mask.device)
        return {**inputs, "tool_mask": tool_mask, "num_items_in_batch": num_items}

    # ------------------------------------------------------------------------------------------------------------
    # Scopes "optimizer_step" and "generation_batch": p and H from a no-grad forward, the mask per update / rollout
    # ------------------------------------------------------------------------------------------------------------
    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        # The mask is built in the loss (`_mask_in_loss`): its training forward was already run by `_compute_loss` below.
        if self._s2t_forward_cache is not None:
            cached, self._s2t_forward_cache = self._s2t_forward_cache, None
            return cached
        # While the parent scores a rollout batch, its no-grad forwards of the policy (the old log-probs) also
        # return entropies, so the mask needs no second forward.
        capture = self._s2t_captured is not None and model is self.model and not torch.is_grad_enabled()
        if capture:
            kwargs["compute_entropy"] = True
        self._start_collision()
        logps, entropies, aux_loss = super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )
        self._stop_collision(logits_to_keep)
        if capture:
            self._s2t_captured.append((logps, entropies, self._s2t_log_collision))
        return logps, entropies, aux_loss

    def _start_collision(self) -> None:
        if self._s2t_collision is not None:
            self._s2t_collision.start()

    def _stop_collision(self, logits_to_keep: int) -> None:
        """Keep log Σ π² of the forward that just ran (diagnostics only; `None` when not recorded)."""
        if self._s2t_collision is not None:
            self._s2t_log_collision = self._s2t_collision.stop(logits_to_keep)

    def _policy_logps_and_entropies(self, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """One no-grad forward of the current policy over a scored batch: (B, T) log-probs and entropies (nats)."""
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)  # (B, P+T)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)  # (B, P+T)
        batch_size = (
            self.args.per_device_train_batch_size if self.model.training else self.args.per_device_eval_batch_size
        )
        self._start_collision()
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            logps, entropies, _ = super()._get_per_token_logps_and_entropies(
                self.model,
                input_ids,
                attention_mask,
                inputs["completion_ids"].size(1),
                batch_size=batch_size,
                compute_entropy=True,
                **{key: inputs.get(key) for key in _FORWARD_INPUT_KEYS},
            )
        self._stop_collision(inputs["completion_ids"].size(1))
        return logps, entropies

    @property
    def _uses_current_policy(self) -> bool:
        """Whether p and H are recomputed at the start of each optimizer update (`s2t_policy="current"`, training)."""
        return self.args.s2t_policy == "current" and self.model.training

    @property
    def _mask_in_loss(self) -> bool:
        """Whether the mask is built inside `_compute_loss` from the loss's own forward ([`s2t_values_source`]:
        scope "micro_batch", or TRL's default geometry, where that forward runs under the rollout's weights)."""
        return s2t_values_source(self.args) == "training_forward"

    def _generate_and_score_completions(self, inputs):
        if self._mask_in_loss:
            return super()._generate_and_score_completions(inputs)
        rollout_values = not self._uses_current_policy
        self._s2t_captured = [] if rollout_values else None
        try:
            batch = super()._generate_and_score_completions(inputs)
        finally:
            captured, self._s2t_captured = self._s2t_captured, None
        batch = self._with_s2t_inputs(batch)
        if rollout_values:
            batch.update(
                zip((_ROLLOUT_LOGPS, _ROLLOUT_ENTROPIES, _ROLLOUT_COLLISION), self._rollout_values(batch, captured))
            )
        return batch

    def _with_s2t_inputs(self, batch: dict) -> dict:
        """A shallow copy of a scored batch that also holds its loss mask and tool mask before silencing."""
        return {**batch, _LOSS_MASK: self._loss_mask(batch), _TOOL_MASK: batch.get("tool_mask")}

    def _rollout_values(self, batch: dict, captured=()) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(B, T) log-probs, entropies (nats) and log Σ π² (or `None`) of the rollout policy for a scored batch.

        Reuses TRL's old-log-prob forward when it ran (vLLM IS correction, steps_per_generation > GA, num_iterations
        > 1), recognised by tensor identity among the `captured` forwards; otherwise runs exactly one no-grad forward.
        """
        old_logps = batch.get("old_per_token_logps")
        reused = next(((ent, col) for logps, ent, col in captured if logps is old_logps), None)
        if reused is not None:
            return old_logps, *reused
        logps, entropies = self._policy_logps_and_entropies(batch)
        return logps, entropies, self._s2t_log_collision

    def _mask_values(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """p and H the mask of `batch` is built from: the current weights (policy "current", one no-grad forward)
        or the stored rollout values."""
        if self._uses_current_policy:
            logps, entropies = self._policy_logps_and_entropies(batch)
            return logps, entropies, self._s2t_log_collision
        return batch[_ROLLOUT_LOGPS], batch[_ROLLOUT_ENTROPIES], batch[_ROLLOUT_COLLISION]

    def _apply_s2t_to_micro_batches(self, micro_batches: list[dict]) -> S2TResult:
        """Build one S2T mask over several scored micro-batches (one τ_h over all their candidates, all processes) and
        write each micro-batch's keep mask into its `tool_mask`, in place.

        Args:
            micro_batches (`list[dict]`): batches from one rollout batch (same completion length T), each holding the
                keys added by `_generate_and_score_completions` (loss mask, tool mask and, policy "rollout", p and H).

        Returns:
            [`S2TResult`]: the mask of the concatenated (ΣB, T) micro-batches, with global counts.
        """
        values = [self._mask_values(batch) for batch in micro_batches]
        log_collisions = [v[2] for v in values]
        old_logps = [batch.get("old_per_token_logps") for batch in micro_batches]
        result = self._build_s2t_mask(
            torch.cat([v[0] for v in values]),  # (ΣB, T)
            torch.cat([v[1] for v in values]),  # (ΣB, T)
            torch.cat([batch["advantages"] for batch in micro_batches]),  # (ΣB,)
            torch.cat([batch[_LOSS_MASK] for batch in micro_batches]),  # (ΣB, T)
            torch.cat([batch["completion_ids"] for batch in micro_batches]),  # (ΣB, T)
            log_collision=None if None in log_collisions else torch.cat(log_collisions),
            old_per_token_logps=(
                torch.cat(old_logps) if self._uses_current_policy and None not in old_logps else None
            ),
        )
        keeps = result.keep.split([batch["completion_ids"].size(0) for batch in micro_batches])  # [(B_i, T)]
        for batch, keep in zip(micro_batches, keeps, strict=True):
            keep = keep.to(batch["completion_mask"].dtype)
            batch["tool_mask"] = keep if batch[_TOOL_MASK] is None else batch[_TOOL_MASK] * keep
        return result

    def _apply_s2t(self, batch: dict) -> dict:
        """Build the S2T mask of one scored batch (τ_h over its candidates on all processes).

        Used for evaluation batches (no buffering, no accumulation) and by tests on hand-built batches.

        Args:
            batch (`dict`): the output of `_generate_and_score_completions` (prompt/completion ids and masks,
                advantages (B,), optional old_per_token_logps (B, T), tool_mask (B, T), multimodal inputs).

        Returns:
            `dict`: a shallow copy with `tool_mask` including `keep` and `num_items_in_batch` = the global kept-token
            count of the batch.
        """
        batch = dict(batch) if _LOSS_MASK in batch else self._with_s2t_inputs(batch)
        if _ROLLOUT_LOGPS not in batch and not self._uses_current_policy:
            batch.update(zip((_ROLLOUT_LOGPS, _ROLLOUT_ENTROPIES, _ROLLOUT_COLLISION), self._rollout_values(batch)))
        result = self._apply_s2t_to_micro_batches([batch])
        batch["num_items_in_batch"] = torch.tensor(float(result.num_kept), device=batch["completion_mask"].device)
        return batch

    def _prepare_inputs(self, generation_batch):
        if not self.model.training:  # evaluation: one batch, no buffering, no accumulation
            inputs = super()._prepare_inputs(generation_batch)
            return inputs if self._mask_in_loss else self._apply_s2t(inputs)
        buffered_before = self._buffered_inputs
        inputs = super()._prepare_inputs(generation_batch)
        micro_batches = self._buffered_inputs
        steps_per_generation, grad_accum = len(micro_batches), self.args.gradient_accumulation_steps
        exact = steps_per_generation % grad_accum == 0  # every optimizer update lies inside one rollout batch
        index = self._step % steps_per_generation  # the micro-batch the parent returned
        if micro_batches is not buffered_before or index == 0:  # a new rollout batch, or a new pass over it
            self._s2t_built_windows = set()
            self.s2t_train_batches = []  # the record of one pass: bounded memory in every scope
        if self._mask_in_loss:
            if micro_batches is not buffered_before and exact:
                self._set_optimizer_step_normalisers(micro_batches)  # loss-token counts: the mask is built later
            return inputs
        # The set τ_h is taken over: one optimizer update (GA micro-batches), or the whole rollout batch.
        window = grad_accum if self.args.s2t_scope == "optimizer_step" and exact else steps_per_generation
        if index // window not in self._s2t_built_windows:  # the update's (or rollout's) first micro-step
            self._s2t_built_windows.add(index // window)
            start = index // window * window
            group = micro_batches[start : start + window]
            result = self._apply_s2t_to_micro_batches(group)
            if exact:
                self._set_optimizer_step_normalisers(group)
            else:  # TRL's estimate: the rollout batch's kept count, scaled by GA / steps_per_generation
                for batch in group:
                    batch["num_items_in_batch"] = torch.tensor(
                        float(result.num_kept), device=inputs["advantages"].device
                    )
        return inputs

    def _set_optimizer_step_normalisers(self, micro_batches: list[dict]) -> None:
        """Set `num_items_in_batch` of each micro-batch so that the parent's `dapo`/`cispo`/`vespo` normaliser equals
        the global count of loss tokens (kept tokens, once the mask is in `tool_mask`) of its optimizer update.

        The parent divides by `num_items_in_batch / num_processes * GA / steps_per_generation`; micro-batches
        [w*GA, (w+1)*GA) of `micro_batches` on every process form update w (`micro_batches` starts at an update
        boundary and holds whole updates). One all-reduce per call.
        """
        grad_accum = self.args.gradient_accumulation_steps
        local = torch.stack([self._loss_mask(batch).sum() for batch in micro_batches]).float()  # (n,)
        local = local.view(len(micro_batches) // grad_accum, grad_accum).sum(dim=1)  # (n/GA,)
        global_counts = self.accelerator.reduce(local, reduction="sum")  # (n/GA,)
        for index, batch in enumerate(micro_batches):
            batch["num_items_in_batch"] = (
                global_counts[index // grad_accum] * self.args.steps_per_generation / grad_accum
            )

    # ------------------------------------------------------------------------------------------------------------
    # The loss
    # ------------------------------------------------------------------------------------------------------------
    def _compute_loss(self, model, inputs):
        if not self._mask_in_loss:
            return super()._compute_loss(model, inputs)

        # Scope "micro_batch", or TRL's default geometry (one micro-batch per update, scored under the rollout's
        # weights): run the training forward here, build the mask from its detached values, then hand the same
        # forward to the parent's loss (see `_get_per_token_logps_and_entropies`): no extra forward.
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        forward = self._get_per_token_logps_and_entropies(
            model,
            torch.cat([prompt_ids, completion_ids], dim=1),  # (B, P+T)
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1),  # (B, P+T)
            completion_ids.size(1),
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            **{key: inputs.get(key) for key in _FORWARD_INPUT_KEYS},
        )
        per_token_logps, entropies, _ = forward
        result = self._build_s2t_mask(
            per_token_logps.detach(),
            entropies.detach(),
            inputs["advantages"],
            self._loss_mask(inputs),
            completion_ids,
            log_collision=self._s2t_log_collision,
            old_per_token_logps=inputs.get("old_per_token_logps"),
        )
        # Normaliser (the parent divides by num_items / num_processes, times GA / steps_per_generation in training):
        # in evaluation and with GA = 1 the micro-step is the whole batch / update, so its exact kept count; with
        # GA > 1 the update's loss-token count set by `_prepare_inputs` (later micro-steps' masks are unknown yet).
        if not self.model.training:
            num_items = result.num_kept
        elif self.args.gradient_accumulation_steps == 1:
            num_items = result.num_kept * self.args.steps_per_generation
        else:
            num_items = inputs["num_items_in_batch"]
        self._s2t_forward_cache = forward
        try:
            return super()._compute_loss(model, self._with_keep(inputs, result, num_items))
        finally:
            self._s2t_forward_cache = None
