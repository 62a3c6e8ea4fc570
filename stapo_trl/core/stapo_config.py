"""`STAPOConfig`: `trl.GRPOConfig` plus the S2T fields of STAPO, with the paper's objective as defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from trl import GRPOConfig

from .s2t import S2T_MODES


S2T_SCOPES = ("optimizer_step", "generation_batch", "micro_batch")
S2T_POLICIES = ("rollout", "current")
# Loss types without a token-count denominator: the mask removes tokens from the numerator only.
CONSTANT_DENOMINATOR_LOSSES = ("dr_grpo", "luspo")
# TRL 1.16's loss types whose normalisation STAPO knows (the mask renormalises or, above, cannot).
KNOWN_LOSS_TYPES = ("dapo", "cispo", "vespo", "grpo", "sapo", "bnpo", "dr_grpo", "luspo")


@dataclass
class STAPOConfig(GRPOConfig):
    r"""
    Configuration class for the [`STAPOTrainer`].

    [STAPO](https://huggingface.co/papers/2602.15620) ("Stabilizing Reinforcement Learning for LLMs by Silencing Rare
    Spurious Tokens", Liu et al., 2026) only changes *which tokens count* in the GRPO loss: positive-advantage tokens
    that were sampled with a low probability at a low-entropy position ("spurious tokens") are removed from the
    numerator and the denominator of the token-mean loss. Every other field is inherited from [`~trl.GRPOConfig`];
    only the fields below are new, and four inherited defaults change to the paper's objective (the DAPO/JustRL
    objective: clip-higher, token-level normalisation, no KL): `loss_type="dapo"`, `epsilon=0.2`,
    `epsilon_high=0.28`, `beta=0.0`.

    Parameters:
        > Parameters that control the S2T mask (STAPO Sec. 3)

        s2t_prob_threshold (`float`, *optional*, defaults to `0.002`):
            τ_p: a positive-advantage token is a *candidate* when the probability of the sampled token under the
            current policy is strictly below this value. Range (0, 1]. Paper default 0.002. The probabilities come
            from the temperature-scaled logits used by the loss, so the threshold is calibrated at
            `temperature=1.0`.
        s2t_entropy_quantile (`float`, *optional*, defaults to `0.75`):
            q: the entropy threshold τ_h is the q-quantile (linear interpolation) of the candidates' entropies (nats)
            over the whole scope (all processes). Candidates with entropy strictly below τ_h are silenced, so about
            the bottom q of candidates by entropy are silenced and the top 1 - q (the exploratory ones) are kept.
            Range [0, 1]. Paper default 0.75 (v4/v5); v1 used 0.80.
        s2t_mode (`str`, *optional*, defaults to `"low_entropy"`):
            Which candidates are silenced: `"low_entropy"` (STAPO), `"high_entropy"` (the paper's ablation: silence
            candidates above the (1 - q)-quantile), `"all_low_prob"` (the paper's ablation: silence every candidate),
            `"off"` (silence nothing, still log the counts). With `"off"` the loss is the same trainer's and
            normaliser's with the mask removed: the like-for-like baseline. It equals plain `GRPOTrainer`'s only when
            `steps_per_generation == gradient_accumulation_steps` (otherwise TRL's `dapo` divides each update by the
            rollout batch's average count, STAPO by the update's exact count).
        s2t_scope (`str`, *optional*, defaults to `"optimizer_step"`):
            Over which tokens τ_h is taken and which count normalises `dapo`/`cispo`/`vespo`.
            `"optimizer_step"` (the paper's mini-batch, veRL's `ppo_mini_batch`): τ_h is the q-quantile of the
            candidates of one optimizer update, i.e. its `gradient_accumulation_steps` micro-batches (the rows TRL's
            shuffle really puts in that update) on all processes; the normaliser is that update's global kept-token
            count. `"generation_batch"`: τ_h over the whole rollout batch (all `steps_per_generation` micro-batches,
            all processes); the normaliser is still each update's exact global kept-token count. The two coincide
            when `steps_per_generation == gradient_accumulation_steps` (TRL's default). When `steps_per_generation` is
            not a multiple of `gradient_accumulation_steps` an update spans rollout batches: both scopes then fall
            back to τ_h over the rollout batch and TRL's estimated normaliser (a warning says so).
            `"micro_batch"`: the mask is built inside the loss from the training forward (current policy, no extra
            forward), τ_h over one micro-step on all processes; the normaliser is the update's global *loss*-token
            count (not the kept count: the later micro-steps' masks are unknown then), which exceeds the exact kept
            count by the update's silenced tokens (a relative difference equal to the update's silenced ratio,
            ~1e-4 at the paper's rates). With `s2t_mode="off"` all three scopes give the same loss and gradients.
        s2t_policy (`str`, *optional*, defaults to `"rollout"`):
            Under which weights p and H are taken for the `"optimizer_step"` and `"generation_batch"` scopes.
            `"rollout"`: the no-grad scoring forward of the rollout batch (TRL's old-log-prob forward when it runs,
            otherwise one no-grad forward per rollout batch), i.e. the policy that sampled the completions, as
            veRL's old-log-prob pass. `"current"`: recomputed under the current weights at the start of each
            optimizer update (one no-grad forward of the update's micro-batches), so updates 2..k of a rollout use
            the policy they update; needs `s2t_scope="optimizer_step"`. The paper does not say which it used. In
            TRL's default geometry (`steps_per_generation` = GA = `num_iterations` = 1) the two policies are the same
            weights, and p and H come from the training forward itself, with no extra forward
            ([`s2t_values_source`]).
            `"micro_batch"` always uses the current policy (the training forward).
        s2t_diagnostics (`bool`, *optional*, defaults to `True`):
            Log the extra `s2t/` diagnostics (entropy quantiles of the loss tokens, mean probability and entropy of
            silenced tokens, logit-gradient-norm shares of candidates and silenced tokens); the policy's LM head then
            also returns log Σ_v π_v² from the same pass over the vocabulary. The mask and the loss do not depend on
            it. Off: only the mask counts (`s2t/silenced_ratio`, ...) are logged.
    """

    # Paper objective (STAPO Sec. 4.1: GRPO with clip-higher, token-level normalisation, no KL, as DAPO/JustRL).
    loss_type: str = field(
        default="dapo",
        metadata={
            "help": "Loss formulation, as in `GRPOConfig`. STAPO default: 'dapo' (global token mean; the S2T mask "
            "removes silenced tokens from numerator and denominator for every loss type)."
        },
    )
    epsilon: float = field(default=0.2, metadata={"help": "Lower clipping epsilon. Paper: 0.2."})
    epsilon_high: float | None = field(
        default=0.28, metadata={"help": "Upper clipping epsilon (clip-higher). Paper: 0.28."}
    )
    beta: float = field(default=0.0, metadata={"help": "KL coefficient. Paper: 0.0 (no KL, no reference model)."})

    # > Parameters that control the S2T mask
    s2t_prob_threshold: float = field(
        default=0.002,
        metadata={
            "help": "tau_p: positive-advantage tokens sampled with probability strictly below this value are "
            "candidates for silencing. Range (0, 1]. Paper default 0.002 (calibrated at temperature 1.0)."
        },
    )
    s2t_entropy_quantile: float = field(
        default=0.75,
        metadata={
            "help": "q: tau_h is the q-quantile (linear interpolation) of the candidates' entropies (nats) over the "
            "scope and all processes; candidates with entropy < tau_h are silenced. Range [0, 1]. Paper default "
            "0.75 (v4/v5); v1 used 0.80."
        },
    )
    s2t_mode: Literal["low_entropy", "high_entropy", "all_low_prob", "off"] = field(
        default="low_entropy",
        metadata={
            "help": "Which candidates are silenced: 'low_entropy' (STAPO), 'high_entropy' (ablation, above the "
            "(1-q)-quantile), 'all_low_prob' (ablation, every candidate), 'off' (none; counts still logged).",
            "choices": list(S2T_MODES),
        },
    )
    s2t_scope: Literal["optimizer_step", "generation_batch", "micro_batch"] = field(
        default="optimizer_step",
        metadata={
            "help": "Tokens over which tau_h is taken and the kept-token normaliser counted. 'optimizer_step' (the "
            "paper's mini-batch): the candidates of one optimizer update (its GA micro-batches, all processes), "
            "normalised by that update's kept-token count. 'generation_batch': tau_h over the whole rollout batch, "
            "each update normalised by its own kept count. 'micro_batch': from the training forward (current policy), "
            "tau_h per micro-step, normalised by the update's loss-token count.",
            "choices": list(S2T_SCOPES),
        },
    )
    s2t_policy: Literal["rollout", "current"] = field(
        default="rollout",
        metadata={
            "help": "Weights under which p and H are taken: 'rollout' (the rollout batch's no-grad scoring forward, "
            "reused from TRL's old-log-prob forward when it runs) or 'current' (recomputed at the start of each "
            "optimizer update: one no-grad forward per update; needs s2t_scope optimizer_step).",
            "choices": list(S2T_POLICIES),
        },
    )
    s2t_diagnostics: bool = field(
        default=True,
        metadata={
            "help": "Log the extra s2t/ diagnostics (entropy quantiles, silenced-token means, logit-gradient-norm "
            "shares). The mask and the loss do not depend on it."
        },
    )

    def __post_init__(self):
        check_s2t_value_types(self)
        super().__post_init__()
        check_loss_type(self.loss_type)
        if not 0.0 < self.s2t_prob_threshold <= 1.0:
            raise ValueError(
                f"s2t_prob_threshold={self.s2t_prob_threshold!r} is out of range: it is a probability threshold "
                "tau_p and must be in (0, 1]. The paper uses 0.002."
            )
        if not 0.0 <= self.s2t_entropy_quantile <= 1.0:
            raise ValueError(
                f"s2t_entropy_quantile={self.s2t_entropy_quantile!r} is out of range: it is the quantile q and must "
                "be in [0, 1]. The paper uses 0.75 (0.80 in v1)."
            )
        if self.s2t_mode not in S2T_MODES:
            raise ValueError(f"s2t_mode={self.s2t_mode!r} is not one of {list(S2T_MODES)}.")
        if self.s2t_scope not in S2T_SCOPES:
            raise ValueError(f"s2t_scope={self.s2t_scope!r} is not one of {list(S2T_SCOPES)}.")
        if self.s2t_policy not in S2T_POLICIES:
            raise ValueError(f"s2t_policy={self.s2t_policy!r} is not one of {list(S2T_POLICIES)}.")
        if self.s2t_policy == "current" and self.s2t_scope == "generation_batch":
            raise ValueError(
                "s2t_policy='current' needs s2t_scope='optimizer_step': with 'generation_batch' one mask covers "
                "several optimizer updates, so there is no single current policy. Use s2t_scope: optimizer_step."
            )


# Where the S2T mask's p and H come from in training (`s2t_values_source`), with what each costs.
S2T_VALUES_SOURCES = {
    "training_forward": "the loss's own forward (no extra forward)",
    "old_logps_forward": "TRL's no-grad old-log-prob forward of the rollout batch (no extra forward)",
    "scoring_forward": "one extra no-grad forward per rollout batch",
    "current_forward": "one extra no-grad forward per optimizer update (s2t_policy='current')",
}


def s2t_values_source(args: STAPOConfig, steps_per_generation: int | None = None) -> str:
    """Where [`STAPOTrainer`] takes the p and H of the S2T mask from in training: a key of `S2T_VALUES_SOURCES`.

    - `"training_forward"`: the loss's own forward, detached, with no extra forward: always for `s2t_scope=
      "micro_batch"`, and in TRL's default geometry (`steps_per_generation` = `gradient_accumulation_steps` =
      `num_iterations` = 1) for every scope and policy. There the optimizer update is one micro-batch scored under
      the weights that sampled it, so the training forward's values *are* the rollout policy's (and the current
      policy's): the mask is the one a scoring forward would give, bit for bit.
    - `"current_forward"`: `s2t_policy="current"` otherwise: one no-grad forward of each update's micro-batches.
    - `"old_logps_forward"`: TRL runs its own no-grad old-log-prob forward of the rollout batch (when
      `gradient_accumulation_steps` is not a multiple of `steps_per_generation * num_iterations`, e.g. the paper's
      `steps_per_generation` = 4 x GA, or with vLLM importance-sampling correction): its entropies are reused.
    - `"scoring_forward"`: otherwise (GA > 1 with `steps_per_generation` = GA): τ_h of an update needs the entropies
      of all its micro-batches before the first backward, so one extra no-grad forward per rollout batch runs.
      `s2t_scope="micro_batch"` avoids it (τ_h per micro-step, from the training forward).

    Args:
        args ([`STAPOConfig`]): the configuration.
        steps_per_generation (`int`, *optional*): overrides `args.steps_per_generation` (the dry run recomputes it
            for another number of processes when the recipe fixes `generation_batch_size`).

    Returns:
        `str`: the source.
    """
    steps_per_generation = steps_per_generation or args.steps_per_generation
    single_update = steps_per_generation == args.gradient_accumulation_steps == args.num_iterations == 1
    if args.s2t_scope == "micro_batch" or single_update:
        return "training_forward"
    if args.s2t_policy == "current":
        return "current_forward"
    generate_every = steps_per_generation * args.num_iterations
    if args.gradient_accumulation_steps % generate_every != 0 or (
        args.use_vllm and args.vllm_importance_sampling_correction
    ):
        return "old_logps_forward"
    return "scoring_forward"


def check_loss_type(loss_type: str) -> None:
    """Refuse a `loss_type` whose normalisation STAPO does not know (the S2T mask could not be applied to it).

    Raises:
        ValueError: `loss_type` is not one of `KNOWN_LOSS_TYPES`.
    """
    if loss_type not in KNOWN_LOSS_TYPES:
        raise ValueError(
            f"loss_type={loss_type!r} is not supported by STAPOTrainer: its normalisation is unknown to STAPO, so "
            f"the S2T mask could not be applied to it. Supported: {list(KNOWN_LOSS_TYPES)}."
        )


def check_s2t_value_types(args: STAPOConfig) -> None:
    """The `s2t_*` values a Python caller may pass with the wrong type: a string such as "false" would read as true,
    and a string threshold would fail later with a bare `TypeError`.

    Raises:
        ValueError: `s2t_diagnostics` is not a bool, or a threshold is not a number.
    """
    if not isinstance(args.s2t_diagnostics, bool):
        raise ValueError(
            f"s2t_diagnostics={args.s2t_diagnostics!r} must be a bool (True or False), got "
            f"{type(args.s2t_diagnostics).__name__}."
        )
    for name in ("s2t_prob_threshold", "s2t_entropy_quantile"):
        value = getattr(args, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name}={value!r} must be a number, got {type(value).__name__}.")


def partial_prompt_group_message(
    per_device_train_batch_size: int, num_processes: int, gradient_accumulation_steps: int, num_generations: int
) -> str | None:
    """The warning for an optimizer update that holds part of a prompt group (`None` when it holds whole groups).

    TRL only needs whole groups per rollout batch, but the paper's mini-batch (the set τ_h is taken over and the
    loss normalised by) is whole prompts: 64 prompts x 8 rollouts.
    """
    completions = per_device_train_batch_size * num_processes * gradient_accumulation_steps
    if completions % num_generations == 0:
        return None
    return (
        f"An optimizer update holds {completions} completions (per_device_train_batch_size "
        f"{per_device_train_batch_size} x {num_processes} processes x gradient_accumulation_steps "
        f"{gradient_accumulation_steps}), not a whole number of prompt groups of num_generations={num_generations}: "
        "the paper's mini-batches are whole prompts (64 prompts x 8). Make per_device_train_batch_size x processes x "
        f"gradient_accumulation_steps a multiple of {num_generations}."
    )


def untested_combination_warnings(
    args: STAPOConfig, steps_per_generation: int | None = None, num_processes: int | None = None
) -> list[str]:
    """The warnings for settings the paper never ran or where the mask cannot renormalise, one message each.

    The one source of these messages: [`STAPOTrainer`] warns each at construction and the dry run prints the same
    list. With `s2t_mode="off"` nothing is silenced, so there is nothing to warn about.

    Args:
        args ([`STAPOConfig`]): the configuration to check.
        steps_per_generation (`int`, *optional*): overrides `args.steps_per_generation` (the dry run recomputes it
            for another number of processes when the recipe fixes `generation_batch_size`).
        num_processes (`int`, *optional*): training processes; defaults to `args.world_size` (the dry run plans
            for other counts).

    Returns:
        `list[str]`: the messages, empty when there is nothing to say.
    """
    if args.s2t_mode == "off":
        return []
    messages = []
    if args.loss_type in CONSTANT_DENOMINATOR_LOSSES:
        messages.append(
            f"loss_type={args.loss_type!r} has a constant denominator by design: silenced tokens leave the numerator "
            "only, the loss is not renormalised over kept tokens. STAPO's valid-token averaging needs 'dapo' "
            "(paper), 'bnpo', 'grpo', 'cispo' or 'vespo'."
        )
    if args.loss_type == "vespo":
        messages.append(
            "loss_type='vespo' with the S2T mask was never run in the paper: each completion's gamma weight phi is "
            "computed from its sequence log-ratio over the loss mask, so silencing tokens also changes the phi "
            "weight of their whole completion."
        )
    if args.top_entropy_quantile < 1.0:
        messages.append(
            f"top_entropy_quantile={args.top_entropy_quantile} together with the S2T mask was never run in the "
            "paper: both masks apply (the high-entropy quantile is taken over kept tokens) and TRL keeps its own "
            "denominator for the entropy mask."
        )
    if args.importance_sampling_level == "sequence":
        messages.append(
            "importance_sampling_level='sequence' with the S2T mask was never run in the paper: the sequence-level "
            "log-ratio is then averaged over kept tokens only."
        )
    if args.entropy_coef != 0.0 or args.use_adaptive_entropy:
        messages.append(
            f"entropy_coef={args.entropy_coef} with the S2T mask was never run in the paper (no entropy bonus): the "
            "entropy bonus is then averaged over kept tokens only, so silenced tokens get no entropy gradient either."
        )
    if args.temperature != 1.0:
        messages.append(
            f"temperature={args.temperature}: the S2T thresholds (s2t_prob_threshold, s2t_entropy_quantile) are "
            "calibrated at temperature 1.0, and probabilities and entropies are taken from the temperature-scaled "
            "logits, so the silenced set changes. The paper trains at 1.0."
        )
    partial = partial_prompt_group_message(
        args.per_device_train_batch_size,
        num_processes or args.world_size,
        args.gradient_accumulation_steps,
        args.num_generations,
    )
    if partial is not None:
        messages.append(partial)
    steps_per_generation = steps_per_generation or args.steps_per_generation
    if args.s2t_scope != "micro_batch" and steps_per_generation % args.gradient_accumulation_steps != 0:
        messages.append(
            f"steps_per_generation={steps_per_generation} is not a multiple of gradient_accumulation_steps="
            f"{args.gradient_accumulation_steps}: an optimizer update spans rollout batches, so s2t_scope="
            f"{args.s2t_scope!r} falls back to tau_h over each rollout batch ('generation_batch') and the loss keeps "
            "TRL's estimated normaliser (the rollout batch's kept count x GA / steps_per_generation) instead of each "
            "update's exact kept count."
        )
    return messages
