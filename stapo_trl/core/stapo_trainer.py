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


SUPPORTED_TRL = ">=1.9.1,!=1.15.0,<=1.16.0"  # tested; another one is warned at construction
_COUNTS = ("s2t/num_silenced", "s2t/num_candidates", "s2t/num_loss_tokens", "s2t/num_nonfinite")
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # warnings skip its frames
_TITLE = "STAPO: Stabilizing Reinforcement Learning for LLMs by Silencing Rare Spurious Tokens"
_FORWARD_KEYS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
                 "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")  # fmt: skip


class STAPOTrainer(GRPOTrainer):
    r"""[STAPO](https://huggingface.co/papers/2602.15620): [`~trl.GRPOTrainer`] with the S2T mask (Sec. 3) in its loss.

    The rule ([`s2t_mask`]) runs over each optimizer update on all processes with the rollout policy's p and H; TRL's
    `_compute_loss` is called, not copied. `stapo_trl.STAPOTrainer` (the package's: run files, checks, ablations)
    subclasses this one. `args`: any `GRPOConfig` (its `s2t_*` fields, else the paper's values, said in one warning).
    Raises `ValueError` for a bad S2T value or a setting with which TRL trains past the mask; `RuntimeError` for a TRL
    whose loss normalizer or rollout scoring differs. Logs `s2t/silenced_ratio`, `s2t/candidate_ratio`,
    `s2t/entropy_threshold` (tau_h, nats), `s2t/num_silenced`, `num_candidates`, `num_loss_tokens`, `num_nonfinite`.
    """

    _tag_names = ["trl", "grpo", "stapo"]
    _name = "STAPO"
    _s2t_modes = STAPOConfig._s2t_modes
    _paper = {"id": "2602.15620", "title": _TITLE, "citation": f"@article{{liu2026stapo,\n  title = {{{{{_TITLE}}}}}"
              ",\n  author = {Shiqi Liu and Zeyu He and Guojian Zhan and Letian Tao and Zhilong Zheng and Jiang Wu "
              "and Yinuo Wang and Yang Guan and Kehua Sheng and Bo Zhang and Keqiang Li and Jingliang Duan and "
              "Shengbo Eben Li},\n  year = 2026,\n  eprint = {arXiv:2602.15620},\n}"}  # fmt: skip

    def __init__(self, model, reward_funcs=None, args=None, *pargs, **kwargs):
        if args is None:
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = STAPOConfig(f"{os.path.basename(os.path.normpath(model_name))}-STAPO")
        self.s2t = s2t_settings(args, self._s2t_modes)
        frame, level = sys._getframe(1), 2  # the warnings name the user's line, the first outside this package
        while frame.f_back and frame.f_code.co_filename.startswith(_PACKAGE):
            frame, level = frame.f_back, level + 1
        if not SpecifierSet(SUPPORTED_TRL).contains(trl.__version__, prereleases=True):
            warnings.warn(f"trl {trl.__version__} is outside the tested trl{SUPPORTED_TRL}.", stacklevel=level)
        for message in filter(None, [s2t_settings_line(args, self.s2t), *s2t_warnings(args, self.s2t)]):
            warnings.warn(message, stacklevel=level)
        self._s2t_path = s2t_path(args)
        self._s2t_rollout_forwards: list | None = None  # TRL's no-grad policy forwards while a rollout is scored
        self._s2t_loss_forward: tuple | None = None  # (model, input_ids, logits_to_keep, forward)
        super().__init__(model, reward_funcs, args, *pargs, **kwargs)
        if self.loss_type not in NUM_ITEMS_LOSSES:  # TRL's loss on a synthetic row: normalized as STAPO sets?
            return
        spg, ga = self.args.steps_per_generation, self.args.gradient_accumulation_steps
        device, num_items = self.accelerator.device, torch.tensor(3.0 * spg / self._s2t_window)
        # 4 completion tokens, the 4th silenced; ratio 1, no KL, entropy 0
        ones, ids = torch.ones(1, 4, device=device), torch.zeros(1, 5, dtype=torch.long, device=device)
        batch = dict(prompt_ids=ids[:, :1], prompt_mask=ids[:, :1] + 1, completion_ids=ids[:, 1:],
                     completion_mask=ones, advantages=ones[0, :1], old_per_token_logps=-ones,
                     ref_per_token_logps=-ones, tool_mask=torch.tensor([[1.0, 1, 1, 0]], device=device),
                     importance_sampling_ratio=ones, num_items_in_batch=num_items)  # fmt: skip
        saved, metrics, training = dict(vars(self)), copy.deepcopy(self._metrics), self.model.training
        try:
            aux = torch.zeros((), device=device) if self.aux_loss_enabled else None
            self._s2t_loss_forward = (self.model, ids, 4, (-ones, 0 * ones, aux))
            self.model.train()
            self.current_gradient_accumulation_steps = ga
            with torch.no_grad():
                loss = super()._compute_loss(self.model, batch).item()
        finally:
            self.model.train(training)
            vars(self).clear()
            vars(self).update(saved, _metrics=metrics)
        expected = {"dapo": -1.0, "cispo": min(1.0, self.epsilon_high), "vespo": 1.0}[self.loss_type]
        expected *= self.accelerator.num_processes * self._s2t_window / ga
        if not math.isclose(loss, expected, rel_tol=1e-5):
            raise RuntimeError(
                f"trl {trl.__version__}'s _compute_loss gave {loss:.6g}, not {expected:.6g} ({self.loss_type}, "
                f"steps_per_generation {spg}, GA {ga}): STAPO would train at a wrong scale. Use trl{SUPPORTED_TRL}."
            )

    @property
    def _s2t_mask_in_loss(self) -> bool:  # evaluation, or steps_per_generation = num_iterations = 1
        return not self.model.training or self._s2t_path == "loss"

    @property
    def _s2t_window(self) -> int:  # micro-steps a mask spans: an update, or a rollout batch where updates span two
        steps_per_generation, grad_accum = self.args.steps_per_generation, self.args.gradient_accumulation_steps
        return grad_accum if steps_per_generation % grad_accum == 0 else steps_per_generation

    def _gather(self, tensor: torch.Tensor) -> torch.Tensor:
        gathered = self.accelerator.gather(self.accelerator.pad_across_processes(tensor, pad_index=float("nan")))
        return gathered[~gathered.isnan()]

    def _compute_s2t_mask(self, per_token_logps, entropies, advantages, loss_mask, completion_ids) -> S2TResult:
        """The S2T mask of one update (or evaluation batch) from each process's rows: the hook for subclasses."""
        return s2t_mask(per_token_logps, entropies, advantages, loss_mask, gather=self._gather, **asdict(self.s2t))

    def _s2t_result(self, per_token_logps, entropies, advantages, loss_mask, completion_ids) -> S2TResult:
        result = self._compute_s2t_mask(per_token_logps, entropies, advantages, loss_mask, completion_ids)
        metrics = self._metrics["train" if self.model.training else "eval"]
        for key in ("s2t/entropy_threshold", *_COUNTS):
            metrics[key].append(float(getattr(result, key.removeprefix("s2t/"))))
        return result

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's `log`, the `s2t/` counts summed over the row, the ratios pooled from the sums, NaN left out."""
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
        return inputs["completion_mask"] * (1 if inputs.get("tool_mask") is None else inputs["tool_mask"])

    @staticmethod
    def _with_keep(inputs: dict, keep: torch.Tensor) -> dict:
        keep, tool_mask = keep.to(inputs["completion_mask"].dtype), inputs.get("tool_mask")
        return {**inputs, "tool_mask": keep if tool_mask is None else tool_mask * keep}

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        stashed = self._s2t_loss_forward  # only for the call it was made for
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
        self._s2t_rollout_forwards = forwards = []
        try:
            batch = super()._generate_and_score_completions(inputs)
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
        micro_batches, window = self._buffered_inputs, self._s2t_window
        index = self._step % len(micro_batches)
        start = index - index % window
        if index == start or "s2t_keep" not in inputs:  # the update's first micro-step (or a resume inside one)
            update = micro_batches[start : start + window]
            columns = zip(*[(b.get("s2t_logps", b.get("old_per_token_logps")), b["s2t_entropies"], b["advantages"],
                             self._loss_mask(b), b["completion_ids"]) for b in update])  # fmt: skip
            result = self._s2t_result(*map(torch.cat, columns))  # (ΣB, T) each, advantages (ΣB,)
            # TRL divides by num_items / processes x GA / steps_per_generation (checked): the kept count / processes
            num_items = torch.tensor(result.num_kept * len(micro_batches) / window, dtype=torch.float32)
            for batch, keep in zip(update, result.keep.split([b["advantages"].size(0) for b in update]), strict=True):
                batch["s2t_keep"], batch["num_items_in_batch"] = keep, num_items.to(keep.device)
        return self._with_keep(inputs, inputs["s2t_keep"])

    def _s2t_forward(self, model, inputs: dict, **kwargs) -> tuple:
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)  # (B, P+T)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)  # (B, P+T)
        kwargs |= {key: inputs.get(key) for key in _FORWARD_KEYS}
        return input_ids, self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, inputs["completion_ids"].size(1), compute_entropy=True, **kwargs
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
        self._s2t_loss_forward = (model, input_ids, completion_ids.size(1), forward)
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._s2t_loss_forward = None
