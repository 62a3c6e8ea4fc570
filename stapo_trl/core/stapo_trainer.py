# Copyright 2026 The stapo_trl Authors. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

"""`STAPOTrainer`: TRL's `GRPOTrainer` with the S2T mask of STAPO in the loss."""

from __future__ import annotations

import textwrap
import warnings

import torch
from trl import GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import get_config_model_id

from .s2t import S2TResult, s2t_mask
from .stapo_config import STAPOConfig, s2t_warnings


# The multimodal inputs that GRPOTrainer._compute_loss forwards to `_get_per_token_logps_and_entropies`.
_FORWARD_KEYS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes")
_FORWARD_KEYS += ("num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")


class STAPOTrainer(GRPOTrainer):
    r"""
    Trainer for [STAPO](https://huggingface.co/papers/2602.15620): GRPO whose loss silences rare spurious tokens.

    A token is silenced when its completion has a positive advantage, its sampled probability is below tau_p and its
    entropy is below tau_h, the q-quantile of such candidates' entropies over one optimizer update (the paper's
    mini-batch: `gradient_accumulation_steps` micro-batches on all processes), taken before the update's first
    backward. Silenced tokens leave the numerator and the denominator: each update is divided by its global kept-token
    count (`dapo`, `cispo`, `vespo`; per sequence or micro-batch for `grpo`, `sapo`, `bnpo`). Only the loss differs
    from [`~trl.GRPOTrainer`], whose `_compute_loss` is called, not copied.

    p and H are the rollout policy's (the weights that sampled the completions): TRL's no-grad old-log-prob forward
    where TRL runs one (`steps_per_generation` > GA, `num_iterations` > 1, vLLM importance sampling); the loss's own
    forward, detached, where each micro-step trains on a fresh rollout (`steps_per_generation` = `num_iterations` = 1,
    TRL's default); otherwise one no-grad forward per rollout batch. When `steps_per_generation` is not a multiple of
    GA an update spans rollout batches: tau_h is then taken per rollout batch with TRL's normalizer (warned).

    Overrides, each needed by the exact path (TRL 1.16 private names used, all in this class: these four methods,
    `_buffered_inputs`, `_step`, `_metrics`, `aux_loss_enabled`, and the batch keys below):
    - `_generate_and_score_completions` keeps the rollout's entropies (and log-probs) with the batch, so that TRL's
      shuffle and split carry them with their rows.
    - `_get_per_token_logps_and_entropies` asks TRL's old-log-prob forward for entropies too, and hands the loss's
      forward back to the parent when `_compute_loss` already ran it.
    - `_prepare_inputs` builds each update's mask at its first micro-step. The mask reaches the parent's loss as
      `tool_mask` (a loss mask only; `completion_mask` is also the attention mask), the normalizer as
      `num_items_in_batch`, set so that TRL's `num_items / num_processes * GA / steps_per_generation` is the update's
      kept-token count / num_processes.
    - `_compute_loss` builds the mask from the loss's own forward where that forward is the rollout policy's, and in
      evaluation. `_compute_s2t_mask` is the hook for subclasses (token records, other rules).

    Args:
        model, reward_funcs, train_dataset, eval_dataset, ...: as [`~trl.GRPOTrainer`].
        args ([`STAPOConfig`], *optional*): defaults to `STAPOConfig("<model>-STAPO")`.

    Raises:
        TypeError: `args` is not a [`STAPOConfig`].
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
        if args is None:
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = STAPOConfig(f"{model_name.split('/')[-1]}-STAPO")
        if not isinstance(args, STAPOConfig):
            raise TypeError(f"STAPOTrainer needs `args` to be a STAPOConfig, got {type(args).__name__}.")
        self._s2t_rollout_forwards: list | None = None  # TRL's no-grad policy forwards while a rollout is scored
        self._s2t_loss_forward: tuple | None = None  # the loss's forward, run by `_compute_loss` for the parent
        super().__init__(model, reward_funcs, args, *pargs, **kwargs)
        for message in s2t_warnings(self.args):
            warnings.warn(message, stacklevel=2)

    @property
    def _s2t_mask_in_loss(self) -> bool:
        """Whether the mask comes from the loss's own forward (evaluation; `steps_per_generation` = iterations = 1)."""
        return not self.model.training or self.args.steps_per_generation == self.num_iterations == 1

    def _gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate a 1-D tensor of finite floats over processes (a collective): NaN pads, then is dropped."""
        padded = self.accelerator.pad_across_processes(tensor, pad_index=float("nan"))
        gathered = self.accelerator.gather(padded)
        return gathered[~gathered.isnan()]

    def _compute_s2t_mask(self, per_token_logps, entropies, advantages, loss_mask, completion_ids) -> S2TResult:
        """The S2T mask of one optimizer update (or evaluation batch), over all processes: the hook for subclasses.

        Each process passes its rows: (B, T) detached log-probs and entropies (nats), (B,) advantages, the (B, T) loss
        mask and completion ids. Every process must run the same collectives.
        """
        return s2t_mask(
            per_token_logps,
            entropies,
            advantages,
            loss_mask,
            prob_threshold=self.args.s2t_prob_threshold,
            entropy_quantile=self.args.s2t_entropy_quantile,
            mode=self.args.s2t_mode,
            gather=self._gather,
        )

    def _s2t_result(self, per_token_logps, entropies, advantages, loss_mask, completion_ids) -> S2TResult:
        """[`_compute_s2t_mask`], and its global counts logged under `s2t/`."""
        result = self._compute_s2t_mask(per_token_logps, entropies, advantages, loss_mask, completion_ids)
        metrics = self._metrics["train" if self.model.training else "eval"]
        num_loss_tokens = max(result.num_loss_tokens, 1)
        metrics["s2t/silenced_ratio"].append(result.num_silenced / num_loss_tokens)
        metrics["s2t/candidate_ratio"].append(result.num_candidates / num_loss_tokens)
        metrics["s2t/entropy_threshold"].append(result.entropy_threshold)  # NaN without candidates: TRL skips it
        for name in ("num_silenced", "num_candidates", "num_loss_tokens", "num_nonfinite"):
            metrics[f"s2t/{name}"].append(float(getattr(result, name)))
        return result

    @staticmethod
    def _loss_mask(inputs: dict) -> torch.Tensor:
        """The (B, T) loss mask before silencing: `completion_mask`, times `tool_mask` when present."""
        tool_mask = inputs.get("tool_mask")
        return inputs["completion_mask"] if tool_mask is None else inputs["completion_mask"] * tool_mask

    @staticmethod
    def _with_keep(inputs: dict, keep: torch.Tensor) -> dict:
        """A shallow copy of `inputs` whose `tool_mask` also holds the (B, T) bool keep mask."""
        keep = keep.to(inputs["completion_mask"].dtype)
        tool_mask = inputs.get("tool_mask")
        return {**inputs, "tool_mask": keep if tool_mask is None else tool_mask * keep}

    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        if self._s2t_loss_forward is not None:  # `_compute_loss` ran the loss's forward already
            forward, self._s2t_loss_forward = self._s2t_loss_forward, None
            return forward
        scoring = self._s2t_rollout_forwards is not None and model is self.model and not torch.is_grad_enabled()
        if scoring:
            kwargs["compute_entropy"] = True
        forward = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        if scoring:
            self._s2t_rollout_forwards.append(forward)
        return forward

    def _generate_and_score_completions(self, inputs):
        if self._s2t_mask_in_loss:
            return super()._generate_and_score_completions(inputs)
        self._s2t_rollout_forwards = []
        try:
            batch = super()._generate_and_score_completions(inputs)
            forwards = self._s2t_rollout_forwards
        finally:
            self._s2t_rollout_forwards = None
        old_logps = batch.get("old_per_token_logps")
        entropies = next((forward[1] for forward in forwards if forward[0] is old_logps), None)
        if entropies is None:  # TRL ran no old-log-prob forward: one no-grad forward of the rollout batch
            input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)  # (B, P+T)
            attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)  # (B, P+T)
            with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
                batch["s2t_logps"], entropies, _ = super()._get_per_token_logps_and_entropies(
                    self.model,
                    input_ids,
                    attention_mask,
                    batch["completion_ids"].size(1),
                    batch_size=self.args.per_device_train_batch_size,
                    compute_entropy=True,
                    **{key: batch.get(key) for key in _FORWARD_KEYS},
                )
        batch["s2t_entropies"] = entropies
        return batch

    def _prepare_inputs(self, generation_batch):
        inputs = super()._prepare_inputs(generation_batch)
        if self._s2t_mask_in_loss:
            return inputs
        micro_batches = self._buffered_inputs  # the rollout batch, shuffled and split into steps_per_generation
        steps_per_generation, grad_accum = len(micro_batches), self.args.gradient_accumulation_steps
        window = grad_accum if steps_per_generation % grad_accum == 0 else steps_per_generation
        index = self._step % steps_per_generation
        start = index - index % window
        if index == start or "s2t_keep" not in inputs:  # the update's first micro-step (or a resume inside one)
            update = micro_batches[start : start + window]
            result = self._s2t_result(
                torch.cat([b.get("s2t_logps", b.get("old_per_token_logps")) for b in update]),  # (ΣB, T)
                torch.cat([b["s2t_entropies"] for b in update]),  # (ΣB, T)
                torch.cat([b["advantages"] for b in update]),  # (ΣB,)
                torch.cat([self._loss_mask(b) for b in update]),  # (ΣB, T)
                torch.cat([b["completion_ids"] for b in update]),  # (ΣB, T)
            )
            num_items = torch.tensor(result.num_kept * steps_per_generation / window, dtype=torch.float32)
            for batch, keep in zip(update, result.keep.split([b["advantages"].size(0) for b in update]), strict=True):
                batch["s2t_keep"], batch["num_items_in_batch"] = keep, num_items.to(keep.device)
        return self._with_keep(inputs, inputs["s2t_keep"])

    def _compute_loss(self, model, inputs):
        if not self._s2t_mask_in_loss:
            return super()._compute_loss(model, inputs)
        completion_ids = inputs["completion_ids"]
        forward = self._get_per_token_logps_and_entropies(
            model,
            torch.cat([inputs["prompt_ids"], completion_ids], dim=1),  # (B, P+T)
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1),  # (B, P+T)
            completion_ids.size(1),
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            **{key: inputs.get(key) for key in _FORWARD_KEYS},
        )
        result = self._s2t_result(
            forward[0].detach(), forward[1].detach(), inputs["advantages"], self._loss_mask(inputs), completion_ids
        )
        inputs = self._with_keep(inputs, result.keep)
        inputs["num_items_in_batch"] = torch.tensor(float(result.num_kept), device=completion_ids.device)
        self._s2t_loss_forward = forward
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._s2t_loss_forward = None
