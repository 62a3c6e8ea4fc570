"""The figures: every figure of a real short run, values drawn from hand-written rows, readable token labels."""

import json
from pathlib import Path

import pytest
from matplotlib.ticker import MaxNLocator
from testing_utils import PROMPTS, text_reward, tiny_stapo_config, write_jsonl
from transformers import AutoTokenizer

from stapo_trl import STAPOTrainer
from stapo_trl.cli import figures
from stapo_trl.diagnostics.token_records import readable_token, tokenizer_token_bytes
from stapo_trl.run_folder.logs import read_metrics, read_token_records


FIGURES = {"s2t_entropy_quantiles.png", "s2t_ratios.png", "s2t_prob_entropy.png", "s2t_top_tokens.png"}
PNG = b"\x89PNG\r\n\x1a\n"


def test_a_real_run_writes_the_files_every_figure_is_drawn_from(tiny_random_model_path, tmp_path):
    run = tmp_path / "run"  # τ_p 0.05: the random model spreads p over ~300 tokens, most are candidates
    args = tiny_stapo_config(run, seed=0, max_steps=2, logging_steps=1, steps_per_generation=2,
                             s2t_prob_threshold=0.05)  # fmt: skip
    trainer = STAPOTrainer(tiny_random_model_path, reward_funcs=text_reward, args=args, train_dataset=PROMPTS)
    trainer.train()  # writes metrics.jsonl and spurious_tokens.jsonl (s2t_write_run_files, the default)
    rows, records = [row for row in read_metrics(str(run)) if "loss" in row], read_token_records(run)
    assert [row["step"] for row in rows] == [1, 2] and {r["step"] for r in records} == {1, 2}
    assert any(r["kind"] == "silenced" for r in records)
    written = figures.plot_diagnostics([run], tmp_path / "figures")
    assert {path.name for path in written} == FIGURES
    assert all(path.read_bytes()[:8] == PNG and path.stat().st_size > 1000 for path in written)
    # The quantile curves are the rows' values: p50 solid, p80 dashed (one seed: no averaging); two runs overlay.
    seeds = figures.load_run(str(run))
    p50, p80 = figures.plot_entropy_quantiles({"run": seeds}).axes[0].lines
    assert list(p50.get_xdata()) == [1, 2] and list(p50.get_ydata()) == [row["s2t/entropy_p50"] for row in rows]
    assert list(p80.get_ydata()) == [row["s2t/entropy_p80"] for row in rows] and p80.get_linestyle() == "--"
    assert len(figures.plot_entropy_quantiles({"a": seeds, "b": seeds}).axes[0].lines) == 4


def _row(step, reward, entropy, silenced, candidates, loss_tokens):
    counts = {"silenced": silenced, "candidates": candidates, "loss_tokens": loss_tokens}
    return {"step": step, "reward": reward, "entropy": entropy, "s2t/silenced_ratio": silenced / loss_tokens,
            "s2t/candidate_ratio": candidates / loss_tokens, **{f"s2t/num_{k}": v for k, v in counts.items()},
            **{f"s2t/entropy_p{q}": q / 100 for q in (10, 50, 80, 95)}}  # fmt: skip


# Two seeds. Step 4: seed 0 silences 1 of 100 loss tokens, seed 1 none of 900: pooled 1 / 1000 = 0.001 (the mean of
# the ratios: 0.005); step 8: 0 of 100 and 3 of 300: 3 / 400 = 0.0075. Candidates: 2 / 1000 = 0.002, 6 / 400 = 0.015.
SEED_ROWS = [[_row(4, 0.5, 0.3, 1, 2, 100), _row(8, 0.6, 0.2, 0, 0, 100)],
             [_row(4, 0.4, 0.4, 0, 0, 900), _row(8, 0.7, 0.1, 3, 6, 300)]]  # fmt: skip


def _points(fig, title_start: str):
    ax = next(ax for ax in fig.axes if ax.get_title().startswith(title_start))
    return [(list(line.get_xdata()), list(line.get_ydata()), line.get_label()) for line in ax.lines]


def test_a_folder_of_seeds_is_drawn_as_the_mean_and_pooled_ratios_without_zero_denominators(tmp_path):
    for seed, rows in enumerate(SEED_ROWS):
        (tmp_path / "arm" / f"seed{seed}").mkdir(parents=True)
        write_jsonl(tmp_path / "arm" / f"seed{seed}" / "metrics.jsonl", rows)
    assert (seeds := figures.load_run(str(tmp_path / "arm"))) == SEED_ROWS
    written = figures.plot_diagnostics([tmp_path / "arm"], tmp_path / "figures")  # no token records: 2 figures
    assert {path.name for path in written} == {"s2t_entropy_quantiles.png", "s2t_ratios.png"}
    fig = figures.plot_training_curves({"stapo": seeds})
    assert _points(fig, "S2T silenced-token ratio") == [([4, 8], [pytest.approx(0.001), pytest.approx(0.0075)],
        "stapo (2 seeds, pooled), 0 at 0/2 logged steps")]  # fmt: skip
    # Reward: (0.5 + 0.4) / 2 and (0.6 + 0.7) / 2 (a window of 1 step at this length), the band from 0.4 to 0.7.
    assert _points(fig, "reward") == [([4, 8], [pytest.approx(0.45), pytest.approx(0.65)], "stapo (2 seeds)")]
    band = next(ax for ax in fig.axes if ax.get_title().startswith("reward")).collections[0].get_paths()[0].vertices
    assert band[:, 1].min() == pytest.approx(0.4) and band[:, 1].max() == pytest.approx(0.7)
    fig = figures.plot_training_curves({"stapo": seeds}, curves=figures.RATIO_CURVES)
    assert _points(fig, "S2T candidate ratio")[0][1] == [pytest.approx(0.002), pytest.approx(0.015)]
    # One seed, silenced ratio 0 at step 8: a log axis cannot show it, the legend counts it.
    fig = figures.plot_training_curves({"run": seeds[:1]}, curves=figures.RATIO_CURVES[:1])
    assert _points(fig, "S2T") == [([4], [0.01], "run, 0 at 1/2 logged steps")]
    counts = [[(1, 0, 0), (2, 2, 10), (3, 1, 10)], [(1, 0, 0), (2, 0, 30)]]  # (step, silenced, loss tokens)
    seeds = [[{"step": t, "s2t/num_silenced": n, "s2t/num_loss_tokens": d} for t, n, d in rows] for rows in counts]
    # Step 1: no loss token in either seed (undefined, left out); step 2: 2 / 40; step 3: seed 1 did not log it.
    steps, values, note = figures.seed_values(seeds, "s2t/silenced_ratio")
    assert steps == [2] and values.tolist() == [[pytest.approx(0.05)]] and note == " (2 seeds, pooled)"
    # A seed without the counts (a file from before they were logged): the mean of the ratios, NaN and null left out.
    seeds = [[{"step": 2, "s2t/silenced_ratio": 0.3}], [{"step": 2, "s2t/silenced_ratio": 0.1}, {"step": 3}]]
    seeds[0].append({"step": 3, "s2t/silenced_ratio": float("nan")})
    steps, values, note = figures.seed_values(seeds, "s2t/silenced_ratio")
    assert steps == [2] and values.mean(axis=0).tolist() == [pytest.approx(0.2)] and note == " (2 seeds)"


def test_token_bytes_readable_labels_and_the_top_tokens_figure(tiny_random_model_path, tmp_path):
    vocab = {"Ġcarry": 0, "Ċ": 1, "â": 2, "Ė": 3, "<0x0A>": 4}
    byte_level = {"model": {"vocab": vocab}, "decoder": {"type": "ByteLevel"}}
    assert tokenizer_token_bytes(byte_level) == {0: b" carry", 1: b"\n", 2: b"\xe2", 3: b"\x16", 4: b"\n"}
    # SentencePiece (Unigram, no ByteLevel): only the byte-fallback pieces have bytes.
    unigram = {"model": {"vocab": [["▁the", -1.0], ["<0xA1>", -2.0], ["Ġx", -3.0]]}, "added_tokens": []}
    assert tokenizer_token_bytes(unigram) == {1: b"\xa1"}
    # Labels: fragments by their bytes, control characters escaped or by code, spaces visible, `$` safe.
    labels = {("\ufffd", b"\xe2", 161): "byte 0xE2", ("\ufffd", b"\xe2\x9f", 7): "bytes 0xE2 0x9F",
              ("⟦", "⟦".encode()): "⟦", ("\n", b"\n"): "\\n", ("\t",): "\\t", ("\x16", b"\x16"): "<0x16>",
              ("\u200b",): "<U+200B>", (" carry", b" carry"): "␣carry", ("\ufffd", None, 161): "� id 161",
              ("$x$",): r"\$x\$", ("",): "''"}  # fmt: skip
    assert {args: readable_token(*args) for args in labels} == labels
    tokenizer = AutoTokenizer.from_pretrained(tiny_random_model_path)
    ids = tokenizer.convert_tokens_to_ids(["â", "Ċ", "Ġcarry", "Ė", "Ý"])  # real byte-level BPE entries
    assert tokenizer.unk_token_id not in ids
    counts = {"silenced": [(ids[0], 3), (ids[1], 2), (ids[2], 1)], "kept_candidate": [(ids[3], 2), (ids[4], 1)]}
    records = [{"kind": kind, "token_id": i, "token": tokenizer.decode([i]), "step": 4}
               for kind, pairs in counts.items() for i, n in pairs for _ in range(n)]  # fmt: skip
    assert "\ufffd" in records[0]["token"]  # the tokenizer itself decodes a lone lead byte to the replacement char
    vocabulary = json.loads((Path(tiny_random_model_path) / "tokenizer.json").read_text())
    fig = figures.plot_top_tokens({"run": records}, token_bytes={"run": tokenizer_token_bytes(vocabulary)})
    silenced_ax, kept_ax = fig.axes[:2]
    assert [t.get_text() for t in silenced_ax.get_yticklabels()] == ["byte 0xE2", "\\n", "␣carry"]
    assert [t.get_text() for t in kept_ax.get_yticklabels()] == ["<0x16>", "byte 0xDD"]
    assert [bar.get_width() for bar in silenced_ax.patches] == [3, 2, 1]
    fig.draw_without_rendering()
    for ax in (silenced_ax, kept_ax):
        assert isinstance(ax.xaxis.get_major_locator(), MaxNLocator) and ax.xaxis.get_major_locator()._integer
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
    assert silenced_ax.get_xlabel() == "silenced occurrences over the run"
    assert any("byte 0xE2 = a byte-level BPE fragment" in text.get_text() for text in fig.texts)  # the label key
    assert silenced_ax.get_title() == "run: most frequent silenced tokens"  # all 3 shown: no "of N"
    titles = [ax.get_title() for ax in figures.plot_top_tokens({"run": records}, k=2).axes]  # k < distinct tokens
    assert titles == ["run: most frequent silenced tokens (2 of 3 distinct)", "run: most frequent kept candidates"]
    assert figures.plot_top_tokens({"run": records}).axes[0].get_yticklabels()[0].get_text() == f"� id {ids[0]}"
    assert figures.plot_top_tokens({"run": records}, tmp_path / "top.png").read_bytes()[:8] == PNG
