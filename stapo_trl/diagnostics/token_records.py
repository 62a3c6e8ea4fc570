r"""Per-token records of the S2T mask: the silenced tokens of a mask in context, with samples of kept candidates and
of other positive-advantage tokens (what [`~stapo_trl.runfiles.callbacks.SpuriousTokenLogger`] writes to
`spurious_tokens.jsonl`: the paper's word clouds and probability-entropy plane as data).

The records are taken when the mask is built, so what waits for the logging step is bounded by the caps (a few
hundred small dicts per mask), not by the batch.

Each record:

    {"step": 12, "kind": "silenced", "silenced": true, "candidate": true, "token": "9", "token_id": 40,
     "prob": 0.0011, "logprob": -6.81, "entropy": 0.052, "advantage": 1.2, "position": 17,
     "context": "carry 1; 4+3+1=⟦9⟧; \\boxed{", "entropy_threshold": 0.31, "prob_threshold": 0.002,
     "completion_index": 3, "process_index": 0}

`token` is the decoded token (special tokens kept, so an `<|im_end|>` shows), `position` its 0-based index in
the completion, `context` up to `context_tokens` completion tokens on each side with the token in ⟦ ⟧,
`entropy` in nats, `entropy_threshold` the mask's tau_h (`None` when it had no candidate).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import torch

from ..core.s2t import S2TResult


def _sample(indices: list[tuple[int, int]], k: int, rng: random.Random) -> list[tuple[int, int]]:
    """At most k of `indices`, uniformly without replacement, returned in (row, position) order."""
    if len(indices) <= k:
        return indices
    return sorted(rng.sample(indices, k))


def _decode(tokenizer, token_ids: Sequence[int]) -> str:
    return tokenizer.decode(list(token_ids), skip_special_tokens=False) if token_ids else ""


def _select_tokens(
    result: S2TResult,
    in_loss: torch.Tensor,
    finite: torch.Tensor,
    advantages: torch.Tensor,
    caps: dict[str, int],
    rng: random.Random,
) -> dict[str, list[tuple[int, int]]]:
    """The (completion, position) pairs of each record kind: a uniform sample of at most `caps[kind]`, in order.
    Candidates have finite p and H by construction; the reference sample skips the other non-finite tokens too (JSON
    has no NaN)."""
    positive = in_loss & (advantages > 0)  # (B, T)
    kinds = {
        "silenced": result.silenced & in_loss,
        "kept_candidate": result.candidate & ~result.silenced & in_loss,
        "reference": positive & ~result.candidate & finite,
    }
    return {
        kind: _sample([tuple(ix) for ix in mask.nonzero().tolist()], caps[kind], rng) for kind, mask in kinds.items()
    }


def spurious_token_records(
    result: S2TResult,
    per_token_logps: torch.Tensor,
    entropies: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    completion_ids: torch.Tensor,
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
    r"""Per-token records of one S2T mask: its silenced tokens, a sample of kept candidates and of other tokens.

    Three kinds of loss tokens with a positive advantage, in this order, each in (completion, position) order:
    `"silenced"` (every silenced token, up to `max_silenced`), `"kept_candidate"` (candidates the mask kept, a
    uniform sample of at most `max_kept_candidates`) and `"reference"` (positive-advantage tokens with p >= tau_p, a
    uniform sample of at most `max_reference`: the other half of the paper's probability-entropy plane). Samples
    use `random.Random(f"{seed}-{step}-{process_index}")`, so a rerun writes the same records.

    Args:
        result ([`~stapo_trl.core.S2TResult`]): the mask.
        per_token_logps, entropies (`torch.Tensor`): float, (B, T), the values the mask was built from (nats).
        advantages (`torch.Tensor`): float, (B,), (B, 1) or (B, T).
        loss_mask, completion_ids (`torch.Tensor`): (B, T), 1 for loss tokens before silencing; long token ids.
        tokenizer: anything with `decode(list[int], skip_special_tokens=...)`.
        step (`int`): the step written into each record and used in the sampling seed.
        prob_threshold (`float`, *optional*), max_silenced, max_kept_candidates, max_reference (`int`): tau_p, caps.
        context_tokens (`int`, *optional*, defaults to `8`): tokens of context on each side.
        seed (`int`, *optional*, defaults to `0`), process_index (`int`, *optional*, defaults to `0`).

    Returns:
        `list[dict]`: JSON-serializable records.
    """
    caps = {"silenced": max_silenced, "kept_candidate": max_kept_candidates, "reference": max_reference}
    in_loss = loss_mask.bool()  # (B, T)
    advantages = advantages.reshape(advantages.size(0), -1).expand_as(per_token_logps)  # (B,), (B, 1) -> (B, T)
    rng = random.Random(f"{seed}-{step}-{process_index}")
    finite = per_token_logps.isfinite() & entropies.isfinite()  # (B, T)
    selected = _select_tokens(result, in_loss, finite, advantages, caps, rng)
    if not any(selected.values()):
        return []
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
            logprob = per_token_logps[row, pos].float().item()
            records.append(
                {
                    "step": int(step),
                    "kind": kind,
                    "silenced": kind == "silenced",
                    "candidate": kind != "reference",
                    "token": token,
                    "token_id": int(ids[pos]),
                    "prob": math.exp(logprob),
                    "logprob": logprob,
                    "entropy": entropies[row, pos].float().item(),
                    "advantage": advantages[row, pos].float().item(),
                    "position": int(pos),
                    "context": f"{before}⟦{token}⟧{after}",
                    "entropy_threshold": threshold,
                    "prob_threshold": prob_threshold,
                    "completion_index": int(row),
                    "process_index": int(process_index),
                }
            )
    return records
