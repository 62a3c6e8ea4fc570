"""The core's `STAPOTrainer` and TRL's `GRPOTrainer` with this package's additions (the class `_Additions`)."""

from __future__ import annotations

import contextlib
import gc
import glob
import importlib.util
import inspect
import logging
import os
import re
import warnings

import torch
import trl

from .. import core
from ..data import check_chat_template, check_prompt_column, check_reward_columns
from ..diagnostics.ablations import ABLATIONS, ablation_mask
from ..diagnostics.metrics import diagnostic_metrics
from ..integrations.vllm_support import check_vllm_args, install_cpu_colocate_weight_sync
from ..rewards import NoRewardWarning, resolve_reward_names
from ..run_folder import checkpoints
from .config import STAPOConfig, write_run_files


def _torch_default_threads() -> set[int]:  # the counts torch starts with: one per available core, logical or physical
    counts = {len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0, os.cpu_count() or 1}
    per_core = 1
    with contextlib.suppress(OSError), open("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list") as f:
        per_core = sum(int(b) - int(a) + 1 if b else 1 for a, _, b in (p.partition("-") for p in f.read().split(",")))
    return counts | {max(n // per_core, 1) for n in counts}


@contextlib.contextmanager
def tiny_model_threads(model):
    """One torch thread in the block for a model (or folder) of at most 4 MiB of `model*.safetensors` unless set."""
    if not isinstance(model, (str, os.PathLike)):
        model = getattr(getattr(model, "config", None), "_name_or_path", None)
    weights = glob.glob(os.path.join(glob.escape(str(model)), "model*.safetensors")) if model else []
    previous, tiny = torch.get_num_threads(), bool(weights) and sum(map(os.path.getsize, weights)) <= 4 * 2**20
    if one := tiny and not os.environ.get("OMP_NUM_THREADS") and previous in _torch_default_threads():
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if one:
            torch.set_num_threads(previous)


class _Additions:  # first in the bases; `run_settings` kept in each checkpoint, compared on resume
    eval_record = None  # accuracy before and after training, for the card

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, eval_dataset=None, *pargs, **kwargs):
        if isinstance(given_model := model, str) and model.startswith("builtin:"):
            model = importlib.import_module("stapo_trl.models").resolve_model_path(model)  # built on first use
        if args is not None:
            if importlib.util.find_spec("vllm"):  # else TRL's ImportError ("vLLM is not available") stands
                check_vllm_args(args)
            write_run_files(args)
            if args.should_save:
                checkpoints.check_output_dir(args.output_dir)
        reward_funcs = resolve_reward_names(reward_funcs)  # "math_accuracy" named; each function's output checked
        later = inspect.signature(trl.GRPOTrainer.__init__).bind_partial(*[None] * 6, *pargs).arguments | kwargs
        environment = later.get("environment_factory") is not None
        if not reward_funcs and not environment:  # TRL's words, before the model is built
            raise ValueError("No reward source provided. Pass `reward_funcs`, or an `environment_factory` whose "
                             f"environment defines a `get_reward` method (reward_funcs={reward_funcs!r}; e.g. "
                             '"math_accuracy", a reward model id).')  # fmt: skip
        peft_settings = checkpoints.plain(later.get("peft_config"))  # before PEFT fills in the wrapped model's name
        datasets = {"train_dataset": train_dataset, "eval_dataset": eval_dataset}
        for name, dataset in datasets.items():
            check_prompt_column(dataset, name, prompt_optional=environment)
            if later.get("rollout_func") is None:  # a rollout function may add the fields a reward reads
                check_reward_columns(reward_funcs, dataset, name)
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, *pargs, **kwargs)
        for name, dataset in datasets.items():
            check_chat_template(self.processing_class, dataset, self.model.config._name_or_path, name,
                                template_kwargs=self.args.chat_template_kwargs)  # fmt: skip
        install_cpu_colocate_weight_sync(self)
        self.run_settings = checkpoints.run_settings(self.args, trainer=type(self).__name__, model=given_model,
            reward_funcs=self.reward_funcs, s2t=getattr(self, "s2t", None), peft_config=peft_settings,
            train_dataset=train_dataset, dtype=getattr(self.model, "dtype", None))  # fmt: skip
        args = self.args  # what training_args.bin holds: no `*_token` value
        args.__getstate__ = lambda: {k: None if k.endswith("_token") else v for k, v in vars(args).items()
                                     if k != "__getstate__"}  # fmt: skip

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """`Trainer.train` as `output_dir`'s one writer, with the run files and an exact resume (`True`: the newest
        complete checkpoint). `ValueError`: another writer; no, an incomplete or another run's checkpoint; a link."""
        from ..run_folder.logs import JsonlLogCallback, NoLearningSignalCallback, add_run_file_callbacks
        from ..run_folder.rollout import RolloutStateCallback, load_rollout_state

        output_dir, checkpoint = self.args.output_dir, resume_from_checkpoint
        if self.args.should_save:  # first: the resume moves damaged checkpoints aside
            checkpoints.hold_run_folder(output_dir, trainer=self)
        try:
            if checkpoint is True:  # transformers takes the highest-numbered folder, whole or not
                checkpoint = checkpoints.resume_checkpoint(output_dir, self.args.save_only_model,
                                                           move_aside=self.args.should_save)  # fmt: skip
                if checkpoint is None:
                    raise ValueError(f"No complete checkpoint to resume from in output_dir={output_dir!r}.")
            elif isinstance(checkpoint, (str, os.PathLike)):
                checkpoint = os.fspath(checkpoint)
                checkpoints.check_checkpoint(checkpoint, f"resume_from_checkpoint={checkpoint!r}")
            if checkpoint:
                checkpoints.check_run_settings(checkpoint, self.run_settings)
                logging.getLogger(__name__).warning(f"Resuming training from {checkpoint}.")  # every check passed
            if write_run_files(self.args):
                add_run_file_callbacks(self)
            callbacks = self.callback_handler.callbacks
            for kind in (NoLearningSignalCallback, RolloutStateCallback):  # the rollout's after the run files'
                if not any(isinstance(callback, kind) for callback in callbacks):
                    self.add_callback(kind(self))
            rollout = next(callback for callback in callbacks if isinstance(callback, RolloutStateCallback))
            rollout.state = load_rollout_state(self, checkpoint) if checkpoint else None
            for callback in [c for c in callbacks if isinstance(c, JsonlLogCallback)]:  # a stopped run's last row
                callback.redone_after = rollout.state["last_logged"] if rollout.state else None  # is logged again
            with tiny_model_threads(self.model):
                return super().train(checkpoint, *args, **kwargs)
        finally:
            if self.args.should_save:
                checkpoints.hold_run_folder(output_dir, acquire=False, trainer=self)

    def _get_train_sampler(self, dataset=None):  # kept for the resume (`RolloutStateCallback`)
        self._train_sampler = super()._get_train_sampler(dataset)
        return self._train_sampler

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # a warning when none is a number
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.model.training and rewards.isnan().all():
            warnings.warn(f"No reward at step {self.state.global_step + 1}: no reward function "
                f"({', '.join(self.reward_func_names)}) gave any of the {len(rewards)} completions a value (every "
                "one None or NaN), so the step has no learning signal.", NoRewardWarning, 2)  # fmt: skip
        return rewards

    def _issue_warnings_after_load(self, load_result):  # without the weights tied to another (never saved)
        tied = getattr(self.model, "all_tied_weights_keys", None) or {}
        missing = [key for key in load_result.missing_keys if key not in tied]
        super()._issue_warnings_after_load(load_result._replace(missing_keys=missing))

    def _save_checkpoint(self, model, trial):  # and the rollout state, between two writes of the run record
        from ..run_folder.rollout import save_rollout_state

        folder = os.path.join(self._get_output_dir(trial), f"checkpoint-{self.state.global_step}")
        record = {"settings": self.run_settings, "save_only_model": self.args.save_only_model}
        if self.args.should_save:
            checkpoints.refuse_links(self.args.output_dir)
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(folder, "trainer_state.json"))
            checkpoints.write_run_record(folder, **record, files=None)
        super()._save_checkpoint(model, trial)
        if not self.args.save_only_model:  # a model-only checkpoint does not resume
            save_rollout_state(self, folder)
        if self.args.should_save:
            names = [n for n in os.listdir(folder) if os.path.isfile(os.path.join(folder, n))]
            other = rf"^rollout_state_(?!{self.accelerator.process_index}\.)"  # other processes write theirs
            skip = re.compile(rf"^{re.escape(checkpoints.RUN_RECORD)}|rng_state_\d+\.pth$|{other}")
            checkpoints.write_run_record(folder, **record, files=sorted(n for n in names if not skip.match(n)))

    def save_model(self, *args, **kwargs):
        if self.args.should_save:
            checkpoints.refuse_links(self.args.output_dir)
        return super().save_model(*args, **kwargs)

    def save_metrics(self, *args, **kwargs):
        if self.args.should_save:
            checkpoints.refuse_links(self.args.output_dir)
        return super().save_metrics(*args, **kwargs)

    def evaluation_loop(self, *args, **kwargs):  # of evaluate() and predict()
        with tiny_model_threads(self.model):
            return super().evaluation_loop(*args, **kwargs)

    def create_model_card(self, model_name=None, dataset_name=None, tags=None, public: bool = False):
        """Write `output_dir/README.md` never through a link; `public` (what `push_to_hub` uploads): no local path."""
        from ..run_folder.card import model_card

        if self.is_world_process_zero():
            os.makedirs(self.args.output_dir, exist_ok=True)
            card = model_card(self, model_name, dataset_name, tags, self.eval_record, public=public)
            with checkpoints.open_run_file(os.path.join(self.args.output_dir, "README.md")) as f:
                f.write(str(card))

    def push_to_hub(self, *args, **kwargs):  # with the public card
        return super().push_to_hub(*args, public=True, **kwargs)

    def end(self):
        """`Trainer.end` without the DDP wrapper (not DeepSpeed's or FSDP's), which would abort the process exit: the
        model stays usable, nothing may communicate afterwards. Call it once, last."""
        if not (self.is_deepspeed_enabled or self.is_fsdp_enabled):
            self.model_wrapped = self.model
            gc.collect()  # the wrapper sits in reference cycles
        self.accelerator.end_training()


class STAPOTrainer(_Additions, core.STAPOTrainer):
    """[`stapo_trl.core.STAPOTrainer`] (STAPO, arXiv:2602.15620), which it subclasses, with the paper's ablations, the
    diagnostics `s2t/entropy_p10` ... `p95`, `s2t/silenced_*_mean` (nats) and the token records. `model` may be a
    `builtin:` name, `reward_funcs` a name of `stapo_trl.rewards.REWARDS`, `args` any `GRPOConfig`. `ValueError`
    before a model is built: a bad dataset, reward, S2T value, `output_dir` or `vllm_mode`; no chat template."""

    _s2t_modes, _nonfinite_warned = STAPOConfig._s2t_modes, False

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, eval_dataset=None, *pargs, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = STAPOConfig(f"{os.path.basename(os.path.normpath(str(name).removeprefix('builtin:')))}-STAPO")
        core.stapo_config.refuse_paths_around_the_mask(args)  # before a model is built
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, *pargs, **kwargs)

    def _compute_s2t_mask(self, per_token_logps, entropies, advantages, loss_mask, completion_ids):
        from ..run_folder.logs import SpuriousTokenLogger

        tensors = (per_token_logps, entropies, advantages, loss_mask)
        result = (ablation_mask(*tensors, **vars(self.s2t), gather=self._gather) if self.s2t.mode in ABLATIONS
                  else super()._compute_s2t_mask(*tensors, completion_ids))  # fmt: skip
        mode = "train" if self.model.training else "eval"
        for name, value in diagnostic_metrics(result, *tensors[:2], loss_mask, self.accelerator.reduce).items():  # sum
            self._metrics[mode][name].append(value)
        if result.num_nonfinite and not self._nonfinite_warned:
            self._nonfinite_warned = True
            warnings.warn(f"{result.num_nonfinite} loss tokens have a non-finite log-probability or entropy: never "
                          "S2T candidates, but a sign of trouble upstream (logits, dtype, LM head).",
                          stacklevel=2)  # fmt: skip
        for callback in self.callback_handler.callbacks if mode == "train" else []:
            if isinstance(callback, SpuriousTokenLogger):
                callback.record(result, *tensors, completion_ids)
        return result


class GRPOBaselineTrainer(_Additions, trl.GRPOTrainer):
    """TRL's `GRPOTrainer`, its maths untouched, with this package's additions: `stapo-train`'s `trainer: grpo`."""
