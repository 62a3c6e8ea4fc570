"""`STAPOScriptArguments`: the fields of a `stapo-train` recipe that are neither `STAPOConfig` nor `ModelConfig` fields
(trainer, rewards, data, before/after evaluation). A new command-line flag of `stapo-train` is a field here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from trl import ScriptArguments


TRAINERS = ("stapo", "grpo")


@dataclass
class STAPOScriptArguments(ScriptArguments):
    """Script arguments of `stapo-train`: which trainer, which rewards, which data, and the before/after evaluation. The
    inherited `dataset_name`, `dataset_config`, `dataset_train_split` and `dataset_test_split` select the data;
    `dataset_streaming` is not supported. Everything about the optimisation is in [`~stapo_trl.STAPOConfig`].

    Args:
        trainer (`str`, *optional*, defaults to `"stapo"`):
            `"stapo"` ([`~stapo_trl.STAPOTrainer`]) or `"grpo"` (a plain [`~trl.GRPOTrainer`]; `s2t_*` keys are
            then an error). The paper's baselines use `"stapo"` with `s2t_mode: "off"`: plain GRPOTrainer equals it
            only when `steps_per_generation == gradient_accumulation_steps` (otherwise TRL's `dapo` divides each
            update by the rollout batch's average token count).
        reward_funcs (`list[str]`, *optional*, defaults to `["math_accuracy"]`):
            Reward functions: names of `stapo_trl.rewards.REWARDS` or dotted import paths (`my_pkg.rewards.fn`).
            The default is the paper's binary rule-based reward alone (last `\\boxed{}` verified against the gold
            answer, STAPO Sec. 4.1); the paper uses no format reward. Weights: `reward_weights`.
        prompt_column (`str`, *optional*, defaults to `"problem"`): column holding the problem text (or a chat).
            Ignored for `builtin:` datasets.
        solution_column (`str`, *optional*, defaults to `"answer"`):
            Column holding the gold answer; dotted names reach into struct columns (`reward_model.ground_truth`).
            Ignored for `builtin:` datasets.
        instruction (`str`, *optional*):
            Text appended to every problem (training and evaluation). `None`: the paper's suffix asking for
            step-by-step reasoning and the final answer in `\\boxed{}` (`stapo_trl.data.INSTRUCTION`); `""`: none.
        strip_dapo_instruction (`bool`, *optional*, defaults to `False`):
            Remove DAPO-Math-17k's own "Answer: $Answer" instruction from every problem before appending
            `instruction` (`stapo_trl.data.remove_dapo_instruction`; a no-op on problems without it).
        max_prompt_tokens (`int`, *optional*):
            Drop the training prompts longer than this many tokens (chat template included); the paper caps prompts
            at 1,024. TRL 1.x no longer truncates prompts. `None`: no limit.
        max_train_samples (`int`, *optional*): keep only the first N training problems (before `max_prompt_tokens`).
        eval_before_after (`bool`, *optional*, defaults to `False`):
            Measure held-out avg@k on `dataset_test_split` before and after training (transformers `generate`,
            sampled) and write `eval.json`. For benchmark numbers use `stapo-eval`.
        eval_num_problems (`int`, *optional*, defaults to `200`): held-out problems (the first N of the test split).
        eval_num_samples (`int`, *optional*, defaults to `4`): k, completions sampled per problem (avg@k: their mean).
        eval_temperature (`float`, *optional*, defaults to `1.0`): sampling temperature of the evaluation (the paper's
            first decoding setting is 1.0 / top-p 1.0).
        eval_top_p (`float`, *optional*, defaults to `1.0`): top-p of the evaluation sampling.
        eval_max_new_tokens (`int`, *optional*): generation budget of the evaluation; `None`: `max_completion_length`.
        eval_batch_size (`int`, *optional*, defaults to `64`): problems per `generate` call (each yields k).
        benchmark_eval (`str`, *optional*):
            A benchmark evaluated periodically during training by [`~stapo_trl.evaluation.callback.BenchmarkEvalCallback`] (a
            `stapo_trl.evaluation.tasks.BENCHMARKS` name: `aime24`, `math500`, ..., or `tiny-math`), logged as
            `eval/<benchmark>/avg@k` and `pass@k` into the log history and `metrics.jsonl`. Sampling as the
            before/after evaluation (`eval_temperature`, `eval_top_p`, `eval_max_new_tokens`). `None`: off. Not with
            DeepSpeed ZeRO-3 or FSDP (the callback generates on rank 0): refused before the model is built, and by the
            dry run of a recipe whose `# launch:` line names such an accelerate config.
        benchmark_eval_data_dir (`str`, *optional*): folder with local benchmark files (`None`: the Hub, or built in).
        benchmark_eval_steps (`int`, *optional*): period in optimizer steps; `None`: `eval_steps`, else `logging_steps`.
        benchmark_eval_samples (`int`, *optional*, defaults to `4`): k, samples per problem.
        benchmark_eval_limit (`int`, *optional*, defaults to `32`): only the first N problems of the benchmark.
        torch_num_threads (`int`, *optional*):
            CPU threads of torch (`torch.set_num_threads`, also exported as `OMP_NUM_THREADS` to child processes);
            `None` keeps torch's default. The CPU demo uses 1: a tiny model's operations are too small to gain from
            threads, and when other processes share the cores, OpenMP threads waiting on each other make 2 threads
            up to 20x slower than 1.
    """

    trainer: Literal["stapo", "grpo"] = field(
        default="stapo",
        metadata={
            "help": "'stapo' (STAPOTrainer, S2T mask in the loss; with s2t_mode off the like-for-like baseline) or "
            "'grpo' (plain GRPOTrainer; equal to s2t_mode off only when steps_per_generation = GA; s2t_* keys are "
            "then an error).",
            "choices": list(TRAINERS),
        },
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: ["math_accuracy"],
        metadata={
            "help": "Reward functions: names of stapo_trl.rewards.REWARDS or dotted import paths. Default: the "
            "paper's binary math-accuracy reward alone (no format reward). Weights: reward_weights."
        },
    )
    prompt_column: str = field(
        default="problem",
        metadata={"help": "Column with the problem text (or a chat). Ignored for builtin: datasets."},
    )
    solution_column: str = field(
        default="answer",
        metadata={
            "help": "Column with the gold answer (dotted names reach into struct columns, e.g. "
            "'reward_model.ground_truth'). Ignored for builtin: datasets."
        },
    )
    instruction: str | None = field(
        default=None,
        metadata={
            "help": "Text appended to every problem. Default (None): the paper's step-by-step / \\boxed{} suffix "
            "(stapo_trl.data.INSTRUCTION). Empty string: no instruction."
        },
    )
    strip_dapo_instruction: bool = field(
        default=False,
        metadata={
            "help": "Remove DAPO-Math-17k's own 'Answer: $Answer' instruction from every problem before appending "
            "`instruction` (no-op on problems without it)."
        },
    )
    max_prompt_tokens: int | None = field(
        default=None,
        metadata={
            "help": "Drop training prompts longer than this many tokens (chat template included; paper: 1024). TRL "
            "no longer truncates prompts. None: no limit."
        },
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Keep only the first N training problems (None: all)."}
    )
    eval_before_after: bool = field(
        default=False,
        metadata={
            "help": "Measure held-out avg@k on dataset_test_split before and after training (sampled with "
            "transformers generate) and write eval.json."
        },
    )
    eval_num_problems: int = field(
        default=200, metadata={"help": "Held-out problems evaluated (first N of the split)."}
    )
    eval_num_samples: int = field(default=4, metadata={"help": "k: completions sampled per held-out problem (avg@k)."})
    eval_temperature: float = field(default=1.0, metadata={"help": "Evaluation sampling temperature (paper: 1.0)."})
    eval_top_p: float = field(default=1.0, metadata={"help": "Evaluation top-p (paper: 1.0)."})
    eval_max_new_tokens: int | None = field(
        default=None, metadata={"help": "Evaluation generation budget (None: max_completion_length)."}
    )
    eval_batch_size: int = field(default=64, metadata={"help": "Held-out problems per generate call."})
    benchmark_eval: str | None = field(
        default=None,
        metadata={
            "help": "Benchmark evaluated periodically during training (a stapo_trl.evaluation.tasks.BENCHMARKS name, e.g. "
            "aime24, math500, tiny-math), logged as eval/<benchmark>/avg@k. None: off. Not with ZeRO-3 / FSDP."
        },
    )
    benchmark_eval_data_dir: str | None = field(
        default=None, metadata={"help": "Folder with local benchmark files (None: the Hub or the built-in task)."}
    )
    benchmark_eval_steps: int | None = field(
        default=None,
        metadata={"help": "Benchmark evaluation period in optimizer steps (None: eval_steps, else logging_steps)."},
    )
    benchmark_eval_samples: int = field(default=4, metadata={"help": "k: benchmark samples per problem."})
    benchmark_eval_limit: int | None = field(
        default=32, metadata={"help": "Only the first N benchmark problems (None: all)."}
    )
    torch_num_threads: int | None = field(
        default=None,
        metadata={
            "help": "CPU threads of torch (torch.set_num_threads; also OMP_NUM_THREADS for child processes). None: "
            "torch's default. The CPU demo uses 1 (tiny ops gain nothing from threads; shared cores thrash)."
        },
    )
