"""The product's trainers: the core's `STAPOTrainer` and TRL's `GRPOTrainer`, with what `stapo_trl` adds.

Thin subclasses, as TRL's own trainers subclass `GRPOTrainer`: the maths, the mask plumbing and the `s2t/` metrics
are [`stapo_trl.core.STAPOTrainer`]'s (or TRL's, for the baseline). [`ProductTrainerMixin`] adds what users of the
package and of `stapo-train` rely on:

- `model="builtin:<name>"`: the built-in offline models ([`~stapo_trl.models.resolve_model_path`]).
- `reward_funcs="math_accuracy"`: rewards by their `stapo_trl` name ([`~stapo_trl.rewards.resolve_reward_names`]).
- Checks at construction, before a model is built: the `prompt` column and every reward argument filled by a
  dataset column ([`~stapo_trl.checks.dataset`]), `vllm_mode="server"` on a CPU-only run ([`~stapo_trl.integrations.vllm_support`]).
- vLLM colocate on the CPU backend: weights synced through vLLM's reload path.
- `train()`: the run files `metrics.jsonl` (and, for STAPO, `spurious_tokens.jsonl`; [`~stapo_trl.runfiles.callbacks`]),
  without the known-harmless upstream warnings ([`~stapo_trl.integrations.upstream_warnings`]).
- `end()`: the DDP wrapper dropped before the process group is destroyed, so that gloo's threads stop and
  the process exits cleanly ([`~stapo_trl.integrations.process_group.release_process_group`]).
- The model card: TRL's, plus the run's settings and results ([`~stapo_trl.runfiles.model_card`]), a quick start in the run's
  prompt format, and public names only in the card `push_to_hub` uploads.
"""

from __future__ import annotations

import warnings
from typing import Any

import datasets
import trl
from trl.trainer.utils import get_config_model_id

from . import core
from .checks.dataset import check_chat_template, check_prompt_column, check_reward_columns
from .config import STAPOConfig, untested_combination_warnings
from .diagnostics.ablations import ABLATION_MODES, ablation_mask
from .diagnostics.metrics import diagnostic_metrics
from .integrations.process_group import release_process_group
from .integrations.upstream_warnings import QuietKnownUpstreamWarnings
from .integrations.vllm_support import check_vllm_args, install_cpu_colocate_weight_sync
from .models import resolve_model_path
from .rewards import resolve_reward_names
from .runfiles.callbacks import SpuriousTokenLogger, add_run_file_callbacks
from .runfiles.model_card import add_stapo_section, make_card_public, public_dataset_name, write_quick_start


class ProductTrainerMixin:
    """The package's additions to a GRPO-family trainer (listed in the module docstring); put it first in the bases.

    Attributes:
        eval_record (`dict` or `None`): held-out accuracy before and after training (the content of `stapo-train`'s
            `eval.json`), stated by the model card; `None`: the card says it was not measured.
    """

    eval_record: dict[str, Any] | None = None

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, eval_dataset=None, *pargs, **kwargs):
        if isinstance(model, str):
            model = resolve_model_path(model)  # builtin:<name>, built into its cache on first use
        if args is not None:
            check_vllm_args(args)  # vllm_mode='server' on a CPU-only run: refused before TRL waits for a server
        reward_funcs = resolve_reward_names(reward_funcs)  # "math_accuracy" is stapo_trl's, not a Hub reward model
        if kwargs.get("rollout_func") is None:  # a rollout function may add the fields a reward reads
            for name, dataset in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
                check_prompt_column(dataset, name)  # now, not at the first step, after a model build
                check_reward_columns(reward_funcs, dataset, name)
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, *pargs, **kwargs)
        # Chat-message prompts need a template (TRL fails at the first step otherwise): now, before any run file.
        model_name = get_config_model_id(self.model.config)
        for name, dataset in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
            check_chat_template(self.processing_class, dataset, model_name, name)
        install_cpu_colocate_weight_sync(self)  # vLLM's CPU backend repacks weights: sync through its reload path

    def train(self, *args, **kwargs):
        """`Trainer.train`, writing the run files into `output_dir` unless `args.s2t_write_run_files` is off
        ([`~stapo_trl.runfiles.callbacks.add_run_file_callbacks`]: a callback of the same class added by the caller is kept
        instead), without the known-harmless upstream warnings
        ([`~stapo_trl.integrations.upstream_warnings.QuietKnownUpstreamWarnings`])."""
        if not isinstance(self.args, STAPOConfig) or self.args.s2t_write_run_files:
            add_run_file_callbacks(self)
        with QuietKnownUpstreamWarnings() as quiet:  # TRL's deprecated checkpointing calls; a tied head's resume
            quiet.watch_model(self.model)
            return super().train(*args, **kwargs)

    def create_model_card(self, model_name=None, dataset_name=None, tags=None, public: bool = False):
        """TRL's card (for STAPO: names it, links the paper, its BibTeX), plus the run's settings and results
        ([`eval_record`]), and a quick start that asks a training prompt in the run's format.

        Args:
            model_name, dataset_name, tags: as [`~trl.GRPOTrainer.create_model_card`].
            public (`bool`, *optional*, defaults to `False`): the card as uploaded (`push_to_hub` sets it): no local
                path, `builtin:` model or local dataset in it ([`~stapo_trl.runfiles.model_card.make_card_public`]).
        """
        if public:
            dataset_name = public_dataset_name(dataset_name)
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        if isinstance(self.train_dataset, datasets.Dataset) and len(self.train_dataset) > 0:
            write_quick_start(self, self.train_dataset[0]["prompt"])
        if public:
            make_card_public(self, eval_record=self.eval_record)
        else:
            add_stapo_section(self, eval_record=self.eval_record)

    def push_to_hub(self, *args, **kwargs):
        """`Trainer.push_to_hub`, uploading the public card (`create_model_card(public=True)`)."""
        return super().push_to_hub(*args, public=True, **kwargs)

    def end(self):
        """`Trainer.end` (finish the trackers, destroy the process group), after dropping the DDP wrapper that would
        keep the group alive and abort the process exit ([`~stapo_trl.integrations.process_group.release_process_group`]).
        Call it once, last: `trainer.model` stays usable on each process, nothing may communicate afterwards."""
        release_process_group(self)


class STAPOTrainer(ProductTrainerMixin, core.STAPOTrainer):
    r"""
    [`stapo_trl.core.STAPOTrainer`] (STAPO: GRPO whose loss silences rare spurious tokens), with the package's
    additions ([`ProductTrainerMixin`]) and what it measures around each mask, through the core's
    `_compute_s2t_mask` hook:

    - the paper's ablation modes `s2t_mode="high_entropy"` and `"all_low_prob"` ([`~stapo_trl.diagnostics.ablations`]);
    - the diagnostics `s2t/entropy_p10` ... `p95`, `s2t/silenced_prob_mean`, `s2t/silenced_entropy_mean`
      ([`~stapo_trl.diagnostics.metrics`]), and one warning when a loss token has a non-finite p or H;
    - the per-token records of `spurious_tokens.jsonl` ([`~stapo_trl.runfiles.callbacks.SpuriousTokenLogger`]);
    - log rows whose `s2t/` counts are summed and ratios pooled over the row (Σ silenced / Σ loss tokens, not a mean
      of per-mask ratios), with undefined keys left out instead of TRL's `None`.

    Args:
        model: as [`~trl.GRPOTrainer`], or a built-in name (`"builtin:tiny-math"`, `"builtin:tiny-random"`, ...),
            built into its cache on first use.
        reward_funcs: as [`~trl.GRPOTrainer`]; a string may also name a reward of `stapo_trl.rewards.REWARDS`
            (`"math_accuracy"`).
        args ([`~stapo_trl.STAPOConfig`], *optional*): defaults to `STAPOConfig("<model>-STAPO")`.
        train_dataset, eval_dataset, ...: as [`~trl.GRPOTrainer`].

    Raises:
        TypeError: if `args` is not a [`~stapo_trl.STAPOConfig`].
        ValueError: a dataset without a `prompt` column; a reward function with an argument that no column of
            `train_dataset` / `eval_dataset` fills ([`~stapo_trl.checks.dataset.check_reward_columns`]; not checked
            with a `rollout_func`); an unknown reward name; `vllm_mode="server"` without an accelerator.
    """

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, eval_dataset=None, *pargs, **kwargs):
        if args is None:
            model_name = model if isinstance(model, str) else model.config._name_or_path
            args = STAPOConfig(f"{str(model_name).split('/')[-1]}-STAPO")
        if not isinstance(args, STAPOConfig):
            raise TypeError(
                f"STAPOTrainer needs `args` to be a stapo_trl.STAPOConfig, got {type(args).__name__}. "
                "Build it with STAPOConfig(...) (it accepts every GRPOConfig field)."
            )
        for message in untested_combination_warnings(args):
            warnings.warn(message, stacklevel=2)
        self._nonfinite_warned = False
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, *pargs, **kwargs)

    def _compute_s2t_mask(self, per_token_logps, entropies, advantages, loss_mask, completion_ids):
        if self.args.s2t_mode in ABLATION_MODES:
            result = ablation_mask(
                per_token_logps,
                entropies,
                advantages,
                loss_mask,
                mode=self.args.s2t_mode,
                prob_threshold=self.args.s2t_prob_threshold,
                entropy_quantile=self.args.s2t_entropy_quantile,
                gather=self._gather,
            )
        else:
            result = super()._compute_s2t_mask(per_token_logps, entropies, advantages, loss_mask, completion_ids)
        mode = "train" if self.model.training else "eval"
        reduce = lambda t: self.accelerator.reduce(t, reduction="sum")  # noqa: E731
        for name, value in diagnostic_metrics(result, per_token_logps, entropies, loss_mask, reduce).items():
            self._metrics[mode][name].append(value)
        if result.num_nonfinite and not self._nonfinite_warned:
            self._nonfinite_warned = True
            warnings.warn(
                f"{result.num_nonfinite} loss tokens have a non-finite log-probability or entropy (NaN or inf): they "
                "are never S2T candidates, but this means numerical trouble upstream (logits, dtype, LM head). "
                "Counted in s2t/num_nonfinite; this warning is shown once per run.",
                stacklevel=2,
            )
        if mode == "train":
            for callback in self.callback_handler.callbacks:
                if isinstance(callback, SpuriousTokenLogger):
                    callback.record(result, per_token_logps, entropies, advantages, loss_mask, completion_ids)
        return result

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's `log`, with the `s2t/` counts summed and the ratios pooled over the row, and undefined keys left out.

        Each mask appends its global counts; a row reports Σ counts and Σ silenced / Σ loss tokens, so every logging
        interval gives the same numbers for the same tokens. TRL turns an all-NaN metric into `None` (not a number
        for trackers): `s2t/entropy_threshold` is NaN without candidates and `s2t/silenced_*_mean` when nothing is
        silenced, so such keys are left out instead. The values are global, so every process does the same.
        """
        metrics = self._metrics["train" if self.model.training else "eval"]
        if metrics.get("s2t/num_loss_tokens"):
            for key in ("s2t/num_silenced", "s2t/num_candidates", "s2t/num_loss_tokens", "s2t/num_nonfinite"):
                metrics[key] = [sum(metrics[key])]
            num_loss_tokens = max(metrics["s2t/num_loss_tokens"][0], 1.0)
            metrics["s2t/silenced_ratio"] = [metrics["s2t/num_silenced"][0] / num_loss_tokens]
            metrics["s2t/candidate_ratio"] = [metrics["s2t/num_candidates"][0] / num_loss_tokens]
        for key in [k for k, values in metrics.items() if k.startswith("s2t/") and all(v != v for v in values)]:
            del metrics[key]  # v != v: NaN
        super().log(logs, start_time)


class GRPOBaselineTrainer(ProductTrainerMixin, trl.GRPOTrainer):
    """TRL's `GRPOTrainer`, its maths untouched, with the package's additions ([`ProductTrainerMixin`]): what
    `stapo-train` runs for `trainer: grpo`, so that the baseline writes the same `metrics.jsonl` and card as STAPO.

    Args: as [`~trl.GRPOTrainer`] (`args` a [`~trl.GRPOConfig`]), plus the built-in model and reward names.
    """
