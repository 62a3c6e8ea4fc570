r"""Per-token records of the S2T mask: the silenced tokens of a batch in context, with samples of kept candidates and
of other positive-advantage tokens (what [`~stapo_trl.callbacks.SpuriousTokenLogger`] writes to
`spurious_tokens.jsonl`, the paper's word clouds and probability-entropy plane as data).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import torch

from .core.s2t import S2TBatch


def _sample(indices: list[tuple[int, int]], k: int, rng: random.Random) -> list[tuple[int, int]]:
    """At most k of `indices`, uniformly without replacement, returned in (row, position) order."""
    if len(indices) <= k:
        return indices
    return sorted(rng.sample(indices, k))


def _decode(tokenizer, token_ids: Sequence[int]) -> str:
    return tokenizer.decode(list(token_ids), skip_special_tokens=False) if token_ids else ""


def _select_tokens(
    batch: S2TBatch, caps: dict[str, int], rng: random.Random
) -> tuple[dict[str, list[tuple[int, int]]], torch.Tensor, torch.Tensor]:
    """The (completion, position) pairs of each record kind (a uniform sample of at most `caps[kind]`, in order),
    the bool (B, T) loss mask and the (B, T) advantages."""
    result = batch.result
    in_loss = batch.loss_mask.bool()  # (B, T)
    advantages = batch.advantages
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)  # (B,) -> (B, 1)
    advantages = advantages.expand_as(batch.per_token_logps)  # (B, T)
    positive = in_loss & (advantages > 0)  # (B, T)
    kinds = {
        "silenced": result.silenced & in_loss,
        "kept_candidate": result.candidate & ~result.silenced & in_loss,
        "reference": positive & ~result.candidate,
    }
    selected = {
        kind: _sample([tuple(ix) for ix in mask.nonzero().tolist()], caps[kind], rng) for kind, mask in kinds.items()
    }
    return selected, in_loss, advantages


def spurious_token_records(
    batch: S2TBatch,
    tokenizer,
    *,
    step: int,
    prob_threshold: float | None = None,
    max_silenced: int = 256,
    max_kept_candidates: int = 64,
    max_reference: int = 64,
    context_tokens: int = 8,
    seed: int = 0,
    process_index: int = 0,
) -> list[dict[str, Any]]:
    r"""Per-token records of one S2T batch: its silenced tokens, a sample of kept candidates and of other tokens.

    Three kinds of loss tokens with a positive advantage, in this order, each in (completion, position) order:
    `"silenced"` (every silenced token, up to `max_silenced`), `"kept_candidate"` (candidates the mask kept, a
    uniform sample of at most `max_kept_candidates`) and `"reference"` (positive-advantage tokens with p >= τ_p, a
    uniform sample of at most `max_reference`: the other half of the paper's probability-entropy plane). Samples
    use `random.Random(f"{seed}-{step}-{process_index}")`, so a rerun writes the same records.

    Each record:

        {"step": 12, "kind": "silenced", "silenced": true, "candidate": true, "token": "9", "token_id": 40,
         "prob": 0.0011, "logprob": -6.81, "entropy": 0.052, "advantage": 1.2, "position": 17,
         "context": "carry 1; 4+3+1=⟦9⟧; \\boxed{", "logit_grad_norm": 1.19, "entropy_threshold": 0.31,
         "prob_threshold": 0.002, "completion_index": 3, "process_index": 0}

    `token` is the decoded token (special tokens kept, so an `<|im_end|>` shows), `position` its 0-based index in
    the completion, `context` up to `context_tokens` completion tokens on each side with the token in ⟦ ⟧,
    `entropy` in nats, `logit_grad_norm` the on-policy ||∂ℓ/∂z|| = |A| sqrt(1 - 2p + Σ_v π_v²) (`None` without the
    collision probability), `entropy_threshold` the batch's τ_h (`None` when it had no candidate).

    Args:
        batch ([`~stapo_trl.core.s2t.S2TBatch`]): the trainer's `s2t_last_batch`.
        tokenizer: anything with `decode(list[int], skip_special_tokens=...)`.
        step (`int`): the optimizer step to write.
        prob_threshold (`float`, *optional*): τ_p, written as is.
        max_silenced, max_kept_candidates, max_reference (`int`): caps per kind.
        context_tokens (`int`, *optional*, defaults to `8`): tokens of context on each side.
        seed (`int`, *optional*, defaults to `0`), process_index (`int`, *optional*, defaults to `0`).

    Returns:
        `list[dict]`: JSON-serialisable records.
    """
    result = batch.result
    caps = {"silenced": max_silenced, "kept_candidate": max_kept_candidates, "reference": max_reference}
    selected, in_loss, advantages = _select_tokens(batch, caps, random.Random(f"{seed}-{step}-{process_index}"))
    if not any(selected.values()):
        return []

    logps = batch.per_token_logps.detach().float().cpu()
    entropies = batch.entropies.detach().float().cpu()
    advantages = advantages.detach().float().cpu()
    collision = batch.log_collision.detach().double().exp().cpu() if batch.log_collision is not None else None
    completion_ids = batch.completion_ids.cpu()
    # A completion ends after its last loss token: context never runs into padding.
    lengths = (in_loss.long().cpu() * torch.arange(1, in_loss.size(1) + 1)).amax(dim=1).tolist()  # (B,)
    threshold = None if math.isnan(result.entropy_threshold) else float(result.entropy_threshold)
    records = []
    for kind, indices in selected.items():
        for row, pos in indices:
            ids = completion_ids[row].tolist()
            token = _decode(tokenizer, [ids[pos]])
            before = _decode(tokenizer, ids[max(0, pos - context_tokens) : pos])
            after = _decode(tokenizer, ids[pos + 1 : min(lengths[row], pos + 1 + context_tokens)])
            values = (logps[row, pos].item(), entropies[row, pos].item(), advantages[row, pos].item())
            sum_sq = collision[row, pos].item() if collision is not None else None
            records.append(
                _token_record(step, kind, token, ids[pos], values, sum_sq, pos, f"{before}⟦{token}⟧{after}")
                | {
                    "entropy_threshold": threshold,
                    "prob_threshold": prob_threshold,
                    "completion_index": int(row),
                    "process_index": int(process_index),
                }
            )
    return records


def _token_record(step, kind, token, token_id, values, sum_sq, pos, context) -> dict[str, Any]:
    """The per-token fields of one record (see [`spurious_token_records`]); `values` = (logprob, entropy, advantage),
    `sum_sq` = Σ_v π_v² at the position (`None`: no gradient norm)."""
    logprob, entropy, advantage = values
    prob = math.exp(logprob)
    grad_norm = None
    if sum_sq is not None:
        grad_norm = abs(advantage) * math.sqrt(max(0.0, 1.0 - 2.0 * prob + sum_sq))
    return {
        "step": int(step),
        "kind": kind,
        "silenced": kind == "silenced",
        "candidate": kind != "reference",
        "token": token,
        "token_id": int(token_id),
        "prob": prob,
        "logprob": logprob,
        "entropy": entropy,
        "advantage": advantage,
        "position": int(pos),
        "context": context,
        "logit_grad_norm": grad_norm,
    }
