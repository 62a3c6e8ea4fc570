"""Per-token records of the S2T mask (`spurious_tokens.jsonl`): sampled on the device, merged within caps, decoded."""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Mapping
from typing import Any

import torch

from ..core.s2t import S2TResult


KINDS = ("silenced", "kept_candidate", "reference")
# Columns of a selection (float64: token ids and positions are exact below 2**53); then the 2c+1 context token ids.
_KEY, _KIND, _UPDATE, _ROW, _POS, _LOGP, _ENTROPY, _ADVANTAGE, _TAU_H, _IDS = range(10)


def select_token_records(result: S2TResult, per_token_logps: torch.Tensor, entropies: torch.Tensor,
                         advantages: torch.Tensor, loss_mask: torch.Tensor, completion_ids: torch.Tensor, *,
                         caps: tuple[int, int, int] = (256, 64, 64), context_tokens: int = 8, seed: str = "0",
                         update: int = 0) -> torch.Tensor:  # fmt: skip
    """Of each kind (`KINDS`) of positive-advantage loss token with finite p and H, a uniform sample of at most
    `caps[kind]` (seeded by `seed`), on the device. Takes the mask's (B, T) log p, H (nats), (B,) advantages, (B, T)
    loss mask and ids; returns float64 (3, K, 10 + 2 * context_tokens + 1), K = min(max(caps), B * T), rows of (key,
    kind, update, completion, position, log p, H, advantage, tau_h, context ids); key -1 (id -1 outside) if none."""
    (batch, length), device = per_token_logps.shape, per_token_logps.device
    in_loss = loss_mask.bool()  # (B, T)
    advantages = advantages.reshape(batch, -1).expand(batch, length)  # (B,), (B, 1) -> (B, T)
    finite = per_token_logps.isfinite() & entropies.isfinite()  # (B, T)
    members = torch.stack([result.silenced & in_loss, result.candidate & ~result.silenced & in_loss,  # (3, B*T)
                           in_loss & (advantages > 0) & ~result.candidate & finite]).view(3, -1)  # fmt: skip
    generator = torch.Generator(device=device).manual_seed(random.Random(seed).getrandbits(63))
    keys = torch.rand(members.shape, generator=generator, device=device, dtype=torch.float64).masked_fill(~members, -1)
    keys, flat = keys.topk(min(max(caps), batch * length), dim=1)  # (3, K): the largest keys of each kind
    capped = torch.arange(keys.size(1), device=device) >= torch.tensor(caps, device=device).unsqueeze(1)  # (3, K)
    keys = keys.masked_fill(capped, -1)
    row, pos = flat // length, flat % length  # (3, K)
    ends = (in_loss * torch.arange(1, length + 1, device=device)).amax(dim=1)  # (B,)
    offsets = torch.arange(-context_tokens, context_tokens + 1, device=device)  # (2c+1,)
    columns = pos.unsqueeze(-1) + offsets  # (3, K, 2c+1)
    inside = (columns >= 0) & ((offsets <= 0) | (columns < ends[row].unsqueeze(-1)))
    ids = completion_ids[row.unsqueeze(-1), columns.clamp(0, length - 1)].masked_fill(~inside, -1)  # (3, K, 2c+1)
    kind = torch.arange(3, device=device).unsqueeze(1).expand_as(row)
    values = [keys, kind, torch.full_like(keys, update), row, pos, per_token_logps[row, pos], entropies[row, pos],
              advantages[row, pos], torch.full_like(keys, result.entropy_threshold)]  # fmt: skip
    return torch.cat([torch.stack([v.double() for v in values], dim=-1), ids.double()], dim=-1)


def merge_token_records(selected: torch.Tensor, new: torch.Tensor, caps: tuple[int, int, int]) -> torch.Tensor:
    """Two selections of [`select_token_records`] as one, on their device: per kind, the largest keys, capped."""
    both = torch.cat([selected, new], dim=1)  # (3, K1 + K2, F)
    keys, order = both[..., _KEY].topk(min(max(caps), both.size(1)), dim=1)
    merged = both.gather(1, order.unsqueeze(-1).expand(-1, -1, both.size(-1)))
    capped = torch.arange(keys.size(1), device=keys.device) >= torch.tensor(caps, device=keys.device).unsqueeze(1)
    merged[..., _KEY] = keys.masked_fill(capped, -1)
    return merged


def token_records(selected: torch.Tensor, tokenizer, *, prob_threshold=None, process_index=0) -> list[dict[str, Any]]:
    """The JSON records of a selection (float64, (3, K, F)), sorted, after one transfer and one `batch_decode`:
    `step`, `update`, `kind`, `silenced`, `candidate`, `token`, `token_id`, `prob`, `logprob`, `entropy` (nats),
    `advantage`, `position` (0-based), `context` (`before⟦token⟧after`), `entropy_threshold` (tau_h, `None` without a
    candidate), `prob_threshold`, `completion_index`, `process_index`."""
    rows = sorted((r[_UPDATE], r[_KIND], r[_ROW], r[_POS], r) for k in selected.tolist() for r in k if r[_KEY] >= 0)
    center = (selected.size(-1) - _IDS) // 2 + _IDS  # the token's column
    ids = lambda part: [int(t) for t in part if t >= 0]  # noqa: E731
    texts = [text for *_, r in rows for text in ([int(r[center])], ids(r[_IDS:center]), ids(r[center + 1 :]))]
    decoded = iter(tokenizer.batch_decode(texts, skip_special_tokens=False) if texts else [])
    return [dict(
        step=int(update), update=int(update), kind=KINDS[int(kind)], silenced=kind == 0, candidate=kind != 2,
        token=token, token_id=int(r[center]), prob=math.exp(r[_LOGP]), logprob=r[_LOGP], entropy=r[_ENTROPY],
        advantage=r[_ADVANTAGE], position=int(pos), context=f"{before}⟦{token}⟧{after}",
        entropy_threshold=None if math.isnan(r[_TAU_H]) else r[_TAU_H], prob_threshold=prob_threshold,
        completion_index=int(row), process_index=int(process_index),
    ) for (update, kind, row, pos, r), (token, before, after) in zip(rows, zip(*[decoded] * 3))]  # fmt: skip


def spurious_token_records(result: S2TResult, per_token_logps: torch.Tensor, entropies: torch.Tensor,
                           advantages: torch.Tensor, loss_mask: torch.Tensor, completion_ids: torch.Tensor, tokenizer,
                           *, step: int, prob_threshold: float | None = None, max_silenced: int = 256,
                           max_kept_candidates: int = 64, max_reference: int = 64, context_tokens: int = 8,
                           seed: int = 0, process_index: int = 0) -> list[dict[str, Any]]:  # fmt: skip
    """[`select_token_records`] then [`token_records`] of one mask: at most `max_*` of each kind, seeded by step."""
    selected = select_token_records(result, per_token_logps, entropies, advantages, loss_mask, completion_ids,
        caps=(max_silenced, max_kept_candidates, max_reference), context_tokens=context_tokens,
        seed=f"{seed}-{step}-{process_index}", update=step)  # fmt: skip
    return token_records(selected, tokenizer, prob_threshold=prob_threshold, process_index=process_index)


def tokenizer_token_bytes(spec: Mapping[str, Any]) -> dict[int, bytes]:
    r"""`token id -> bytes` of a `tokenizer.json` spec: byte-fallback pieces (`<0x0A>` -> `b"\n"`) and, with a
    `ByteLevel` decoder or pre-tokenizer, byte-level BPE entries (`"Ġcarry"` -> `b" carry"`); not SentencePiece's."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # GPT-2's byte-level alphabet

    byte_level = '"ByteLevel"' in json.dumps([spec.get("decoder"), spec.get("pre_tokenizer")])
    decoder = {char: byte for byte, char in bytes_to_unicode().items()} if byte_level else {}
    vocab = (spec.get("model") or {}).get("vocab") or {}
    if not isinstance(vocab, dict):  # Unigram: a list of [piece, score]
        vocab = {piece: i for i, (piece, _) in enumerate(vocab)}
    table = {}
    for token, token_id in [*vocab.items(), *((t["content"], t["id"]) for t in spec.get("added_tokens", []))]:
        if match := re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", token):
            table[int(token_id)] = bytes([int(match.group(1), 16)])
        elif token and all(char in decoder for char in token):
            table[int(token_id)] = bytes(decoder[char] for char in token)
    return table


TOKEN_LABEL_KEY = ("Labels: the decoded token; ␣ = space, \\n = newline, <0x16> = a control character by its code, "
                   "byte 0xE2 = a byte-level BPE fragment that is not a character on its own (one byte of a "
                   "multi-byte UTF-8 character, shown by its value).")  # fmt: skip


def readable_token(token: str, token_bytes: bytes | None = None, token_id: int | None = None) -> str:
    r"""A decoded token as a figure label ([`TOKEN_LABEL_KEY`]), `$` escaped for mathtext; a fragment of a multi-byte
    character by the bytes of its vocabulary entry (`token_bytes`) or, when unknown, by `token_id` (`� id 161`)."""
    if token_bytes is not None:
        try:
            token = token_bytes.decode("utf-8")
        except UnicodeDecodeError:
            return ("byte " if len(token_bytes) == 1 else "bytes ") + " ".join(f"0x{b:02X}" for b in token_bytes)
    elif "\ufffd" in token:
        return "�" if token_id is None else f"� id {token_id}"
    escapes = {"\n": "\\n", "\t": "\\t", "\r": "\\r", " ": "␣", "$": r"\$"}
    code = lambda c: f"<0x{ord(c):02X}>" if ord(c) < 0x100 else f"<U+{ord(c):04X}>"  # noqa: E731
    return "".join(escapes.get(c) or (c if c.isprintable() else code(c)) for c in token) or "''"
