"""The batch geometry of a GRPO/STAPO run: how completions group into micro-steps, rollout steps and updates.

One object for the dry run ([`stapo_trl.cli.dry_run.validate_recipe`]) and the per-process-count tables of
`recipes/README.md` ([`BatchGeometry.readme_row`]).

Batch sizes count completions, as TRL does (`per_device_train_batch_size` counts completions, not prompts). The
generation batch (completions generated at once, all processes) is `generation_batch_size` when a recipe sets it,
else `per_device_train_batch_size x num_processes x steps_per_generation`; it must hold whole groups of
`num_generations` completions per prompt. The paper (STAPO Sec. 4.1) uses 256 prompts x 8 rollouts per rollout step
and 64-prompt updates.
"""

from __future__ import annotations

from dataclasses import dataclass


# The paper's batch geometry (STAPO Sec. 4.1): 256 prompts x 8 rollouts per rollout step, 64-prompt updates.
PAPER_PROMPTS_PER_ROLLOUT_STEP, PAPER_PROMPTS_PER_UPDATE, PAPER_NUM_GENERATIONS = 256, 64, 8


def divisors(n: int, minimum: int = 1) -> list[int]:
    """The divisors of `n` that are >= `minimum`, ascending."""
    return [d for d in range(minimum, n + 1) if n % d == 0]


@dataclass(frozen=True)
class BatchGeometry:
    """Batch sizes of one run on `num_processes` training processes (all counts are completions).

    Args:
        per_device_train_batch_size (`int`): completions per process per micro-step.
        num_processes (`int`): training processes (GPUs), vLLM server GPUs excluded.
        gradient_accumulation_steps (`int`): micro-steps per optimizer update.
        num_generations (`int`): completions per prompt.
        steps_per_generation (`int`, *optional*): micro-steps per rollout batch; `None` = `gradient_accumulation_steps`
            (TRL's default). Ignored when `generation_batch_size` is set.
        generation_batch_size (`int`, *optional*): a fixed generation batch (a recipe's own `generation_batch_size`);
            `None` derives it from the micro-batch and `steps_per_generation`.
    """

    per_device_train_batch_size: int
    num_processes: int
    gradient_accumulation_steps: int
    num_generations: int
    steps_per_generation: int | None = None
    generation_batch_size: int | None = None

    @property
    def global_micro_batch(self) -> int:
        """Completions per micro-step, all processes."""
        return self.per_device_train_batch_size * self.num_processes

    @property
    def micro_steps_per_generation(self) -> int:
        """Micro-steps per rollout batch (derived from a fixed `generation_batch_size` when one is set)."""
        if self.generation_batch_size is not None:
            return self.generation_batch_size // self.global_micro_batch
        return self.steps_per_generation or self.gradient_accumulation_steps

    @property
    def generation_batch(self) -> int:
        """Completions per rollout step, all processes."""
        if self.generation_batch_size is not None:
            return self.generation_batch_size
        return self.global_micro_batch * self.micro_steps_per_generation

    @property
    def completions_per_optimizer_step(self) -> int:
        """Completions per optimizer update, all processes."""
        return self.global_micro_batch * self.gradient_accumulation_steps

    @property
    def prompts_per_rollout_step(self) -> float:
        """Prompts per rollout step (`generation_batch / num_generations`)."""
        return self.generation_batch / self.num_generations

    @property
    def prompts_per_optimizer_step(self) -> float:
        """Prompts per optimizer update (`completions_per_optimizer_step / num_generations`)."""
        return self.completions_per_optimizer_step / self.num_generations

    @property
    def optimizer_steps_per_rollout_step(self) -> float:
        """Optimizer updates per rollout batch (`steps_per_generation / gradient_accumulation_steps`; NaN at 0)."""
        grad_accum = self.gradient_accumulation_steps
        return self.micro_steps_per_generation / grad_accum if grad_accum else float("nan")

    @property
    def holds_whole_groups(self) -> bool:
        """Whether the generation batch holds whole groups of `num_generations` (TRL refuses it otherwise)."""
        return self.num_generations >= 2 and self.generation_batch % self.num_generations == 0

    def valid_num_generations(self) -> list[int]:
        """The `num_generations` values (>= 2) that divide the generation batch."""
        return divisors(self.generation_batch, 2)

    def is_paper_geometry(self) -> bool:
        """256 prompts x 8 rollouts per rollout step and 64-prompt updates (STAPO Sec. 4.1)."""
        paper = (PAPER_PROMPTS_PER_ROLLOUT_STEP, PAPER_PROMPTS_PER_UPDATE, PAPER_NUM_GENERATIONS)
        return (self.prompts_per_rollout_step, self.prompts_per_optimizer_step, self.num_generations) == paper

    def readme_row(self) -> str:
        """The row of the `recipes/README.md` tables: `| N | per_device | grad_accum | steps_per_generation |`."""
        return (
            f"| {self.num_processes} | {self.per_device_train_batch_size} | {self.gradient_accumulation_steps} | "
            f"{self.micro_steps_per_generation} |"
        )


def too_few_prompts(num_prompts: int, prompts_per_rollout_step: int, where: str) -> str | None:
    """The error when the training prompts cannot fill one rollout step, else `None`.

    TRL's sampler yields whole rollout batches of `generation_batch_size / num_generations` prompts only (a partial last
    batch is dropped), so with fewer prompts training runs zero steps, exits 0 and saves the untouched model.

    Args:
        num_prompts (`int`): training prompts left (after `max_train_samples` and the prompt-length filter).
        prompts_per_rollout_step (`int`): `generation_batch_size // num_generations`, all processes.
        where (`str`): how the count was reached, for the message (`"after filtering"`, `"in the train split"`).

    Returns:
        `str` or `None`: e.g. `"1 prompt after filtering; one rollout step needs 8 (generation batch / num_generations):
        give more prompts or lower per_device_train_batch_size, steps_per_generation or generation_batch_size."`.
    """
    if num_prompts >= prompts_per_rollout_step:
        return None
    return (
        f"{num_prompts} prompt{'s' * (num_prompts != 1)} {where}; one rollout step needs {prompts_per_rollout_step} "
        "(generation batch / num_generations), so nothing would be trained: give more prompts (max_train_samples, "
        "max_prompt_tokens) or lower per_device_train_batch_size, steps_per_generation or generation_batch_size."
    )
