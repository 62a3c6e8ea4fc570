"""[`BenchmarkEvalCallback`]: a small periodic benchmark evaluation during training, logged as
`eval/<benchmark>/avg@<k>`."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch.distributed as dist
from transformers import Trainer, TrainerCallback
from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

from .generation import DecodingSetting, evaluate_problems, hf_generate
from .metrics import pass_k_values
from .tasks import BenchmarkProblem, get_benchmark_spec, load_benchmark


logger = logging.getLogger(__name__)


class BenchmarkEvalCallback(TrainerCallback):
    r"""Small periodic benchmark evaluation during training, logged as `eval/<benchmark>/avg@<k>`.

    Every `every_n_steps` optimizer steps (default: `args.eval_steps`, else `args.logging_steps`; also at step 0
    when `args.eval_on_start`), the main process samples `samples` completions for each problem of `benchmark`
    (first `limit` problems) with the training model, grades them, and logs `eval/<benchmark>/avg@<k>` and
    `eval/<benchmark>/pass@<k>` (fractions in [0, 1]).

    Distributed runs: only global rank 0 generates (with the unwrapped model, which needs no collective); then
    every rank takes part in exactly one `torch.distributed.broadcast_object_list` that carries the metrics (or
    rank 0's error, re-raised everywhere), so all ranks stay in step and log the same values. Ranks wait in that
    broadcast while rank 0 generates: keep the eval small against the process-group timeout. Sharded parameters
    (DeepSpeed ZeRO-3, FSDP) would need every rank inside `generate`: they are refused at `on_train_begin`;
    evaluate saved checkpoints with `stapo-eval` instead.

    Logging: with a trainer attached ([`attach`] or `trainer=`), the metrics go through the base
    [`~transformers.Trainer.log`] (into `state.log_history` and to every reporter, without flushing TRL's pending
    training metrics, and keeping the step's own training log); without one they are appended to
    `state.log_history` only. `BenchmarkEvalCallback("aime24", samples=4).attach(trainer)`, then `trainer.train()`:
    `log_history` gets `{"eval/aime24/avg@4": ..., "eval/aime24/pass@4": ..., "step": ...}`.

    Args:
        benchmark (`str`): a [`stapo_trl.evaluation.tasks.BENCHMARKS`] name (`tiny-math` = the built-in task's test
            split).
        data_dir (`str` or `None`): local benchmark files (see [`stapo_trl.evaluation.tasks.load_benchmark`]).
        samples (`int`): samples per problem (k of avg@k).
        every_n_steps (`int` or `None`): evaluation period in optimizer steps.
        limit (`int` or `None`): first problems only (default 32).
        max_new_tokens (`int`): generation budget per sample.
        temperature (`float`): sampling temperature (paper: 1.0).
        top_p (`float`): nucleus mass (paper: 1.0).
        batch_size (`int`): sequences per `generate` call.
        seed (`int`): base sampling seed (plus the step, so each evaluation differs but re-runs reproduce).
        problems (`Sequence[BenchmarkProblem]` or `None`): explicit problems instead of `benchmark`/`data_dir`.
        trainer ([`~transformers.Trainer`] or `None`): the trainer to log through.
    """

    def __init__(
        self,
        benchmark: str = "aime24",
        data_dir: str | None = None,
        samples: int = 4,
        every_n_steps: int | None = None,
        limit: int | None = 32,
        max_new_tokens: int = 1024,
        temperature: float = 1.0,
        top_p: float = 1.0,
        batch_size: int = 64,
        seed: int = 0,
        problems: Sequence[BenchmarkProblem] | None = None,
        trainer=None,
    ):
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}.")
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1 or None, got {every_n_steps}.")
        self.benchmark = get_benchmark_spec(benchmark).name if problems is None else benchmark
        self.data_dir = data_dir
        self.samples = samples
        self.every_n_steps = every_n_steps
        self.limit = limit
        self.max_new_tokens = max_new_tokens
        self.decoding = DecodingSetting(f"t{temperature}-p{top_p}", temperature, top_p)
        self.batch_size = batch_size
        self.seed = seed
        self._problems = list(problems) if problems is not None else None
        self.trainer = trainer

    def attach(self, trainer) -> BenchmarkEvalCallback:
        """Log through `trainer` and register this callback on it when it is not registered yet."""
        self.trainer = trainer
        if self not in trainer.callback_handler.callbacks:
            trainer.add_callback(self)
        return self

    def _period(self, args, state) -> int:
        if self.every_n_steps is not None:
            return self.every_n_steps
        period = args.eval_steps or args.logging_steps
        if period < 1:  # a fraction of the run, as TrainingArguments allows
            period = math.ceil(period * state.max_steps)
        return max(1, int(period))

    def on_train_begin(self, args, state, control, **kwargs):
        if is_deepspeed_zero3_enabled() or args.fsdp:
            raise ValueError(
                "BenchmarkEvalCallback generates on rank 0 only, which cannot work with sharded parameters "
                "(DeepSpeed ZeRO-3 / FSDP). Remove the callback and evaluate checkpoints with `stapo-eval`."
            )
        if args.eval_on_start:
            self._evaluate(args, state, control, kwargs.get("model"), kwargs.get("processing_class"))

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step > 0 and state.global_step % self._period(args, state) == 0:
            self._evaluate(args, state, control, kwargs.get("model"), kwargs.get("processing_class"))
        return control

    def _run(self, model, tokenizer, step: int) -> dict[str, float]:
        if self._problems is None:
            self._problems = load_benchmark(self.benchmark, data_dir=self.data_dir, limit=self.limit)
        problems = self._problems[: self.limit] if self.limit else self._problems
        table, _ = evaluate_problems(
            lambda texts, **kw: hf_generate(model, tokenizer, texts, batch_size=self.batch_size, **kw),
            tokenizer,
            problems,
            n=self.samples,
            decoding=self.decoding,
            max_new_tokens=self.max_new_tokens,
            seed=self.seed + step,
        )
        k = self.samples
        prefix = f"eval/{self.benchmark}"
        top_k = pass_k_values(k)[-1]
        return {
            f"{prefix}/avg@{k}": table[f"avg@{k}"],
            f"{prefix}/pass@{top_k}": table["pass@k"][str(top_k)],
            f"{prefix}/num_grader_errors": float(table["num_grader_errors"]),
        }

    def _evaluate(self, args, state, control, model, tokenizer) -> None:
        payload: dict[str, Any] = {}
        if state.is_world_process_zero:
            try:
                if model is None or tokenizer is None:
                    raise ValueError("BenchmarkEvalCallback needs the trainer's model and processing_class.")
                payload = {"metrics": self._run(model, tokenizer, state.global_step)}
            except Exception as e:  # noqa: BLE001 - re-raised on every rank after the broadcast below
                payload = {"error": f"{type(e).__name__}: {e}"}
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            box = [payload]
            dist.broadcast_object_list(box, src=0)  # every rank, every evaluation: exactly one collective
            payload = box[0]
        if "error" in payload:
            raise RuntimeError(f"BenchmarkEvalCallback failed at step {state.global_step}: {payload['error']}")
        metrics = payload["metrics"]
        logger.info("step %d: %s", state.global_step, metrics)
        if self.trainer is not None:
            # The base Trainer.log: GRPOTrainer.log would flush TRL's pending training metrics mid-interval.
            # Its on_log event resets `control.should_log`, which the trainer's own logging of this step still
            # needs (regression: the step's training log went missing): keep the flag.
            should_log = control.should_log if control is not None else None
            Trainer.log(self.trainer, dict(metrics))
            if control is not None:
                control.should_log = should_log
        else:
            state.log_history.append({**metrics, "step": state.global_step})
