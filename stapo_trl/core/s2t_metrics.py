r"""The S2T diagnostics of STAPO: the paper's analysis of spurious tokens as training metrics.

[STAPO](https://huggingface.co/papers/2602.15620) explains its mask with three pictures: which tokens get silenced
(word clouds: digits, "$", "x" are silenced; "Let", "So", "Wait" are kept exploratory tokens), where they sit in the
probability-entropy plane (four quadrants split by τ_p and τ_h), and how large their gradient is (the per-token
gradient norm w.r.t. the logits grows as probability and entropy fall). This module turns them into things a run
logs, cheap enough to leave on:

- [`s2t_diagnostic_metrics`]: scalars under `s2t/`, reduced over processes (sums and counts all-reduced, one
  division, NaN when undefined), logged by [`STAPOTrainer`] every time it builds a mask:
  `entropy_p10`/`p50`/`p80`/`p95` (entropy quantiles of all loss tokens, nats), `silenced_prob_mean`,
  `silenced_entropy_mean`, `grad_norm_share_candidates` and `grad_norm_share_silenced`.
- The exact gradient-norm maths ([`logit_grad_norm_sq`], [`logit_grad_norm_bounds`]) and the histogram quantile
  ([`entropy_histogram`], [`histogram_quantile`]) as small pure functions.

The collision probability Σ_v π_v² needed by the exact gradient norm comes from TRL's fused LM head, which computes
`log_sum_sq_probs` in the same pass over the vocabulary as the log-probs and entropies (an online sum of
exp(2 (z_v - max z)), no logits materialised); [`CollisionProbabilityRecorder`] asks the head for it and captures it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .s2t import S2TResult


# Entropy quantiles logged as `s2t/entropy_p{100 q}`.
ENTROPY_QUANTILES = (0.10, 0.50, 0.80, 0.95)

# Log-spaced entropy histogram used for the quantiles: bin 0 is [0, ENTROPY_MIN), bins 1..ENTROPY_BINS split
# [ENTROPY_MIN, ENTROPY_MAX) into equal ratios r = (ENTROPY_MAX / ENTROPY_MIN) ** (1 / ENTROPY_BINS) (r - 1 = 0.45 %).
# ENTROPY_MAX = 100 nats exceeds ln V for any vocabulary (ln 152k = 11.9), so no real entropy is clamped.
ENTROPY_MIN = 1e-6
ENTROPY_MAX = 100.0
ENTROPY_BINS = 4096
_LOG_RATIO = (math.log(ENTROPY_MAX) - math.log(ENTROPY_MIN)) / ENTROPY_BINS  # ln r
# Guaranteed error of `histogram_quantile` against the exact linear-interpolation quantile: relative √r - 1, plus
# ENTROPY_MIN / 2 absolute for values below ENTROPY_MIN.
HISTOGRAM_QUANTILE_REL_ERROR = math.exp(_LOG_RATIO / 2) - 1  # 0.00225

# Order of the scalar sums all-reduced by `s2t_diagnostic_metrics`, before the histogram counts.
_SUMS = ("silenced_prob", "silenced_entropy", "num_silenced", "grad_sq_all", "grad_sq_candidates", "grad_sq_silenced")


# ----------------------------------------------------------------------------------------------------------------
# Pure maths
# ----------------------------------------------------------------------------------------------------------------
def logit_grad_norm_sq(
    probs_sampled: torch.Tensor, collision_prob: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    r"""Exact squared norm of the gradient of one token's policy-gradient term w.r.t. its logits.

    For a softmax policy π = softmax(z) over V tokens, a sampled token a with p = π_a and the per-token loss
    ℓ = -w log π_a(z), the gradient is ∂ℓ/∂z = w (π - e_a), so

        ||∂ℓ/∂z||² = w² (1 - 2 p + Σ_v π_v²)

    ([STAPO](https://huggingface.co/papers/2602.15620), Sec. 3, the gradient-norm analysis). In GRPO-style losses
    w = ratio · A inside the clip region and 0 outside (on-policy, ratio = 1); see [`policy_gradient_weight`].

    Args:
        probs_sampled (`torch.Tensor`): float, any shape, p = π_a, probability of the sampled token in [0, 1].
        collision_prob (`torch.Tensor`): float, same shape, Σ_v π_v² (the collision probability) in [1/V, 1].
        weight (`torch.Tensor`): float, broadcastable, w (advantage times ratio; 0 outside the clip region).

    Returns:
        `torch.Tensor`: float, the broadcast shape, ||∂ℓ/∂z||² (squared logit units), clamped at 0 (rounding).
    """
    return weight.square() * (1.0 - 2.0 * probs_sampled + collision_prob).clamp(min=0.0)


def logit_grad_norm_bounds(
    probs_sampled: torch.Tensor, entropy: torch.Tensor, weight: torch.Tensor, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The paper's bounds on ||∂ℓ/∂z||² from the sampled probability and the entropy alone.

        w² (1 - 2 p + exp(-H))  <=  ||∂ℓ/∂z||²  <=  w² (2 - 2 p - C_V H²),    C_V = (V - 1) / (V (ln V)²)

    ([STAPO](https://huggingface.co/papers/2602.15620), Sec. 3). The lower bound is Σ_v π_v² >= exp(-H) (Rényi-2
    entropy <= Shannon entropy); the upper bound is tight at the uniform distribution (H = ln V, Σ π² = 1/V). Both
    fall as p rises; the upper one also falls as H rises, so a low-probability token at a confident (low-entropy)
    position has the largest gradient.

    Args:
        probs_sampled (`torch.Tensor`): float, any shape, p in [0, 1].
        entropy (`torch.Tensor`): float, same shape, Shannon entropy H in nats, in [0, ln V].
        weight (`torch.Tensor`): float, broadcastable, w.
        vocab_size (`int`): V >= 2.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: (lower, upper), each the broadcast shape, squared logit units.
    """
    if vocab_size < 2:
        raise ValueError(f"vocab_size={vocab_size!r} must be >= 2")
    c_v = (vocab_size - 1) / (vocab_size * math.log(vocab_size) ** 2)
    w_sq = weight.square()
    lower = w_sq * (1.0 - 2.0 * probs_sampled + torch.exp(-entropy))
    upper = w_sq * (2.0 - 2.0 * probs_sampled - c_v * entropy.square())
    return lower, upper


def policy_gradient_weight(
    advantages: torch.Tensor,
    log_ratio: torch.Tensor | None = None,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.28,
) -> torch.Tensor:
    r"""The per-token weight w = -∂ℓ/∂ log π_a of the clipped surrogate min(r A, clip(r, 1 - ε_low, 1 + ε_high) A).

    w = r A where the unclipped term is active, 0 where the clip acts (A > 0 and r > 1 + ε_high, or A < 0 and
    r < 1 - ε_low). On-policy (`log_ratio=None`) r = 1 and w = A. This is the token-level PPO clip of the `dapo`,
    `grpo`, `bnpo` and `dr_grpo` losses; the per-sequence 1/|o_i| of `grpo`, TRL's `delta` and the `cispo`/`sapo`/
    `vespo` weights are not modelled.

    Args:
        advantages (`torch.Tensor`): float, (B,), (B, 1) or (B, T).
        log_ratio (`torch.Tensor`, *optional*): float, (B, T), log π_θ(a) - log π_old(a) (nats).
        epsilon_low (`float`, *optional*, defaults to `0.2`): ε_low.
        epsilon_high (`float`, *optional*, defaults to `0.28`): ε_high.

    Returns:
        `torch.Tensor`: float, (B, T) when `log_ratio` is given, else the advantages as (B, 1) or (B, T).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)  # (B,) -> (B, 1)
    if log_ratio is None:
        return advantages
    ratio = torch.exp(log_ratio)  # (B, T)
    clipped = ((advantages > 0) & (ratio > 1 + epsilon_high)) | ((advantages < 0) & (ratio < 1 - epsilon_low))
    return torch.where(clipped, torch.zeros_like(ratio), ratio * advantages)


def entropy_histogram(entropies: torch.Tensor) -> torch.Tensor:
    r"""Counts of entropies in the fixed log-spaced bins used by [`histogram_quantile`].

    Bin 0 holds [0, `ENTROPY_MIN`) (and rounding negatives); bin k in 1..`ENTROPY_BINS` holds
    [ENTROPY_MIN r^(k-1), ENTROPY_MIN r^k). The bins are the same on every process, so histograms add up across
    processes exactly (one all-reduce of `ENTROPY_BINS + 1` numbers, whatever the token count).

    Args:
        entropies (`torch.Tensor`): float, shape (n,), entropies in nats.

    Returns:
        `torch.Tensor`: float64, shape (ENTROPY_BINS + 1,), counts.
    """
    values = entropies.detach().double()
    index = torch.floor((torch.log(values.clamp(min=ENTROPY_MIN)) - math.log(ENTROPY_MIN)) / _LOG_RATIO) + 1  # (n,)
    index = torch.where(values < ENTROPY_MIN, torch.zeros_like(index), index).clamp(max=ENTROPY_BINS).long()
    return torch.bincount(index, minlength=ENTROPY_BINS + 1).double()


def _bin_value(bin_index: int) -> float:
    """Representative value of a histogram bin: ENTROPY_MIN / 2 for bin 0, the geometric centre otherwise."""
    if bin_index == 0:
        return ENTROPY_MIN / 2
    return math.exp(math.log(ENTROPY_MIN) + (bin_index - 0.5) * _LOG_RATIO)


def histogram_quantile(counts: torch.Tensor, q: float) -> float:
    r"""The q-quantile (linear interpolation, numpy's default) of the values behind an [`entropy_histogram`].

    With n values and h = (n - 1) q, the exact quantile is x_(lo) + (h - lo)(x_(hi) - x_(lo)) with lo = floor(h),
    hi = ceil(h) over the sorted values. Here each order statistic is replaced by the representative value of its
    bin (geometric centre), so for every value within [ENTROPY_MIN, ENTROPY_MAX):

        |estimate - exact| <= (√r - 1) · exact + ENTROPY_MIN / 2,    √r - 1 = HISTOGRAM_QUANTILE_REL_ERROR = 0.23 %

    (each representative is within a factor √r of its order statistic, and the interpolation is a convex
    combination). Selection by counts, so there is no element limit (unlike `torch.quantile`, pytorch#64947).

    Args:
        counts (`torch.Tensor`): float, shape (ENTROPY_BINS + 1,), counts (summed over processes).
        q (`float`): quantile in [0, 1].

    Returns:
        `float`: the estimate in nats, NaN when the histogram is empty.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q={q!r} must be in [0, 1]")
    cumulative = torch.cumsum(counts.double(), dim=0)  # (ENTROPY_BINS + 1,)
    n = round(cumulative[-1].item())
    if n == 0:
        return float("nan")
    h = (n - 1) * q
    lo, hi = math.floor(h), math.ceil(h)
    # The k-th smallest value (0-based) lies in the first bin whose cumulative count exceeds k.
    ranks = torch.tensor([lo, hi], dtype=torch.float64)
    bins = torch.searchsorted(cumulative, ranks, right=True).tolist()
    x_lo, x_hi = _bin_value(bins[0]), _bin_value(bins[1])
    return x_lo + (h - lo) * (x_hi - x_lo)


# ----------------------------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------------------------
def s2t_diagnostic_metrics(
    result: S2TResult,
    per_token_logps: torch.Tensor,
    entropies: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    log_collision: torch.Tensor | None = None,
    log_ratio: torch.Tensor | None = None,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.28,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, float]:
    r"""The `s2t/` diagnostic scalars of one S2T mask, reduced over all processes.

    Every number is a global sum divided once by a global count (one all-reduce of ENTROPY_BINS + 7 float64 values,
    also when this process has no token); undefined values are NaN, which TRL's `log()` drops.

    - `s2t/entropy_p10`, `p50`, `p80`, `p95` (nats): quantiles (linear interpolation) of the entropies of all loss
      tokens, from a log-spaced histogram summed over processes: within 0.23 % (relative) + 5e-7 nats of the exact
      quantile of the gathered entropies (see [`histogram_quantile`]).
    - `s2t/silenced_prob_mean` (probability) and `s2t/silenced_entropy_mean` (nats): means over silenced tokens.
    - `s2t/grad_norm_share_candidates`, `s2t/grad_norm_share_silenced` (fractions in [0, 1]): the share of the
      squared norm of ∂L/∂logits over all loss tokens that candidates (silenced tokens) carry in the loss *without*
      the mask, Σ_{t∈C} ||g_t||² / Σ_{t∈loss} ||g_t||² with ||g_t||² = w² (1 - 2p + Σ_v π_v²)
      ([`logit_grad_norm_sq`]; squared norms add up over tokens because each token has its own logits, and the
      loss's 1/N cancels).
      NaN without `log_collision` or when every loss token has w = 0 (e.g. all groups all-correct).

    Args:
        result ([`S2TResult`]): the mask built from the tensors below.
        per_token_logps (`torch.Tensor`): float, (B, T), log-probs (nats) of the sampled tokens.
        entropies (`torch.Tensor`): float, (B, T), entropies (nats).
        advantages (`torch.Tensor`): float, (B,), (B, 1) or (B, T).
        loss_mask (`torch.Tensor`): bool/int/float, (B, T), 1 for loss tokens.
        log_collision (`torch.Tensor`, *optional*): float, (B, T), log Σ_v π_v² at each position (TRL's fused-head
            `log_sum_sq_probs`). `None`: the gradient-norm shares are NaN.
        log_ratio (`torch.Tensor`, *optional*): float, (B, T), log π_θ - log π_old; `None` = on-policy (ratio 1).
        epsilon_low (`float`, *optional*, defaults to `0.2`), epsilon_high (`float`, *optional*, defaults to `0.28`):
            the clip range of [`policy_gradient_weight`].
        reduce (`Callable[[torch.Tensor], torch.Tensor]`, *optional*): sums a 1-D float64 tensor over processes
            (a collective: every process must call this function the same number of times). `None`: one process.

    Returns:
        `dict[str, float]`: the eight metrics above.
    """
    reduce = reduce if reduce is not None else (lambda t: t)
    with torch.no_grad():
        # Non-finite log-probs or entropies (numerical trouble upstream, counted in s2t/num_nonfinite) stay out of the
        # quantiles and sums, as they stay out of the candidates.
        in_loss = loss_mask.bool() & torch.isfinite(per_token_logps) & torch.isfinite(entropies)  # (B, T)
        silenced = result.silenced & in_loss  # (B, T)
        probs = per_token_logps.detach().double().exp()  # (B, T)
        ent = entropies.detach().double()  # (B, T)
        sums = dict.fromkeys(_SUMS, 0.0)
        sums["silenced_prob"] = probs[silenced].sum()
        sums["silenced_entropy"] = ent[silenced].sum()
        sums["num_silenced"] = silenced.sum().double()
        if log_collision is not None:
            weight = policy_gradient_weight(advantages.detach().double(), log_ratio, epsilon_low, epsilon_high)
            grad_sq = logit_grad_norm_sq(probs, log_collision.detach().double().exp(), weight)  # (B, T)
            grad_sq = grad_sq.expand_as(probs)
            sums["grad_sq_all"] = grad_sq[in_loss].sum()
            sums["grad_sq_candidates"] = grad_sq[result.candidate & in_loss].sum()
            sums["grad_sq_silenced"] = grad_sq[silenced].sum()
        device = per_token_logps.device
        local = torch.cat(
            [
                torch.stack([torch.as_tensor(sums[key], dtype=torch.float64, device=device) for key in _SUMS]),
                entropy_histogram(ent[in_loss]).to(device),
            ]
        )  # (6 + ENTROPY_BINS + 1,)
        total = reduce(local).cpu()
    return _metrics_from_sums(total, has_collision=log_collision is not None)


def _metrics_from_sums(total: torch.Tensor, has_collision: bool) -> dict[str, float]:
    """The metrics of [`s2t_diagnostic_metrics`] from its all-reduced float64 vector (`_SUMS`, then the histogram)."""
    sums = dict(zip(_SUMS, total[: len(_SUMS)].tolist(), strict=True))
    histogram = total[len(_SUMS) :]

    def ratio(numerator: float, denominator: float) -> float:
        return numerator / denominator if denominator > 0 else float("nan")

    metrics = {f"s2t/entropy_p{round(100 * q)}": histogram_quantile(histogram, q) for q in ENTROPY_QUANTILES}
    metrics["s2t/silenced_prob_mean"] = ratio(sums["silenced_prob"], sums["num_silenced"])
    metrics["s2t/silenced_entropy_mean"] = ratio(sums["silenced_entropy"], sums["num_silenced"])
    metrics["s2t/grad_norm_share_candidates"] = (
        ratio(sums["grad_sq_candidates"], sums["grad_sq_all"]) if has_collision else float("nan")
    )
    metrics["s2t/grad_norm_share_silenced"] = (
        ratio(sums["grad_sq_silenced"], sums["grad_sq_all"]) if has_collision else float("nan")
    )
    return metrics


class CollisionProbabilityRecorder:
    r"""Makes the policy's fused LM head also compute log Σ_v π_v² and captures it per forward.

    TRL 1.16's `GRPOTrainer` patches the policy with [`~trl.trainer.utils.add_fused_lm_head`] for `("log_probs",
    "entropy")`, and the kernel can also return `log_sum_sq_probs` (log of the collision probability, no gradient) in
    the same tiled pass over the vocabulary. This class re-patches the head with that field added (same temperature
    and fp32 cast as TRL's) and registers a forward hook that stores the field of every fused forward while
    recording. Between [`start`] and [`stop`] the hook keeps each chunk; [`stop`] concatenates them in call order, so
    it matches the parent's `_get_per_token_logps_and_entropies`, which runs the model once per chunk of rows.

    Args:
        model (`torch.nn.Module`): the model TRL patched (the base model under PEFT).
        temperature (`float`): the trainer's sampling temperature (the head divides the logits by it).
        cast_lm_head_to_fp32 (`bool`, *optional*, defaults to `False`): as the trainer's config.
    """

    def __init__(self, model: torch.nn.Module, temperature: float, cast_lm_head_to_fp32: bool = False):
        from trl.trainer.utils import add_fused_lm_head  # TRL only here, so the rest of the module is torch-only

        add_fused_lm_head(
            model,
            temperature=temperature,
            cast_lm_head_to_fp32=cast_lm_head_to_fp32,
            outputs=("log_probs", "entropy", "log_sum_sq_probs"),
        )
        self._chunks: list[torch.Tensor] | None = None
        self._handle = model.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs, output):
        if self._chunks is not None and kwargs.get("fused_lm_head"):
            self._chunks.append(output.log_sum_sq_probs)

    def start(self) -> None:
        """Start recording (drops anything recorded before)."""
        self._chunks = []

    def stop(self, logits_to_keep: int) -> torch.Tensor | None:
        """Stop recording; return the (B, logits_to_keep) log Σ_v π_v² of the recorded forwards, or `None`."""
        chunks, self._chunks = self._chunks, None
        if not chunks:
            return None
        return torch.cat([chunk[:, -logits_to_keep:] for chunk in chunks], dim=0)

    def remove(self) -> None:
        """Remove the hook (the head keeps computing the field)."""
        self._handle.remove()
