# Copyright 2026 The stapo_trl Authors. All rights reserved.
# SPDX-License-Identifier: Apache-2.0

"""`STAPOTrainer`: TRL's `GRPOTrainer` with the S2T mask of STAPO in the loss."""

from __future__ import annotations

import copy
import math
import os
import sys
import warnings
from dataclasses import asdict

import torch
import trl
from packaging.specifiers import SpecifierSet
from trl import GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import get_config_model_id

from .s2t import S2TResult, s2t_mask
from .stapo_config import NUM_ITEMS_LOSSES, STAPOConfig, s2t_path, s2t_settings, s2t_settings_line, s2t_warnings


SUPPORTED_TRL = ">=1.9.1,!=1.15.0,<=1.16.0"  # the TRL versions the tests ran; another one is warned at construction
_COUNTS = ("s2t/num_silenced", "s2t/num_candidates", "s2t/num_loss_tokens", "s2t/num_nonfinite")
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # warnings skip its frames
# The multimodal inputs TRL's `_compute_loss` passes to its forward in every release of SUPPORTED_TRL
_FORWARD_KEYS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
                 "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")  # fmt: skip


class STAPOTrainer(GRPOTrainer):
    r"""
    Trainer for [STAPO](https://huggingface.co/papers/2602.15620): GRPO whose loss silences rare spurious tokens.

    The S2T rule (Sec. 3) silences the tokens of a positive-advantage completion sampled with a probability below
    tau_p at a position whose entropy (nats) is below tau_h, the q-quantile of such candidates' entropies over the
    optimizer update on all processes; p and H are the rollout policy's. Only the loss differs from
    [`~trl.GRPOTrainer`]: its `_compute_loss` is called, not copied (`docs/stapo.md`). `stapo_trl.STAPOTrainer` (what
    `from stapo_trl import STAPOTrainer` gives) subclasses this one.

    `args` may be any `GRPOConfig`: its S2T fields where it has them (a [`STAPOConfig`]), else the paper's values,
    said in one warning at construction with what differs from the paper's objective; each GRPO feature the mask
    changes is warned. Raises `ValueError` for a bad S2T value or a setting with which the installed TRL trains past
    the mask, naming the field; `RuntimeError` for a TRL whose loss normalizer or rollout scoring is not the one STAPO
    is built on. Logs `s2t/silenced_ratio`, `s2t/candidate_ratio`, `s2t/entropy_threshold` (tau_h, nats) and the
    global counts `s2t/num_silenced`, `s2t/num_candidates`, `s2t/num_loss_tokens`, `s2t/num_nonfinite`.
    """

    _tag_names = ["trl", "grpo", "stapo"]
    _name = "STAPO"
    _s2t_modes = STAPOConfig._s2t_modes  # the modes this trainer runs: its config's
    _paper = {
        "title": "STAPO: Stabilizing Reinforcement Learning for LLMs by Silencing Rare Spurious Tokens",
        "id": "2602.15620",
        "citation": "@article{liu2026stapo,\n  title = {{STAPO: Stabilizing Reinforcement Learning for LLMs by "
        "Silencing Rare Spurious Tokens}},\n  author = {Shiqi Liu and Zeyu He and Guojian Zhan and Letian Tao and "
        "Zhilong Zheng and Jiang Wu and Yinuo Wang and Yang Guan and Kehua Sheng and Bo Zhang and Keqiang Li and "
        "Jingliang Duan and Shengbo Eben Li},\n  year = 2026,\n  eprint = {arXiv:2602.15620},\n}",
    }

    def __init__(self, model, reward_funcs=None, args=None, *pargs, **kwargs):
        if args is None:
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = STAPOConfig(f"{os.path.basename(os.path.normpath(model_name))}-STAPO")
        self.s2t = s2t_settings(args, self._s2t_modes)  # the config's S2T fields or the paper's, validated
        frame, level = sys._getframe(1), 2  # the warnings below name the first line outside this package: the user's
        while frame.f_back and frame.f_code.co_filename.startswith(_PACKAGE):
            frame, level = frame.f_back, level + 1
        if not SpecifierSet(SUPPORTED_TRL).contains(trl.__version__, prereleases=True):
            warnings.warn(f"trl {trl.__version__} is outside the tested trl{SUPPORTED_TRL}.", stacklevel=level)
        for message in filter(None, [s2t_settings_line(args, self.s2t), *s2t_warnings(args, self.s2t)]):
            warnings.warn(message, stacklevel=level)
        self._s2t_path = s2t_path(args)
        self._s2t_rollout_forwards: list | None = None  # TRL's no-grad policy forwards while a rollout is scored
        self._s2t_loss_forward: tuple | None = None  # (model, input_ids, logits_to_keep, forward) for the loss
        super().__init__(model, reward_funcs, args, *pargs, **kwargs)
        self._check_loss_normalizer()

    @property
    def _s2t_mask_in_loss(self) -> bool:
        """Whether the mask comes from the loss's own forward (evaluation; `steps_per_generation` = iterations = 1)."""
        return not self.model.training or self._s2t_path == "loss"

    @property
    def _s2t_window(self) -> int:
        """Micro-steps one training mask spans: an optimizer update, or a rollout batch where updates span two."""
        steps_per_generation, grad_accum = self.args.steps_per_generation, self.args.gradient_accumulation_steps
        return grad_accum if steps_per_generation % grad_accum == 0 else steps_per_generation

    def _check_loss_normalizer(self):
        """Refuse a TRL whose `num_items_in_batch` normalizer is not the one STAPO sets: TRL's `_compute_loss` on one
        synthetic row (its forward handed in: no model forward) must give the loss STAPO's normalizer means."""
        if self.loss_type not in NUM_ITEMS_LOSSES:
            return  # the other loss types normalize by the loss mask, which carries the keep mask
        spg, ga = self.args.steps_per_generation, self.args.gradient_accumulation_steps
        device, num_items = self.accelerator.device, torch.tensor(3.0 * spg / self._s2t_window)
        # One row of 4 completion tokens, the 4th silenced: 3 kept, normalized as STAPO sets it; ratio 1, no KL.
        ones, ids = torch.ones(1, 4, device=device), torch.zeros(1, 5, dtype=torch.long, device=device)
        batch = dict(prompt_ids=ids[:, :1], prompt_mask=ids[:, :1] + 1, completion_ids=ids[:, 1:],
                     completion_mask=ones, advantages=ones[0, :1], old_per_token_logps=-ones,
                     ref_per_token_logps=-ones, tool_mask=torch.tensor([[1.0, 1, 1, 0]], device=device),
                     importance_sampling_ratio=ones, num_items_in_batch=num_items)  # fmt: skip
        saved, metrics, training = dict(vars(self)), copy.deepcopy(self._metrics), self.model.training
        try:  # entropy 0: no entropy bonus
            aux = torch.zeros((), device=device) if self.aux_loss_enabled else None
            self._s2t_loss_forward = (self.model, ids, 4, (-ones, 0 * ones, aux))
            self.model.train()
            self.current_gradient_accumulation_steps = ga
            with torch.no_grad():
                loss = super()._compute_loss(self.model, batch).item()
        finally:  # nothing of the check stays: no metric, no state
            self.model.train(training)
            vars(self).clear()
            vars(self).update(saved, _metrics=metrics)
        expected = {"dapo": -1.0, "cispo": min(1.0, self.epsilon_high), "vespo": 1.0}[self.loss_type]
        expected *= self.accelerator.num_processes * self._s2t_window / ga
        if not math.isclose(loss, expected, rel_tol=1e-5):
            raise RuntimeError(
                f"trl {trl.__version__}'s GRPOTrainer._compute_loss gave {loss:.6g} where STAPO's normalizer means "
                f"{expected:.6g} ({self.loss_type}, steps_per_generation {spg}, GA {ga}): STAPO would train at a "
                f"wrong scale. Use trl{SUPPORTED_TRL}."
            )

    def _gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate a 1-D tensor of finite floats over processes (a collective): NaN pads, then is dropped."""
        padded = self.accelerator.pad_across_processes(tensor, pad_index=float("nan"))
        gathered = self.accelerator.gather(padded)
        return gathered[~gathered.isnan()]

    def _compute_s2t_mask(self, per_token_logps, entropies, advantages, loss_mask, completion_ids) -> S2TResult:
        """The S2T mask of one update (or evaluation batch) over all processes, from each one's rows: the hook."""
        return s2t_mask(per_token_logps, entropies, advantages, loss_mask, gather=self._gather, **asdict(self.s2t))

    def _s2t_result(self, per_token_logps, entropies, advantages, loss_mask, completion_ids) -> S2TResult:
        """[`_compute_s2t_mask`], and its global counts and tau_h logged under `s2t/` (pooled in [`log`])."""
        result = self._compute_s2t_mask(per_token_logps, entropies, advantages, loss_mask, completion_ids)
        metrics = self._metrics["train" if self.model.training else "eval"]
        metrics["s2t/entropy_threshold"].append(result.entropy_threshold)  # NaN without candidates
        for key in _COUNTS:
            metrics[key].append(float(getattr(result, key.removeprefix("s2t/"))))
        return result

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's `log`: the `s2t/` counts summed over the row, the ratios pooled from the sums, NaN values left out."""
        metrics = self._metrics["train" if self.model.training else "eval"]
        if metrics.get("s2t/num_loss_tokens"):
            for key in _COUNTS:
                metrics[key] = [sum(metrics[key])]
            num_loss_tokens = max(metrics["s2t/num_loss_tokens"][0], 1.0)
            metrics["s2t/silenced_ratio"] = [metrics["s2t/num_silenced"][0] / num_loss_tokens]
            metrics["s2t/candidate_ratio"] = [metrics["s2t/num_candidates"][0] / num_loss_tokens]
        for key in [k for k, values in metrics.items() if k.startswith("s2t/") and all(v != v for v in values)]:
            del metrics[key]  # v != v: NaN
        super().log(logs, start_time)

    @staticmethod
    def _loss_mask(inputs: dict) -> torch.Tensor:
        """The (B, T) loss mask before silencing: `completion_mask`, times `tool_mask` when present."""
        tool_mask = inputs.get("tool_mask")
        return inputs["completion_mask"] if tool_mask is None else inputs["completion_mask"] * tool_mask

    @staticmethod
    def _with_keep(inputs: dict, keep: torch.Tensor) -> dict:
        """A shallow copy of `inputs` whose `tool_mask` also holds the (B, T) bool keep mask."""
        keep, tool_mask = keep.to(inputs["completion_mask"].dtype), inputs.get("tool_mask")
        return {**inputs, "tool_mask": keep if tool_mask is None else tool_mask * keep}

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        stashed = self._s2t_loss_forward  # the loss's forward, for the call `_compute_loss` ran it for only
        if stashed and stashed[0] is model and stashed[2] == logits_to_keep and torch.equal(stashed[1], input_ids):
            self._s2t_loss_forward = None
            return stashed[3]
        if scoring := self._s2t_rollout_forwards is not None and model is self.model and not torch.is_grad_enabled():
            kwargs["compute_entropy"] = True  # TRL's no-grad policy forward while a rollout is scored
        forward = super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )
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
        same = [f[1] for f in forwards if old_logps is not None and torch.equal(f[0], old_logps)]  # TRL's, H asked
        if (old_logps is not None, bool(same)) != (self._s2t_path == "old_logps",) * 2:  # TRL scored otherwise
            found = "missing" if old_logps is None else f"from {'a' if same else 'no'} forward it saw"
            raise RuntimeError(
                f"trl {trl.__version__}: old_per_token_logps {found}, where s2t_path is {self._s2t_path!r}."
            )
        if same:
            batch["s2t_entropies"] = same[0]
            return batch
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            _, (batch["s2t_logps"], batch["s2t_entropies"], _) = self._s2t_forward(
                self.model, batch, batch_size=self.args.per_device_train_batch_size
            )
        return batch

    def _prepare_inputs(self, generation_batch):
        inputs = super()._prepare_inputs(generation_batch)
        if self._s2t_mask_in_loss:
            return inputs
        micro_batches, window = self._buffered_inputs, self._s2t_window  # the rollout batch, shuffled and split
        index = self._step % len(micro_batches)
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
            # TRL divides by num_items / processes x GA / steps_per_generation (checked): the kept count / processes
            num_items = torch.tensor(result.num_kept * len(micro_batches) / window, dtype=torch.float32)
            for batch, keep in zip(update, result.keep.split([b["advantages"].size(0) for b in update]), strict=True):
                batch["s2t_keep"], batch["num_items_in_batch"] = keep, num_items.to(keep.device)
        return self._with_keep(inputs, inputs["s2t_keep"])

    def _s2t_forward(self, model, inputs: dict, **kwargs) -> tuple:
        """(input_ids, TRL's forward: log-probs, entropies, aux) of a batch, called as `_compute_loss` calls it."""
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)  # (B, P+T)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)  # (B, P+T)
        kwargs |= {key: inputs.get(key) for key in _FORWARD_KEYS}
        logits_to_keep = inputs["completion_ids"].size(1)
        return input_ids, self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, compute_entropy=True, **kwargs
        )

    def _compute_loss(self, model, inputs):
        if not self._s2t_mask_in_loss:
            return super()._compute_loss(model, inputs)
        input_ids, forward = self._s2t_forward(model, inputs, compute_aux_loss=self.aux_loss_enabled)
        completion_ids = inputs["completion_ids"]
        result = self._s2t_result(
            forward[0].detach(), forward[1].detach(), inputs["advantages"], self._loss_mask(inputs), completion_ids
        )
        inputs = self._with_keep(inputs, result.keep)
        inputs["num_items_in_batch"] = torch.tensor(float(result.num_kept), device=completion_ids.device)
        self._s2t_loss_forward = (model, input_ids, completion_ids.size(1), forward)  # for the parent's call only
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._s2t_loss_forward = None
