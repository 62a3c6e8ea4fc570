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
  a compact console line per logging step and the files at the end ([`~stapo_trl.runfiles.console`]), one warning
  when the first logging steps had no learning signal ([`~stapo_trl.runfiles.learning_signal`]), a checkpoint on
  Ctrl-C or SIGTERM ([`~stapo_trl.runfiles.interrupt`]), one torch thread for the built-in tiny models
  ([`~stapo_trl.integrations.torch_threads`]), without the known-harmless upstream warnings
  ([`~stapo_trl.integrations.upstream_warnings`]).
- `end()`: the DDP wrapper dropped before the process group is destroyed, so that gloo's threads stop and
  the process exits cleanly ([`~stapo_trl.integrations.process_group.release_process_group`]).
- The model card: TRL's, plus the run's settings and results ([`~stapo_trl.runfiles.model_card`]), a quick start in the run's
  prompt format, and public names only in the card `push_to_hub` uploads.
"""

from __future__ import annotations

import inspect
import os
import re
import warnings
from typing import Any

import datasets
import trl
from trl.trainer.utils import get_config_model_id

from . import core
from .checks.dataset import check_chat_template, check_prompt_column, check_reward_columns
from .checks.hub import check_hub_model
from .config import STAPOConfig, write_run_files
from .diagnostics.ablations import ABLATION_MODES, ablation_mask
from .diagnostics.metrics import diagnostic_metrics
from .integrations.process_group import release_process_group
from .integrations.torch_threads import default_num_threads, torch_threads
from .integrations.upstream_warnings import QuietKnownUpstreamWarnings
from .integrations.vllm_support import check_vllm_args, install_cpu_colocate_weight_sync
from .models import resolve_model_path
from .rewards import resolve_reward_names
from .runfiles.callbacks import SpuriousTokenLogger, add_run_file_callbacks
from .runfiles.checkpoints import check_checkpoint, resume_checkpoint
from .runfiles.console import use_compact_console
from .runfiles.interrupt import SCRIPT_RESUME_HINT, GracefulInterrupt, training_interrupted
from .runfiles.learning_signal import NoLearningSignalCallback
from .runfiles.model_card import add_stapo_section, make_card_public, public_dataset_name, write_quick_start
from .runfiles.run_folder import check_run_folder, lock_run_folder
from .runfiles.run_record import RUN_RECORD, check_run_settings, plain, run_settings, write_run_record


class ProductTrainerMixin:
    """The package's additions to a GRPO-family trainer (listed in the module docstring); put it first in the bases.

    Attributes:
        eval_record (`dict` or `None`): held-out accuracy before and after training (the content of `stapo-train`'s
            `eval.json`), stated by the model card; `None`: the card says it was not measured.
        resume_hint (`str`): how the stop message says to resume (`trainer.train(resume_from_checkpoint=True)`;
            `stapo-train` sets its own command line).
        run_settings (`dict`): what the run optimizes, as plain data
            ([`~stapo_trl.runfiles.run_record.run_settings`], taken at construction): written into each checkpoint
            (`stapo_run.json`) and compared on resume. `stapo-train` adds its prompt format and data digest.
    """

    eval_record: dict[str, Any] | None = None
    resume_hint: str = SCRIPT_RESUME_HINT  # the end of the stop message; `stapo-train` gives its command

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, eval_dataset=None, *pargs, **kwargs):
        given_model = model
        if isinstance(model, str):
            model = resolve_model_path(model)  # builtin:<name>, built into its cache on first use
        if args is not None:
            check_vllm_args(args)  # vllm_mode='server' on a CPU-only run: refused before TRL waits for a server
            write_run_files(args)  # a bool, where the config has the field
            check_run_folder(args)  # output_dir writable, no other run's: refused now, before a model is built
        reward_funcs = resolve_reward_names(reward_funcs)  # "math_accuracy" is stapo_trl's, not a Hub reward model
        # Checked now, not at the first step after a model build; and only what GRPOTrainer would fail on. Its later
        # arguments may come by position too.
        later = inspect.signature(trl.GRPOTrainer.__init__).bind_partial(None, None, None, None, None, None, *pargs)
        later = {**later.arguments, **kwargs}
        if not reward_funcs and later.get("environment_factory") is None:
            raise ValueError(
                f"reward_funcs={reward_funcs!r} gives no reward: pass at least one reward function (e.g. "
                '"math_accuracy"), a reward model id, or an environment_factory whose environment defines get_reward.'
            )
        peft_settings = plain(later.get("peft_config"))  # before PEFT fills in the wrapped model's name
        for name, dataset in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
            # With an environment, `reset()` supplies the prompt: TRL reads `prompt` only when a row has one.
            check_prompt_column(dataset, name, prompt_optional=later.get("environment_factory") is not None)
            if later.get("rollout_func") is None:  # a rollout function may add the fields a reward reads
                check_reward_columns(reward_funcs, dataset, name)
        # A Hub id neither cached nor reachable: refused in seconds, not after transformers' retries (~50 s).
        revision = ((args.model_init_kwargs if args is not None else None) or {}).get("revision")
        if isinstance(model, str):
            check_hub_model(model, revision=revision)
        for reward_model in reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]:
            if isinstance(reward_model, str):
                check_hub_model(reward_model, revision=revision, what="Reward model")
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, *pargs, **kwargs)
        # Chat-message prompts need a template (TRL fails at the first step otherwise): now, before any run file.
        model_name = get_config_model_id(self.model.config)
        for name, dataset in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
            check_chat_template(self.processing_class, dataset, model_name, name)
        install_cpu_colocate_weight_sync(self)  # vLLM's CPU backend repacks weights: sync through its reload path
        use_compact_console(self)  # one short line per logging step instead of each row's dict (runfiles.console)
        self.run_settings = run_settings(
            self.args,
            trainer=type(self).__name__,
            model=given_model,
            reward_funcs=self.reward_funcs,
            s2t=getattr(self, "s2t", None),
            peft_config=peft_settings,
            train_dataset=train_dataset,
        )

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """`Trainer.train`, as `stapo-train` runs it, in a script too:

        - the run files in `output_dir` unless `args.s2t_write_run_files` is off
          ([`~stapo_trl.runfiles.callbacks.add_run_file_callbacks`]: a callback of the same class added by the caller
          is kept instead);
        - one warning when the first logging steps had no learning signal (every group with zero reward spread, or a
          reward that never changed), with the likely causes ([`~stapo_trl.runfiles.learning_signal`]);
        - Ctrl-C, SIGTERM or SIGUSR1 saves a checkpoint at the next step boundary and raises a `KeyboardInterrupt` that
          names the signal and says where and how to resume (`trainer.train(resume_from_checkpoint=True)`, or
          [`resume_hint`]; [`~stapo_trl.runfiles.interrupt.GracefulInterrupt`]); a second Ctrl-C quits at once;
        - a tiny model (built-in, or trained from one) on one torch thread unless the caller chose a count
          (`torch.set_num_threads`, `OMP_NUM_THREADS`): torch's one thread per core was up to 21x slower on 2 shared
          cores ([`~stapo_trl.integrations.torch_threads`]); the count is restored afterwards (so do `evaluate`,
          `predict`);
        - without the known-harmless upstream warnings ([`~stapo_trl.integrations.upstream_warnings`]);
        - one writer per `output_dir` ([`~stapo_trl.runfiles.run_folder`]); `resume_from_checkpoint=True` takes the
          newest complete checkpoint, every file of it whole, and moves the incomplete or damaged ones above it aside
          (one line names each file and its damage; [`~stapo_trl.runfiles.checkpoints`]);
        - a resume that changes what the run optimizes ([`run_settings`]: S2T values, objective, optimizer, model,
          PEFT, rewards, data) is refused; a checkpoint saved before stapo_trl recorded its settings resumes with one
          warning ([`~stapo_trl.runfiles.run_record`]).

        Raises:
            KeyboardInterrupt: on the first SIGINT, SIGTERM or SIGUSR1, after the checkpoint of the step it came in
                (attributes `step`, `checkpoint` and `signal`).
            ValueError: another process writes `output_dir`; `resume_from_checkpoint=True` and no complete checkpoint;
                a `resume_from_checkpoint` folder that is not a complete checkpoint; a checkpoint trained with other
                settings (one line naming each changed field, old -> new).
        """
        lock_run_folder(self.args)  # one writer per output_dir; held until the end of train()
        try:
            if resume_from_checkpoint is True:  # transformers takes the highest-numbered folder, complete or not
                resume_from_checkpoint = resume_checkpoint(
                    self.args.output_dir, self.args.save_only_model, move_aside=self.args.should_save
                )
                if resume_from_checkpoint is None:
                    raise ValueError(f"No complete checkpoint to resume from in output_dir={self.args.output_dir!r}.")
            elif isinstance(resume_from_checkpoint, (str, os.PathLike)):
                resume_from_checkpoint = os.fspath(resume_from_checkpoint)
                check_checkpoint(resume_from_checkpoint, f"resume_from_checkpoint={resume_from_checkpoint!r}")
            if resume_from_checkpoint:
                check_run_settings(resume_from_checkpoint, self.run_settings)
            return self._train_in_folder(resume_from_checkpoint, *args, **kwargs)
        finally:
            lock_run_folder(self.args, acquire=False)

    def _train_in_folder(self, resume_from_checkpoint, *args, **kwargs):
        if write_run_files(self.args):
            add_run_file_callbacks(self)
        if not any(isinstance(callback, NoLearningSignalCallback) for callback in self.callback_handler.callbacks):
            self.add_callback(NoLearningSignalCallback(self))
        stop = GracefulInterrupt(self)  # a stop signal: checkpoint at the next step boundary; a 2nd Ctrl-C: quit
        self.add_callback(stop)
        try:
            with torch_threads(default_num_threads(self.model)), stop, QuietKnownUpstreamWarnings() as quiet:
                quiet.watch_model(self.model)  # TRL's deprecated checkpointing calls; a tied head's resume
                output = super().train(resume_from_checkpoint, *args, **kwargs)
        finally:
            self.remove_callback(stop)  # a later train() (the resume) gets a fresh one
        if stop.signal:
            raise training_interrupted(self.args.output_dir, self.state.global_step, self.resume_hint, stop.signal)
        return output

    def _save_checkpoint(self, model, trial):
        """`Trainer._save_checkpoint`, between two writes of the run record (`stapo_run.json`): first the settings with
        no file list (the save is under way; an older `trainer_state.json` left by a rewrite of the same step is
        removed), last the names of the files the save wrote, which mark it complete
        ([`~stapo_trl.runfiles.checkpoints.checkpoint_problem`])."""
        folder = os.path.join(self._get_output_dir(trial), f"checkpoint-{self.state.global_step}")
        record = {"settings": self.run_settings, "save_only_model": self.args.save_only_model}
        if self.args.should_save:
            if os.path.isfile(os.path.join(folder, "trainer_state.json")):
                os.remove(os.path.join(folder, "trainer_state.json"))
            write_run_record(folder, **record, files=None)
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            names = [
                n
                for n in os.listdir(folder)
                if os.path.isfile(os.path.join(folder, n)) and not n.startswith(RUN_RECORD)
            ]
            files = sorted(n for n in names if not re.match(r"rng_state_\d+\.pth$", n))  # other processes write theirs
            write_run_record(folder, **record, files=files)

    def evaluate(self, *args, **kwargs):
        """`Trainer.evaluate` on the thread count of `train()` (one for a tiny model unless the caller chose
        one): 9.1 s instead of 95 s on 2 shared cores (`benchmarks/results/2026-12-04-evaluate-threads.md`)."""
        with torch_threads(default_num_threads(self.model)):
            return super().evaluate(*args, **kwargs)

    def predict(self, *args, **kwargs):
        """`Trainer.predict` on the thread count of `train()`, as [`evaluate`]."""
        with torch_threads(default_num_threads(self.model)):
            return super().predict(*args, **kwargs)

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
        dataset = self.train_dataset
        if isinstance(dataset, datasets.Dataset) and len(dataset) > 0 and "prompt" in dataset.column_names:
            write_quick_start(self, dataset[0]["prompt"])  # no `prompt` column: an environment's reset() makes them
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
        args ([`~trl.GRPOConfig`], *optional*): any `GRPOConfig` (the S2T fields and `s2t_write_run_files` where it
            has them, else the paper's values and `True`); defaults to [`~stapo_trl.STAPOConfig`]`("<model>-STAPO")`.
        train_dataset, eval_dataset, ...: as [`~trl.GRPOTrainer`].

    Raises:
        ValueError: an empty dataset, or one without a `prompt` column (unless an `environment_factory`, whose
            `reset()` supplies the prompt, is given); a reward function with an argument that no column of
            `train_dataset` / `eval_dataset` fills ([`~stapo_trl.checks.dataset.check_reward_columns`]; not checked
            with a `rollout_func`); an unknown reward name; `vllm_mode="server"` without an accelerator; an S2T value
            out of range or `s2t_write_run_files` not a bool, from a config of any class; an `output_dir` that cannot
            be written or that another run writes ([`~stapo_trl.runfiles.run_folder.lock_run_folder`]).
        FileNotFoundError, ConnectionError: a model (or reward model) given as a Hub id that is not in the local
            cache while `HF_HUB_OFFLINE=1`, or while the Hub does not answer
            ([`~stapo_trl.checks.hub.check_hub_model`]; in seconds, before any download is tried).
    """

    _s2t_modes = STAPOConfig._s2t_modes  # the core's modes and the paper's ablations

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, eval_dataset=None, *pargs, **kwargs):
        if args is None:
            model_name = model if isinstance(model, str) else model.config._name_or_path
            args = STAPOConfig(f"{str(model_name).split('/')[-1]}-STAPO")
        core.stapo_config.refuse_paths_around_the_mask(args)  # before a model is built
        self._nonfinite_warned = False
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, *pargs, **kwargs)

    def _compute_s2t_mask(self, per_token_logps, entropies, advantages, loss_mask, completion_ids):
        if self.s2t.mode in ABLATION_MODES:
            result = ablation_mask(
                per_token_logps,
                entropies,
                advantages,
                loss_mask,
                mode=self.s2t.mode,
                prob_threshold=self.s2t.prob_threshold,
                entropy_quantile=self.s2t.entropy_quantile,
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
