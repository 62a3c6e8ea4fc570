"""Readable token labels and integer counts on the diagnostic figures, and shipped docs that point only inside the
repository (issue 12, item 13)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------------------------
# Figures: readable token labels, integer counts
# ---------------------------------------------------------------------------------------------------------------


def test_readable_token_labels_of_hand_made_byte_tokens():
    from stapo_trl.runfiles.token_labels import readable_token, vocab_token_bytes

    # Byte-level BPE vocabulary entries (GPT-2's byte alphabet) and SentencePiece byte-fallback pieces -> bytes.
    assert vocab_token_bytes("Ġcarry") == b" carry" and vocab_token_bytes("Ċ") == b"\n"
    assert vocab_token_bytes("â") == b"\xe2" and vocab_token_bytes("Ė") == b"\x16"
    assert vocab_token_bytes("<0x0A>") == b"\n" and vocab_token_bytes("<0xa1>", byte_level=False) == b"\xa1"
    assert vocab_token_bytes("▁the") is None and vocab_token_bytes("Ġx", byte_level=False) is None
    # Labels: fragments by their bytes, control characters escaped or by code, spaces visible, `$` safe.
    assert readable_token("\ufffd", b"\xe2", 161) == "byte 0xE2"
    assert readable_token("\ufffd", b"\xe2\x9f", 7) == "bytes 0xE2 0x9F"
    assert readable_token("⟦", "⟦".encode()) == "⟦"
    assert readable_token("\n", b"\n") == "\\n" and readable_token("\t") == "\\t"
    assert readable_token("\x16", b"\x16") == "<0x16>" and readable_token("\u200b") == "<U+200B>"
    assert readable_token(" carry", b" carry") == "␣carry"
    assert readable_token("\ufffd", None, 161) == "� id 161"
    assert readable_token("$x$") == r"\$x\$" and readable_token("") == "''"


def test_tracker_table_labels_tokens_like_the_figure(tiny_random_model_path, tmp_path):
    """The wandb/trackio table of top silenced tokens uses the figure's labels: a byte fragment by its bytes (read
    from the trainer's tokenizer), not `\ufffd#161`; different fragments stay apart."""
    import types

    from transformers import AutoTokenizer

    from stapo_trl.runfiles.callbacks import SpuriousTokenLogger

    tokenizer = AutoTokenizer.from_pretrained(tiny_random_model_path)
    lead, other, newline = tokenizer.convert_tokens_to_ids(["â", "Ý", "Ċ"])
    trainer = types.SimpleNamespace(processing_class=tokenizer)
    logger = SpuriousTokenLogger(trainer, path=str(tmp_path / "tokens.jsonl"))
    for kind, token_id in [("silenced", lead), ("silenced", lead), ("silenced", other), ("kept_candidate", newline)]:
        logger._count({"kind": kind, "token_id": token_id, "token": tokenizer.decode([token_id])})
    assert logger.silenced_counts == {"byte 0xE2": 2, "byte 0xDD": 1}
    assert logger.kept_candidate_counts == {"\\n": 1}


def test_top_tokens_figure_has_readable_labels_and_integer_count_ticks(tiny_random_model_path, tmp_path):
    from matplotlib.ticker import MaxNLocator
    from transformers import AutoTokenizer

    from stapo_trl.runfiles.diagnostic_plots import plot_top_tokens, top_tokens_figure
    from stapo_trl.runfiles.token_labels import load_token_bytes

    tokenizer = AutoTokenizer.from_pretrained(tiny_random_model_path)
    ids = tokenizer.convert_tokens_to_ids(["â", "Ċ", "Ġcarry", "Ė", "Ý"])  # real byte-level BPE entries
    assert tokenizer.unk_token_id not in ids

    def record(kind: str, token_id: int) -> dict:
        return {"kind": kind, "token_id": token_id, "token": tokenizer.decode([token_id]), "step": 4}

    counts = {"silenced": [(ids[0], 3), (ids[1], 2), (ids[2], 1)], "kept_candidate": [(ids[3], 2), (ids[4], 1)]}
    records = [record(kind, token_id) for kind, pairs in counts.items() for token_id, n in pairs for _ in range(n)]
    assert "\ufffd" in records[0]["token"]  # the tokenizer itself decodes a lone lead byte to the replacement char
    fig = top_tokens_figure({"run": records}, token_bytes={"run": load_token_bytes(tiny_random_model_path)})
    silenced_ax, kept_ax = fig.axes[:2]
    assert [t.get_text() for t in silenced_ax.get_yticklabels()] == ["byte 0xE2", "\\n", "␣carry"]
    assert [t.get_text() for t in kept_ax.get_yticklabels()] == ["<0x16>", "byte 0xDD"]
    for ax in (silenced_ax, kept_ax):
        locator = ax.xaxis.get_major_locator()
        assert isinstance(locator, MaxNLocator) and locator._integer
        fig.canvas.draw()
        low, high = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if low <= t <= high]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
    assert silenced_ax.get_xlabel() == "silenced occurrences over the run"
    assert "occurrences" in kept_ax.get_xlabel()
    assert any("byte 0xE2 = a byte-level BPE fragment" in text.get_text() for text in fig.texts)  # the label key
    assert silenced_ax.get_title() == "run: most frequent silenced tokens"  # all 3 shown: no "of N"
    # k smaller than the distinct tokens: the title says how many of how many are shown.
    fig = top_tokens_figure({"run": records}, k=2)
    assert fig.axes[0].get_title() == "run: most frequent silenced tokens (2 of 3 distinct)"
    assert fig.axes[1].get_title() == "run: most frequent kept candidates"
    # Without a tokenizer, fragments stay apart by id.
    fig = top_tokens_figure({"run": records})
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()][0] == f"� id {ids[0]}"
    assert plot_top_tokens({"run": records}, tmp_path / "top.png").stat().st_size > 1000


# ---------------------------------------------------------------------------------------------------------------
# Shipped docs point only inside the repository
# ---------------------------------------------------------------------------------------------------------------

SHIPPED_DOCS = ["README.md", "recipes/README.md", *(str(p.relative_to(REPO)) for p in sorted(REPO.glob("docs/*.md")))]
SHIPPED_DOCS += [str(p.relative_to(REPO)) for p in sorted(REPO.glob("recipes/**/*.yaml"))]
OUTSIDE = re.compile(r"\.\./|(?<![\w.])/(?:work|home|tmp|root|Users)/|\bshared/|\bSTAPO\.md\b|\bENVIRONMENT\.md\b")


@pytest.mark.parametrize("doc", SHIPPED_DOCS)
def test_shipped_docs_point_only_inside_the_repository(doc):
    text = (REPO / doc).read_text()
    outside = [m.group(0) for m in OUTSIDE.finditer(text)]
    assert not outside, f"{doc} points outside the repository: {outside}"
    # Relative Markdown links and images, and backticked repository paths, exist in the repository.
    targets = re.findall(r"\]\(([^)\s#]+)", text)
    targets += re.findall(r"`((?:benchmarks|docs|recipes|scripts|slurm|stapo_trl|tests|notebooks)/[\w./-]+)`", text)
    folder = (REPO / doc).parent
    for target in targets:
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        assert (folder / target).exists() or (REPO / target).exists(), f"{doc} names a missing file: {target}"
