"""`STAPOTrainer`: TRL's `GRPOTrainer` with the S2T mask of STAPO in the loss.

Only *which tokens count* changes: the keep mask of [`s2t_mask`] joins the loss mask in the numerator and the
denominator of the parent's loss, and the token-count normaliser of `dapo`/`cispo`/`vespo` becomes the global count
of kept tokens. The parent's `_compute_loss` is called, never copied, so every other GRPO option keeps working.
"""

from __future__ import annotations

import textwrap
import warnings
from dataclasses import dataclass

import torch
from accelerate.utils import is_peft_model
from trl import GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing

from .config import STAPOConfig
from .diagnostics import CollisionProbabilityRecorder, s2t_diagnostic_metrics
from .s2t import S2TResult, s2t_mask
from .vllm_support import check_vllm_args, install_cpu_colocate_weight_sync


# Loss types whose normaliser is `num_items_in_batch` (TRL's global token count of the generation batch).
_GLOBAL_TOKEN_MEAN_LOSSES = ("dapo", "cispo", "vespo")
# Loss types without a token-count denominator: the mask removes tokens from the numerator only.
_CONSTANT_DENOMINATOR_LOSSES = ("dr_grpo", "luspo")
_KNOWN_LOSSES = ("dapo", "cispo", "vespo", "grpo", "sapo", "bnpo", "dr_grpo", "luspo")
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


@dataclass
class S2TBatch:
    """The inputs and output of the last S2T mask built on this process (for diagnostics callbacks).

    Attributes:
        result ([`S2TResult`]): the mask and its global counts.
        per_token_logps (`torch.Tensor`): float, (B, T), detached log-probs of the sampled tokens (nats).
        entropies (`torch.Tensor`): float, (B, T), detached entropies (nats).
        advantages (`torch.Tensor`): float, (B,) or (B, 1).
        loss_mask (`torch.Tensor`): int, (B, T), the loss mask before silencing.
        completion_ids (`torch.Tensor`): long, (B, T).
        mode (`str`): "train" or "eval".
        log_collision (`torch.Tensor`, *optional*): float, (B, T), log Σ_v π_v² (nats) of the same forward, when the
            trainer records it (`STAPOConfig.s2t_diagnostics`).
    """

    result: S2TResult
    per_token_logps: torch.Tensor
    entropies: torch.Tensor
    advantages: torch.Tensor
    loss_mask: torch.Tensor
    completion_ids: torch.Tensor
    mode: str
    log_collision: torch.Tensor | None = None


class STAPOTrainer(GRPOTrainer):
    r"""
    Trainer for [STAPO](https://huggingface.co/papers/2602.15620): GRPO whose loss silences rare spurious tokens.

    A token is silenced when its completion has a positive advantage, it was sampled with probability below τ_p and
    its entropy is below the q-quantile τ_h of such candidates over the batch (Sec. 3, the S2T rule). Silenced tokens
    leave the numerator *and* the denominator of the loss ("dynamic valid-token averaging"). Everything else is
    [`~trl.GRPOTrainer`]: the arguments, generation (transformers, vLLM server/colocate), rewards, PEFT, DeepSpeed.

    How the mask reaches the parent's loss: it is multiplied into `inputs["tool_mask"]`, which TRL reads only as a
    loss mask (`completion_mask` is also the attention mask and is never edited), and `inputs["num_items_in_batch"]`
    is replaced by the global count of kept tokens.

    Normalisation per `loss_type` (the keep mask joins the loss mask everywhere):
    - `dapo`, `cispo`, `vespo`: kept-token sum over the optimizer step divided by the global kept-token count of the
      optimizer step (all processes, all gradient-accumulation micro-steps). With `s2t_scope="generation_batch"`
      and `steps_per_generation` a multiple of `gradient_accumulation_steps`, the count is exact per optimizer step
      (TRL itself scales the generation-batch count by GA/steps_per_generation; the two agree when
      `steps_per_generation == gradient_accumulation_steps`, TRL's default). Otherwise TRL's scaling is kept.
      With `s2t_scope="micro_batch"` the count is that of the micro-step (all processes), and the optimizer step
      averages the micro-step means.
    - `grpo`, `sapo`: per-sequence mean over kept tokens; `bnpo`: per-micro-batch mean over kept tokens.
    - `dr_grpo`, `luspo`: constant denominators by design (B x max_completion_length; sequence sums): silenced
      tokens leave the numerator only. A warning says so.

    Metrics (reduced over all processes) under `s2t/`: `silenced_ratio` (silenced / loss tokens),
    `candidate_ratio` (candidates / loss tokens), `entropy_threshold` (τ_h, nats; NaN when there is no candidate,
    dropped by `log()`), `num_silenced`, `num_candidates`. TRL's `entropy` and `clip_ratio/*` are computed by the
    parent over the kept tokens. With `args.s2t_diagnostics` (on by default) also
    `entropy_p10`/`p50`/`p80`/`p95`, `silenced_prob_mean`, `silenced_entropy_mean`, `grad_norm_share_candidates`
    and `grad_norm_share_silenced` (see [`~stapo_trl.diagnostics.s2t_diagnostic_metrics`]); for them the policy's
    fused LM head also returns log Σ_v π_v² (same pass over the vocabulary). Per-token records:
    [`~stapo_trl.diagnostics.SpuriousTokenLogger`].

    Args:
        model, reward_funcs, train_dataset, ...: as [`~trl.GRPOTrainer`]; `model` may also be a built-in name
            (`"builtin:tiny-math"`, `"builtin:tiny-random"`), built into its cache on first use.
        args ([`STAPOConfig`], *optional*): defaults to `STAPOConfig("<model>-STAPO")`.

    Raises:
        TypeError: if `args` is not an [`STAPOConfig`].
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

    def __init__(self, model, reward_funcs=None, args: STAPOConfig | None = None, *pargs, **kwargs):
        if isinstance(model, str) and model.startswith("builtin:"):
            from .builtin import resolve_model_path

            model = resolve_model_path(model)  # the built-in demo models, built into their cache on first use
        if args is None:
            model_name = model if isinstance(model, str) else model.config._name_or_path
            args = STAPOConfig(f"{str(model_name).split('/')[-1]}-STAPO")
        if not isinstance(args, STAPOConfig):
            raise TypeError(
                f"STAPOTrainer needs `args` to be a stapo_trl.STAPOConfig, got {type(args).__name__}. "
                "Build it with STAPOConfig(...) (it accepts every GRPOConfig field)."
            )
        if args.loss_type not in _KNOWN_LOSSES:
            raise ValueError(
                f"loss_type={args.loss_type!r} is not supported by STAPOTrainer: its normalisation is unknown to "
                f"stapo_trl, so the S2T mask could not be applied to it. Supported: {list(_KNOWN_LOSSES)}."
            )
        _warn_untested_combinations(args)
        check_vllm_args(args)  # vllm_mode='server' on a CPU-only run: refused before TRL waits for a server
        self._s2t_captured: list[tuple[torch.Tensor, ...]] | None = None
        self._s2t_forward_cache: tuple | None = None
        self.s2t_last_batch: S2TBatch | None = None
        self._s2t_log_collision: torch.Tensor | None = None  # log Σ π² of the last policy forward (diagnostics)
        super().__init__(model, reward_funcs, args, *pargs, **kwargs)
        install_cpu_colocate_weight_sync(self)  # vLLM's CPU backend repacks weights: sync through its reload path
        self._s2t_collision = None
        if self.args.s2t_diagnostics:
            self._s2t_collision = CollisionProbabilityRecorder(
                self.model.get_base_model() if is_peft_model(self.model) else self.model,
                temperature=self.temperature,
                cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32,
            )

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """TRL's card (names STAPO, links the paper, its BibTeX) plus the `s2t_*` values and the base model."""
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        from .model_card import add_stapo_section

        add_stapo_section(self)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's `log`, without the `s2t/` metrics that are undefined (NaN) at every step since the last log.

        TRL turns an all-NaN metric into `None` (which breaks `Trainer.log_metrics` on the end-of-training summary,
        and is not a number for trackers). `s2t/entropy_threshold` is NaN when there is no candidate,
        `s2t/silenced_*_mean` when nothing is silenced: such keys are left out of that log row instead. The values
        are global (reduced over processes), so every process drops the same keys.
        """
        metrics = self._metrics["train" if self.model.training else "eval"]
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
        self.s2t_last_batch = S2TBatch(
            result=result,
            per_token_logps=per_token_logps.detach(),
            entropies=entropies.detach(),
            advantages=advantages.detach(),
            loss_mask=loss_mask,
            completion_ids=completion_ids,
            mode=mode,
            log_collision=log_collision,
        )
        return result

    @staticmethod
    def _loss_mask(inputs: dict) -> torch.Tensor:
        """(B, T) int: the parent's loss mask, `completion_mask * tool_mask` (tool_mask only when present)."""
        completion_mask = inputs["completion_mask"]
        return completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]

    @staticmethod
    def _with_keep(inputs: dict, result: S2TResult, num_items_in_batch: float) -> dict:
        """A shallow copy of `inputs` whose pure loss mask (`tool_mask`) includes `keep`."""
        completion_mask = inputs["completion_mask"]
        keep = result.keep.to(completion_mask.dtype)  # (B, T)
        tool_mask = keep if "tool_mask" not in inputs else inputs["tool_mask"] * keep
        num_items = torch.tensor(float(num_items_in_batch), device=completion_mask.device)
        return {**inputs, "tool_mask": tool_mask, "num_items_in_batch": num_items}

    # ------------------------------------------------------------------------------------------------------------
    # Scope "generation_batch": the mask is built once per generation batch and stored with it
    # ------------------------------------------------------------------------------------------------------------
    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        # Scope "micro_batch": the loss's training forward was already run by `_compute_loss` below; hand it over.
        if self._s2t_forward_cache is not None:
            cached, self._s2t_forward_cache = self._s2t_forward_cache, None
            return cached
        # Scope "generation_batch": while the parent scores a generation batch, its no-grad forwards of the policy
        # (the old log-probs) also return entropies, so the mask needs no second forward.
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

    def _generate_and_score_completions(self, inputs):
        if self.args.s2t_scope != "generation_batch":
            return super()._generate_and_score_completions(inputs)

        self._s2t_captured = []
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            captured, self._s2t_captured = self._s2t_captured, None
        return self._apply_s2t(output, captured)

    def _apply_s2t(self, batch: dict, captured: list[tuple[torch.Tensor, ...]] = ()) -> dict:
        """Build the S2T mask of a scored generation batch and return the batch with it in the loss mask.

        Args:
            batch (`dict`): the output of `_generate_and_score_completions` (prompt/completion ids and masks,
                advantages (B,), optional old_per_token_logps (B, T), tool_mask (B, T), multimodal inputs).
            captured (`list`): (log-probs, entropies, log Σ π² or None) of the no-grad policy forwards run while
                scoring.

        Returns:
            `dict`: a shallow copy with `tool_mask` including `keep` and `num_items_in_batch` = the global kept-token
            count of the batch (refined per optimizer step by `_prepare_inputs` in training).
        """
        # Reuse TRL's old-log-prob forward when it ran (vLLM IS correction, steps_per_generation > GA, num_iterations
        # > 1); otherwise run exactly one no-grad forward of the current policy.
        old_logps = batch.get("old_per_token_logps")
        reused = next(((ent, col) for logps, ent, col in captured if logps is old_logps), None)
        if reused is not None:
            per_token_logps = old_logps
            entropies, log_collision = reused
        else:
            per_token_logps, entropies = self._policy_logps_and_entropies(batch)
            log_collision = self._s2t_log_collision

        result = self._build_s2t_mask(
            per_token_logps,
            entropies,
            batch["advantages"],
            self._loss_mask(batch),
            batch["completion_ids"],
            log_collision=log_collision,
        )
        return self._with_keep(batch, result, result.num_kept)

    def _prepare_inputs(self, generation_batch):
        buffered_before = self._buffered_inputs
        inputs = super()._prepare_inputs(generation_batch)
        if self.model.training and self._buffered_inputs is not buffered_before and self._exact_step_normaliser:
            self._set_optimizer_step_normalisers(self._buffered_inputs)
        return inputs

    @property
    def _exact_step_normaliser(self) -> bool:
        """Whether each optimizer step's kept-token count is computed exactly from the buffered generation batch."""
        return (
            self.args.s2t_scope == "generation_batch"
            and self.loss_type in _GLOBAL_TOKEN_MEAN_LOSSES
            and self.args.steps_per_generation % self.args.gradient_accumulation_steps == 0
        )

    def _set_optimizer_step_normalisers(self, micro_batches: list[dict]) -> None:
        """Set `num_items_in_batch` of each buffered micro-batch so that the parent's `dapo` normaliser equals the
        global kept-token count of the micro-batch's optimizer step.

        The parent divides by `num_items_in_batch / num_processes * GA / steps_per_generation`; micro-batches
        [w*GA, (w+1)*GA) of every process form optimizer step w. One all-reduce per generation batch.
        """
        steps_per_generation = len(micro_batches)
        grad_accum = self.args.gradient_accumulation_steps
        local_kept = torch.stack([self._loss_mask(batch).sum() for batch in micro_batches]).float()  # (S,)
        local_kept = local_kept.view(steps_per_generation // grad_accum, grad_accum).sum(dim=1)  # (S/GA,)
        global_kept = self.accelerator.reduce(local_kept, reduction="sum")  # (S/GA,)
        for index, batch in enumerate(micro_batches):
            batch["num_items_in_batch"] = global_kept[index // grad_accum] * steps_per_generation / grad_accum

    # ------------------------------------------------------------------------------------------------------------
    # The loss
    # ------------------------------------------------------------------------------------------------------------
    def _compute_loss(self, model, inputs):
        if self.args.s2t_scope != "micro_batch":
            return super()._compute_loss(model, inputs)

        # Scope "micro_batch": run the training forward here, build the mask from its detached values, then hand
        # the same forward to the parent's loss (see `_get_per_token_logps_and_entropies`): no extra forward.
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
        # The parent divides by num_items / num_processes * GA / steps_per_generation in training (by
        # num_items / num_processes in eval); scale the micro-step's kept count so that this equals
        # kept / num_processes * GA, i.e. each optimizer step averages the micro-step token means.
        num_items = result.num_kept * (self.args.steps_per_generation if self.model.training else 1)
        self._s2t_forward_cache = forward
        try:
            return super()._compute_loss(model, self._with_keep(inputs, result, num_items))
        finally:
            self._s2t_forward_cache = None


def _warn_untested_combinations(args: STAPOConfig) -> None:
    """Warn once, at construction, for settings the paper never ran or where the mask cannot renormalise."""
    if args.s2t_mode == "off":
        return
    if args.loss_type in _CONSTANT_DENOMINATOR_LOSSES:
        warnings.warn(
            f"loss_type={args.loss_type!r} has a constant denominator by design: silenced tokens leave the numerator "
            "only, the loss is not renormalised over kept tokens. STAPO's valid-token averaging needs 'dapo' "
            "(paper), 'bnpo', 'grpo', 'cispo' or 'vespo'.",
            stacklevel=3,
        )
    if args.top_entropy_quantile < 1.0:
        warnings.warn(
            f"top_entropy_quantile={args.top_entropy_quantile} together with the S2T mask was never run in the "
            "paper: both masks apply (the high-entropy quantile is taken over kept tokens) and TRL keeps its own "
            "denominator for the entropy mask.",
            stacklevel=3,
        )
    if args.importance_sampling_level == "sequence":
        warnings.warn(
            "importance_sampling_level='sequence' with the S2T mask was never run in the paper: the sequence-level "
            "log-ratio is then averaged over kept tokens only.",
            stacklevel=3,
        )
    if args.s2t_scope == "generation_batch" and args.loss_type in _GLOBAL_TOKEN_MEAN_LOSSES:
        steps, grad_accum = args.steps_per_generation, args.gradient_accumulation_steps
        if steps % grad_accum != 0:
            warnings.warn(
                f"steps_per_generation={steps} is not a multiple of gradient_accumulation_steps={grad_accum}: an "
                "optimizer step spans generation batches, so its kept-token count is estimated as TRL does (the "
                "generation batch's kept count x GA / steps_per_generation) instead of counted exactly.",
                stacklevel=3,
            )
