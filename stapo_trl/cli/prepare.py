"""`stapo-train`'s steps before its model ([`PreparedRun`]): a run stops at the first failure, a dry run lists all."""

from __future__ import annotations

import logging
import os
import time
from functools import partial
from math import gcd
from pathlib import Path

from .. import data
from ..data import load_prompt_dataset  # by name: the tests' guard of "nothing read yet" patches it here
from ..evaluation.tasks import benchmark_dataset, load_benchmark
from ..integrations.hub import check_hub_access, check_hub_dataset
from ..models import builtin_model_dir, check_model_available, check_model_name_or_path, resolve_model_path
from ..models.cache import weight_files
from ..rewards import get_reward_funcs
from ..run_folder import checkpoints


def benchmark_eval_error(s, a, num_processes: int, num_problems: int | None = None) -> str | None:
    k, batch = s.benchmark_eval_samples, a.per_device_eval_batch_size * num_processes
    in_batch = f"per_device_eval_batch_size {a.per_device_eval_batch_size} x {num_processes} process(es)"
    if s.benchmark_eval is None:
        return None
    if a.num_generations_eval not in (None, k):
        return (f"benchmark_eval_samples={k} and num_generations_eval={a.num_generations_eval} disagree (TRL's "
                "evaluation samples num_generations_eval completions per problem): set benchmark_eval_samples: "
                f"{a.num_generations_eval} and remove num_generations_eval.")  # fmt: skip
    if s.benchmark_eval_steps is not None and a.eval_strategy == "epoch":
        return (f"benchmark_eval_steps={s.benchmark_eval_steps} evaluates every N steps, but eval_strategy is "
                "'epoch': remove one of them.")  # fmt: skip
    if batch % k:
        return (f"benchmark_eval_samples={k} must divide the global eval batch ({in_batch} = {batch} completions: TRL "
                f"evaluates whole groups of k): set per_device_eval_batch_size to a multiple of "
                f"{k // gcd(k, num_processes)}.")  # fmt: skip
    if num_problems is not None and num_problems * k % batch:
        step = batch // gcd(batch, k)
        return (f"benchmark_eval={s.benchmark_eval!r}: {num_problems} problems x {k} samples do not fill whole eval "
                f"batches of {batch} completions ({in_batch}), and TRL would average a partial last batch as a full "
                f"one: set benchmark_eval_limit to a multiple of {step} (e.g. "
                f"{max(step, num_problems // step * step)}).")  # fmt: skip


class PreparedRun:
    """A run's steps: a run (`plan=None`) raises the first failure; a dry run collects them in its `DryRunReport`."""

    STEPS = "_rewards _model _push _resume_from _dataset_name _folder _data _benchmark _prompts".split()
    PREFIXES = {"_model": "model_name_or_path: ", "_data": "dataset_name={s.dataset_name!r}: "}  # a dry run's errors

    def __init__(self, s, a, m, plan=None):
        self.s, self.a, self.m, self.dry = s, a, m, plan is not None
        self.processes = plan.num_processes if plan else a.world_size
        self.rollout_prompts = (plan or a).generation_batch_size // a.num_generations
        self.reward_funcs = self.model_path = self.train_dataset = self.test_dataset = self.eval_dataset = None
        self.checkpoint = self.total = self.kept = self.budget = None
        self.settings, self.held, self.seconds = {}, False, 0.0
        self.errors, self.warnings = (plan.errors, plan.warnings) if plan else ([], [])

    def run(self) -> PreparedRun:
        start, catch = time.perf_counter(), logging.Handler(logging.WARNING)
        catch.emit = lambda record: self.warnings.append(record.getMessage())
        if self.dry:
            logging.getLogger("stapo_trl").addHandler(catch)
        try:
            for name in self.STEPS:
                try:
                    getattr(self, name)()
                except Exception as e:  # datasets raises many types for an unreadable file
                    if not self.dry or not isinstance(e, (ValueError, OSError)) and name != "_data":
                        raise
                    self.errors.append(self.PREFIXES.get(name, "").format(s=self.s) + str(e))
            if not self.dry and self.a.should_save and not self.held:  # a new folder: once every check passed
                checkpoints.hold_run_folder(self.a.output_dir)
        except BaseException:
            if self.held:
                checkpoints.hold_run_folder(self.a.output_dir, acquire=False)
            raise
        finally:
            logging.getLogger("stapo_trl").removeHandler(catch)
        self.seconds = time.perf_counter() - start
        return self

    def _rewards(self):
        self.reward_funcs = get_reward_funcs(self.s.reward_funcs)

    def _model(self):
        if not (name := self.m.model_name_or_path):
            raise ValueError("model_name_or_path is not set: give a Hub id, a local model folder or "
                             "builtin:tiny-math.")  # fmt: skip
        if not self.dry:
            return check_model_available(name, self.m.model_revision)
        name = check_model_name_or_path(name)
        path = builtin_model_dir(name) if name.startswith("builtin:") else Path(name)
        self.model_path = str(path) if (path / "config.json").is_file() else None

    def _push(self):
        if self.a.push_to_hub:
            check_hub_access(self.a.hub_model_id, self.a.output_dir, self.a.hub_token, network=not self.dry)

    def _resume_from(self):
        if isinstance(path := self.a.resume_from_checkpoint, str) and path:
            checkpoints.check_checkpoint(path, f"resume_from_checkpoint={path!r}", self.a.save_only_model)

    def _dataset_name(self):
        if (name := self.s.dataset_name) is None:
            raise ValueError("dataset_name is not set: give builtin:tiny-math, a .json/.jsonl/.parquet/.csv file or a "
                             "Hub id.")  # fmt: skip
        local = data.is_local_dataset_file(name) or name.startswith(("/", "./", "../", "~"))
        if local and not os.path.exists(os.path.expanduser(name)):  # before a resume compares its digest
            raise FileNotFoundError(f"Dataset {'file' if data.is_local_dataset_file(name) else 'folder'} {name!r} "
                                    "does not exist.")  # fmt: skip

    def _folder(self):
        from trl import get_peft_config

        from ..core.stapo_config import s2t_settings

        s, a, m, out = self.s, self.a, self.m, self.a.output_dir
        if a.should_save:
            checkpoints.check_output_dir(out, refuse_user_files=True)
        if self.dry:
            return
        s2t = s2t_settings(a, a._s2t_modes) if s.trainer == "stapo" else None
        settings = checkpoints.run_settings(
            a, trainer={"stapo": "STAPOTrainer", "grpo": "GRPOBaselineTrainer"}[s.trainer], model=m.model_name_or_path,
            reward_funcs=self.reward_funcs, s2t=s2t, peft_config=get_peft_config(m),
            dtype=(a.model_init_kwargs or {}).get("dtype", m.dtype))  # fmt: skip
        del settings["train_dataset"]  # the data as the command names it
        name = s.dataset_name
        recorded = {"dataset_name": os.path.abspath(name) if os.path.exists(name) else name, **s.dataset_kwargs()}
        recorded |= {"dataset_train_split": s.dataset_train_split, "max_train_samples": s.max_train_samples}
        recorded |= {"max_prompt_tokens": s.max_prompt_tokens, "dataset_sha256": data.local_data_digest(name)}
        self.settings = settings | checkpoints.plain(recorded)
        if a.should_save and os.path.isdir(out):
            checkpoints.hold_run_folder(out)
            self.held = True
        newest = checkpoints.resume_checkpoint(out, a.save_only_model, move_aside=self.held)
        self.checkpoint = a.resume_from_checkpoint or newest
        if self.checkpoint is not None:
            checkpoints.check_run_settings(self.checkpoint, self.settings)
        elif model := next(iter(weight_files(sorted(os.listdir(out)) if os.path.isdir(out) else [])), None):
            raise ValueError(f"output_dir={out!r} holds a trained model ({model}) but no complete checkpoint to "
                             "resume: this run would train from the start and overwrite it. Give another output_dir, "
                             "or move the model away.")  # fmt: skip

    def _data(self):
        s, name, kwargs = self.s, self.s.dataset_name, self.s.dataset_kwargs()
        if not (name.startswith("builtin:") or os.path.exists(name) or data.is_local_dataset_file(name)):
            if self.dry:
                return
            check_hub_dataset(name)
        load = partial(load_prompt_dataset, name, **kwargs)
        self.train_dataset = load(split=s.dataset_train_split, limit=s.max_train_samples)
        self.total, periodic = len(self.train_dataset), self.a.eval_strategy != "no" and s.benchmark_eval is None
        if s.eval_before_after or periodic:
            self.test_dataset = load(split=s.dataset_test_split)
        if s.eval_before_after:
            self.eval_dataset = self.test_dataset.select(range(min(s.eval_num_problems, len(self.test_dataset))))
            if warning := data.evaluation_split(name, s.dataset_test_split)[1]:
                logging.getLogger(__name__).warning(warning)
        data.check_reward_columns(self.reward_funcs, self.train_dataset, name)
        if periodic:
            data.check_reward_columns(self.reward_funcs, self.test_dataset, f"{name} [{s.dataset_test_split}]")

    def _benchmark(self):
        s, a, name = self.s, self.a, self.s.benchmark_eval
        if name is None:
            return
        try:
            problems = None if self.dry else load_benchmark(name, s.benchmark_eval_data_dir, s.benchmark_eval_limit)
        except RuntimeError as e:
            raise ValueError(f"benchmark_eval={name!r}: {e}") from e
        if error := benchmark_eval_error(s, a, self.processes, None if problems is None else len(problems)):
            raise ValueError(error)
        if problems is not None:
            self.test_dataset = benchmark_dataset(problems, s.dataset_kwargs()["instruction"])
            data.check_reward_columns(self.reward_funcs, self.test_dataset, f"benchmark_eval={name!r}")
            if a.eval_strategy == "no" or s.benchmark_eval_steps is not None:
                a.eval_strategy, a.do_eval = type(a.eval_strategy).STEPS, True  # an IntervalStrategy
                a.eval_steps = s.benchmark_eval_steps or a.eval_steps or a.logging_steps
            a.num_generations_eval = s.benchmark_eval_samples

    def _prompts(self):
        """The chat template, the prompts over the token budget dropped, enough left for one rollout step."""
        from transformers import AutoConfig, AutoTokenizer

        s, a, m, train = self.s, self.a, self.m, self.train_dataset
        where = "in the train split" if s.max_train_samples is None else "with max_train_samples"
        self.model_path = self.model_path if self.dry else resolve_model_path(m.model_name_or_path)
        if self.model_path is not None:
            kwargs = {"revision": m.model_revision, "trust_remote_code": a.trust_remote_code}
            tokenizer = AutoTokenizer.from_pretrained(self.model_path, **kwargs)
            prompts = [{"prompt": data.format_prompt("1+1")}] if train is None else train
            template = (m.model_name_or_path, s.dataset_name, data.CLI_CHAT_TEMPLATE_FIX, a.chat_template_kwargs)
            data.check_chat_template(tokenizer, prompts, *template)
            positions = data.model_max_positions(AutoConfig.from_pretrained(self.model_path, **kwargs))
            self.budget = data.prompt_token_budget(positions, a.max_completion_length, s.max_prompt_tokens)
            if train is not None and self.budget is not None:
                train = data.filter_long_prompts(train, tokenizer, self.budget, a.chat_template_kwargs)
                self.train_dataset = train
                data.report_dropped(self.total, len(train), self.budget, what="training prompts")
                if len(train) < self.total:
                    where = f"after filtering (of {self.total}; prompt budget {self.budget} tokens)"
            self.kept = None if train is None else len(train)
        if train is not None and (num := len(train)) < self.rollout_prompts:
            raise ValueError(f"{num} prompt{'s' * (num != 1)} {where}; one rollout step needs {self.rollout_prompts} "
                             "(generation batch / num_generations), so nothing would be trained: give more prompts "
                             "(max_train_samples, max_prompt_tokens) or lower per_device_train_batch_size, "
                             "steps_per_generation or generation_batch_size.")  # fmt: skip


def prepare(script_args, training_args, model_args) -> PreparedRun:
    """Every step of [`PreparedRun`] for a run; raises the first failure (`ValueError` or `OSError`) in one line."""
    return PreparedRun(script_args, training_args, model_args).run()
