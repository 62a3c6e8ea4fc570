r"""The logit-space maths of STAPO's Theorem 3.3 and Lemma 3.2, for one softmax position (pure torch).

For a softmax policy pi = softmax(z) over V tokens, a sampled token a with p = pi_a and a per-token loss whose weight
on log pi_a is w, the gradient w.r.t. the logits is g = w (e_a - pi), so

    ||g||^2 = w^2 (1 - 2 p + sum_v pi_v^2)                                   (exact)
    w^2 (1 - 2 p + exp(-H))  <=  ||g||^2  <=  w^2 (2 - 2 p - C_V H^2),  C_V = (V - 1) / (V (ln V)^2)

([STAPO](https://huggingface.co/papers/2602.15620), Sec. 3, Theorem 3.3), and the entropy change one positive update
of a token causes at its own position (Sec. 3, Lemma 3.2): with H = -sum_v pi_v log pi_v (nats),

    dH/dz_k = -pi_k (log pi_k + H)
    dH ~= eta w [sum_v pi_v^2 (log pi_v + H) - p (log p + H)]     for the logit step z <- z + eta w (e_a - pi)

The bracket is positive for a token less likely than the typical one (p < exp(-H), which covers the low-probability
tokens of a confident position) and never positive for the most likely token: a positive update (w > 0) raises the
entropy at the first and lowers it at the second. Used by the notebook and by `benchmarks/mechanism.py`; nothing in
training depends on it.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch


def logit_grad_norm_sq(
    probs_sampled: torch.Tensor, collision_prob: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    r"""Exact squared norm of the gradient of one token's policy-gradient term w.r.t. its logits.

    For a softmax policy π = softmax(z) over V tokens, a sampled token a with p = π_a and the per-token loss
    ℓ = -w log π_a(z), the gradient is ∂ℓ/∂z = w (π - e_a), so

        ||∂ℓ/∂z||² = w² (1 - 2 p + Σ_v π_v²)

    ([STAPO](https://huggingface.co/papers/2602.15620), Sec. 3, the gradient-norm analysis). In GRPO-style losses
    w = ratio · A inside the clip region and 0 outside (on-policy, ratio = 1: w = A).

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


class SoftmaxStatistics(NamedTuple):
    r"""Per-position statistics of a softmax policy π = softmax(z), all of the broadcast shape (...), float64.

    Fields:
        probs_sampled: p = π_a, probability of the sampled token.
        entropy: H = -Σ_v π_v log π_v, Shannon entropy in nats.
        collision_prob: Σ_v π_v², the collision probability (unitless, in [1/V, 1]).
        collision_logp: Σ_v π_v² log π_v (nats; <= 0), the second moment the entropy change needs.
    """

    probs_sampled: torch.Tensor
    entropy: torch.Tensor
    collision_prob: torch.Tensor
    collision_logp: torch.Tensor


def softmax_statistics(logits: torch.Tensor, sampled: torch.Tensor) -> SoftmaxStatistics:
    r"""p, H, Σ_v π_v² and Σ_v π_v² log π_v of π = softmax(logits), exactly over the whole vocabulary.

    Computed in float64 from `logits` as given (divide by the sampling temperature first). Memory is 3 float64 copies
    of `logits`: call it on chunks of positions for a large vocabulary (49,152 x 256 positions is ~300 MB).
    Tokens with π_v = 0 (a logit of -inf) contribute 0 to every sum.

    Args:
        logits (`torch.Tensor`): float, shape (..., V), the policy's logits at one or more positions.
        sampled (`torch.Tensor`): long, shape (...), the sampled token ids a.

    Returns:
        [`SoftmaxStatistics`]: four float64 tensors of shape (...).
    """
    logp = torch.log_softmax(logits.double(), dim=-1)  # (..., V)
    probs = logp.exp()  # (..., V)
    plogp = torch.where(probs > 0, probs * logp, torch.zeros_like(probs))  # 0 log 0 = 0
    return SoftmaxStatistics(
        probs_sampled=probs.gather(-1, sampled.unsqueeze(-1)).squeeze(-1),
        entropy=-plogp.sum(-1),
        collision_prob=probs.square().sum(-1),
        collision_logp=(probs * plogp).sum(-1),
    )


def entropy_logit_gradient(logits: torch.Tensor) -> torch.Tensor:
    r"""The gradient of the entropy of softmax(z) w.r.t. the logits: ∂H/∂z_k = -π_k (log π_k + H).

    ([STAPO](https://huggingface.co/papers/2602.15620), Sec. 3, the proof of Lemma 3.2.) It sums to 0 over the
    vocabulary (softmax is shift-invariant) and vanishes at the uniform and at one-hot distributions.

    Args:
        logits (`torch.Tensor`): float, shape (..., V).

    Returns:
        `torch.Tensor`: float64, shape (..., V), nats per logit unit.
    """
    logp = torch.log_softmax(logits.double(), dim=-1)  # (..., V)
    probs = logp.exp()
    plogp = torch.where(probs > 0, probs * logp, torch.zeros_like(probs))
    entropy = -plogp.sum(-1, keepdim=True)  # (..., 1)
    return -(plogp + probs * entropy)


def entropy_change_first_order(
    probs_sampled: torch.Tensor,
    entropy: torch.Tensor,
    collision_prob: torch.Tensor,
    collision_logp: torch.Tensor,
    weight: torch.Tensor | float,
    step_size: float = 1.0,
) -> torch.Tensor:
    r"""First-order entropy change at a position after one gradient step on its own token's loss, in logit space.

    The loss ℓ = -w log π_a has ∂ℓ/∂z = w (π - e_a); one gradient-descent step of size η moves the logits by
    Δz = η w (e_a - π). With ∂H/∂z_k = -π_k (log π_k + H) ([`entropy_logit_gradient`]), the first-order change is

        ΔH ≈ ∇_z H · Δz = η w [Σ_v π_v² (log π_v + H) - p (log p + H)]
           = η w [collision_logp + H · collision_prob - p (log p + H)]

    ([STAPO](https://huggingface.co/papers/2602.15620), Sec. 3, Lemma 3.2; equivalently -η w Cov_{v~π}(log π_v,
    1[v = a] - π_v)). Sign rule for w > 0, with f(x) = x (log x + H): the bracket is E_{v~π}[f(π_v)] - f(p).
    - p < exp(-H) (less likely than the typical token; every p < τ_p at H < -log τ_p ≈ 6.2 nats): f(p) < 0 and
      E_π[f(π_v)] = Cov_π(π_v, log π_v) >= 0, so ΔH > 0: the entropy rises.
    - a = argmax π: p_max >= Σ_v π_v² >= exp(-H), so f(p) >= 0 > f(x) for x < exp(-H), and f rises on
      [exp(-H), p]: f(p) >= every f(π_v), so ΔH <= 0 (< 0 unless π is uniform on its support): the entropy falls.
    - in between the sign depends on the whole distribution.
    The approximation holds for small |η w|; [`entropy_after_logit_step`] gives the exact change.

    Args:
        probs_sampled (`torch.Tensor`): float, any shape, p = π_a in (0, 1].
        entropy (`torch.Tensor`): float, same shape, H in nats.
        collision_prob (`torch.Tensor`): float, same shape, Σ_v π_v².
        collision_logp (`torch.Tensor`): float, same shape, Σ_v π_v² log π_v (nats).
        weight (`torch.Tensor` or `float`): broadcastable, w (the advantage on-policy).
        step_size (`float`, *optional*, defaults to `1.0`): η, the step size in logit space.

    Returns:
        `torch.Tensor`: the broadcast shape, ΔH in nats (positive: the entropy rises).
    """
    bracket = collision_logp + entropy * collision_prob - probs_sampled * (torch.log(probs_sampled) + entropy)
    return step_size * weight * bracket


def entropy_after_logit_step(
    logits: torch.Tensor, sampled: torch.Tensor, weight: torch.Tensor | float, step_size: float = 1.0
) -> torch.Tensor:
    r"""Exact entropy of softmax(z + η w (e_a - π)): the position's entropy after one gradient step on -w log π_a.

    The step moves only this position's logits (the "logit view" of [STAPO](https://huggingface.co/papers/2602.15620),
    Sec. 3, Lemma 3.2); a parameter step also moves them through the network, which this does not model. Subtract
    the entropy before the step ([`softmax_statistics`]) for the exact change that [`entropy_change_first_order`]
    approximates. Memory: a few float64 copies of `logits`; chunk the positions for a large vocabulary.

    Args:
        logits (`torch.Tensor`): float, shape (..., V), logits before the step.
        sampled (`torch.Tensor`): long, shape (...), the sampled token ids a.
        weight (`torch.Tensor` or `float`): float, shape (...) or a scalar, w.
        step_size (`float`, *optional*, defaults to `1.0`): η.

    Returns:
        `torch.Tensor`: float64, shape (...), the entropy after the step, in nats.
    """
    z = logits.double()
    probs = torch.softmax(z, dim=-1)  # (..., V)
    one_hot = torch.zeros_like(probs).scatter_(-1, sampled.unsqueeze(-1), 1.0)  # (..., V)
    weight = torch.as_tensor(weight, dtype=torch.float64)
    if weight.dim() > 0:
        weight = weight.unsqueeze(-1)  # (...) -> (..., 1)
    logp = torch.log_softmax(z + step_size * weight * (one_hot - probs), dim=-1)  # (..., V)
    probs_after = logp.exp()
    return -torch.where(probs_after > 0, probs_after * logp, torch.zeros_like(probs_after)).sum(-1)
