r"""Readable labels for tokens: byte-level BPE fragments by their bytes, control characters by their code, a newline
as `\n` and a space as `␣` (what `s2t_top_tokens.png` and the trackers' token tables show), read from a run's
`tokenizer.json`."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any


def _byte_level_decoder() -> dict[str, int]:
    """The inverse of GPT-2's byte-level alphabet (`bytes_to_unicode`): the character a byte-level BPE vocabulary
    writes for each byte -> that byte (printable Latin-1 bytes stand for themselves, the others are shifted by 256)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {byte: byte for byte in printable}
    shift = 0
    for byte in range(256):
        if byte not in chars:
            chars[byte] = 256 + shift
            shift += 1
    return {chr(char): byte for byte, char in chars.items()}


_BYTE_DECODER = _byte_level_decoder()
_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")  # SentencePiece byte-fallback pieces, e.g. <0x0A>


def vocab_token_bytes(vocab_token: str, byte_level: bool = True) -> bytes | None:
    r"""The bytes a vocabulary entry stands for: a byte-fallback piece `<0xA1>` -> `b"\xa1"`; with `byte_level`, a
    byte-level BPE entry (`"Ġcarry"`, `"Ċ"`, `"â"`) through the byte decoder -> `b" carry"`, `b"\n"`, `b"\xe2"`.

    Returns:
        `bytes` or `None` when the entry is neither (e.g. a SentencePiece `"▁the"` or a special token with characters
        outside the byte alphabet).
    """
    match = _BYTE_FALLBACK.match(vocab_token)
    if match:
        return bytes([int(match.group(1), 16)])
    if byte_level and vocab_token and all(char in _BYTE_DECODER for char in vocab_token):
        return bytes(_BYTE_DECODER[char] for char in vocab_token)
    return None


def load_token_bytes(run_dir: os.PathLike | str) -> dict[int, bytes]:
    """`token id -> bytes` for the vocabulary of the tokenizer saved in `run_dir` (`tokenizer.json`, or the first
    per-seed sub-folder that has one); `{}` when there is none ([`tokenizer_token_bytes`])."""
    run_dir = os.fspath(run_dir)
    candidates = [os.path.join(run_dir, "tokenizer.json")]
    if os.path.isdir(run_dir):
        candidates += [os.path.join(run_dir, name, "tokenizer.json") for name in sorted(os.listdir(run_dir))]
    path = next((c for c in candidates if os.path.isfile(c)), None)
    if path is None:
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return tokenizer_token_bytes(json.load(f))
    except (OSError, ValueError):
        return {}


def tokenizer_token_bytes(spec: Mapping[str, Any]) -> dict[int, bytes]:
    """`token id -> bytes` from a `tokenizers` JSON spec (`tokenizer.json`, or a fast tokenizer's
    `backend_tokenizer.to_str()`). Byte-level entries are decoded only when the tokenizer's decoder or pre-tokenizer
    is `ByteLevel`; byte-fallback pieces (`<0x0A>`) always."""
    byte_level = '"ByteLevel"' in json.dumps([spec.get("decoder"), spec.get("pre_tokenizer")])
    vocab = (spec.get("model") or {}).get("vocab") or {}
    if not isinstance(vocab, dict):  # Unigram: a list of [piece, score]
        vocab = {piece: i for i, (piece, _) in enumerate(vocab)}
    vocab = dict(vocab)
    vocab.update({t["content"]: t["id"] for t in spec.get("added_tokens", [])})
    table = {}
    for token, token_id in vocab.items():
        raw = vocab_token_bytes(token, byte_level)
        if raw is not None:
            table[int(token_id)] = raw
    return table


def _escape(text: str) -> str:
    r"""Visible, mathtext-safe text: `\n` `\t` `\r` as escapes, a space as `␣`, other non-printables as `<0x16>`."""
    out = []
    for char in text:
        if char in "\n\t\r":
            out.append(json.dumps(char)[1:-1])
        elif char == " ":
            out.append("␣")
        elif not char.isprintable():
            out.append(f"<0x{ord(char):02X}>" if ord(char) < 0x100 else f"<U+{ord(char):04X}>")
        else:
            out.append(char)
    return "".join(out).replace("$", r"\$") or "''"


def readable_token(token: str, token_bytes: bytes | None = None, token_id: int | None = None) -> str:
    r"""A token as a readable figure label (the scheme [`TOKEN_LABEL_KEY`] explains under the figure).

    - text: as decoded, with a space shown as `␣`, `\n`, `\t`, `\r` as escapes and other non-printable characters
      as their code, e.g. `<0x16>`;
    - a byte-level BPE fragment that is not valid UTF-8 on its own (part of a multi-byte character; the tokenizer
      decodes it to `�`): its bytes, `byte 0xE2` or `bytes 0xE2 0x9F`;
    - such a fragment whose bytes are unknown (no tokenizer): `� id 161`.

    Args:
        token (`str`): the decoded token (`tokenizer.decode([id])`, the `token` of a `spurious_tokens.jsonl` record).
        token_bytes (`bytes`, *optional*): the bytes of its vocabulary entry ([`vocab_token_bytes`]).
        token_id (`int`, *optional*): its id, to tell unknown fragments apart.

    Returns:
        `str`: the label.
    """
    if token_bytes is not None:
        try:
            return _escape(token_bytes.decode("utf-8"))
        except UnicodeDecodeError:
            hex_bytes = " ".join(f"0x{b:02X}" for b in token_bytes)
            return f"byte {hex_bytes}" if len(token_bytes) == 1 else f"bytes {hex_bytes}"
    if "\ufffd" in token:
        return f"� id {token_id}" if token_id is not None else "�"
    return _escape(token)


TOKEN_LABEL_KEY = (
    "Labels: the decoded token; ␣ = space, \\n = newline, <0x16> = a control character by its code, "
    "byte 0xE2 = a byte-level BPE fragment that is not a character on its own (one byte of a multi-byte "
    "UTF-8 character, shown by its value)."
)


def top_token_labels(
    records: Sequence[dict[str, Any]], kind: str, k: int = 15, token_bytes: Mapping[int, bytes] | None = None
) -> list[tuple[str, int]]:
    """The k most frequent tokens of one record kind as ([`readable_token`] label, count), most frequent first.

    Counted by token id (records without one by their text), so different byte fragments stay apart.
    """
    token_bytes = token_bytes or {}
    counts: Counter = Counter()
    text: dict[Any, tuple[str, int | None]] = {}
    for record in records:
        if record["kind"] != kind:
            continue
        token_id = record.get("token_id")
        key = token_id if token_id is not None else record["token"]
        counts[key] += 1
        text.setdefault(key, (record["token"], token_id))
    return [
        (readable_token(text[key][0], token_bytes.get(text[key][1]), text[key][1]), count)
        for key, count in counts.most_common(k)
    ]
