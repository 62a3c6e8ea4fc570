"""The figures (`stapo_trl.runfiles.plots`, `stapo_trl.runfiles.diagnostic_plots`): the diagnostic figures of a real
short run, ratios over seeds pooled from the counts as the accuracy table pools them, and readable token labels
(`stapo_trl.runfiles.token_labels`) with integer count ticks."""

import json
import warnings

import pytest
from datasets import Dataset
from testing_utils import text_reward, tiny_stapo_config

from stapo_trl import STAPOTrainer
from stapo_trl.runfiles.diagnostic_plots import _mean_series, plot_diagnostics
from stapo_trl.runfiles.metrics_log import load_run, read_metrics, read_token_records
from stapo_trl.runfiles.plots import TRAINING_CURVES, training_curves_figure


FIGURES = {"s2t_entropy_quantiles.png", "s2t_ratios.png", "s2t_prob_entropy.png", "s2t_top_tokens.png"}


def test_a_real_run_writes_the_files_the_figures_are_drawn_from(tiny_random_model_path, tmp_path):
    args = tiny_stapo_config(
        tmp_path / "run", seed=0, max_steps=4, logging_steps=2, steps_per_generation=2,
        s2t_prob_threshold=0.05,  # why: the random model spreads p over ~300 tokens: most are candidates
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}+{i % 7}"}]} for i in range(16)])
        trainer = STAPOTrainer(tiny_random_model_path, reward_funcs=text_reward, args=args, train_dataset=prompts)
    trainer.train()  # writes metrics.jsonl and spurious_tokens.jsonl (s2t_write_run_files, the default)
    run_dir = tmp_path / "run"
    rows = [row for row in read_metrics(str(run_dir)) if "loss" in row]
    assert [row["step"] for row in rows] == [2, 4]
    for row in rows:
        quantiles = [row[f"s2t/entropy_p{q}"] for q in (10, 50, 80, 95)]
        assert quantiles == sorted(quantiles) and quantiles[0] > 0
    records = read_token_records(run_dir)
    assert {r["step"] for r in records} == {2, 4} and any(r["kind"] == "silenced" for r in records)

    figures = plot_diagnostics([run_dir], tmp_path / "figures")
    assert {path.name for path in figures} == FIGURES
    for path in figures:
        assert path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Two runs overlay on the same figures.
    assert len(plot_diagnostics([run_dir, run_dir], tmp_path / "overlay", labels=["a", "b"])) == len(FIGURES)


def test_without_token_records_only_the_metric_figures_are_drawn(tmp_path):
    rows = [
        {"step": s, "s2t/silenced_ratio": r, "s2t/candidate_ratio": 2 * r, "s2t/entropy_p10": 0.1,
         "s2t/entropy_p50": 0.5, "s2t/entropy_p80": 0.8, "s2t/entropy_p95": 0.95}
        for s, r in [(1, 0.0), (2, 0.01)]
    ]  # fmt: skip
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the note that there is no token file
        figures = plot_diagnostics([tmp_path / "run"], tmp_path / "figures")
    assert {path.name for path in figures} == {"s2t_entropy_quantiles.png", "s2t_ratios.png"}


# ----------------------------------------------------------------------------------------------------------------
# Ratios over seeds are pooled from the counts
# ----------------------------------------------------------------------------------------------------------------

# Two seeds, two logging steps. Step 4: seed 0 silences 1 of 100 loss tokens (ratio 0.01), seed 1 none of 900 (0):
# pooled 1 / 1000 = 0.001, where the mean of the two ratios is 0.005. Step 8: 0 of 100 and 3 of 300 (0.01): pooled
# 3 / 400 = 0.0075 (mean 0.005). Candidates: step 4, 2 + 0 of 1000 = 0.002 (mean 0.01); step 8, 0 + 6 of 400 = 0.015
# (mean 0.01).
SEED_ROWS = [
    [
        {"step": 4, "reward": 0.5, "entropy": 0.3, "s2t/silenced_ratio": 0.01, "s2t/num_silenced": 1,
         "s2t/candidate_ratio": 0.02, "s2t/num_candidates": 2, "s2t/num_loss_tokens": 100},
        {"step": 8, "reward": 0.6, "entropy": 0.2, "s2t/silenced_ratio": 0.0, "s2t/num_silenced": 0,
         "s2t/candidate_ratio": 0.0, "s2t/num_candidates": 0, "s2t/num_loss_tokens": 100},
    ],
    [
        {"step": 4, "reward": 0.4, "entropy": 0.4, "s2t/silenced_ratio": 0.0, "s2t/num_silenced": 0,
         "s2t/candidate_ratio": 0.0, "s2t/num_candidates": 0, "s2t/num_loss_tokens": 900},
        {"step": 8, "reward": 0.7, "entropy": 0.1, "s2t/silenced_ratio": 0.01, "s2t/num_silenced": 3,
         "s2t/candidate_ratio": 0.02, "s2t/num_candidates": 6, "s2t/num_loss_tokens": 300},
    ],
]  # fmt: skip


def _panel_points(fig, title_start: str):
    import numpy as np

    ax = next(ax for ax in fig.axes if ax.get_title().startswith(title_start))
    return [(list(np.asarray(line.get_xdata())), list(np.asarray(line.get_ydata()))) for line in ax.lines], ax


def test_compare_figure_pools_the_silenced_ratio_over_seeds():
    """`stapo-train compare` draws compare.png with this figure: the silenced-ratio points are Σ silenced / Σ loss
    tokens over the seeds, not the mean of the seeds' ratios (0.005 and 0.005 here)."""
    import matplotlib.pyplot as plt

    fig = training_curves_figure({"stapo": SEED_ROWS}, curves=TRAINING_CURVES)
    try:
        points, ax = _panel_points(fig, "S2T silenced-token ratio")
        assert points == [([4, 8], [pytest.approx(0.001), pytest.approx(0.0075)])]
        assert ax.get_legend_handles_labels()[1] == ["stapo (2 seeds, pooled), 0 at 0/2 logged steps"]
        # The linear panels keep the mean over seeds (reward: (0.5 + 0.4) / 2 and (0.6 + 0.7) / 2, no smoothing).
        reward, _ = _panel_points(fig, "reward")
        assert reward[0][1] == [pytest.approx(0.45), pytest.approx(0.65)]
    finally:
        plt.close(fig)


def test_stapo_plot_pools_ratios_of_a_folder_of_seeds(tmp_path):
    """`stapo-plot ARM_FOLDER` (the compare layout) reads the seeds and draws the same pooled points; the diagnostics'
    ratio figure (silenced and candidate ratios) pools both ratios."""
    for seed, rows in enumerate(SEED_ROWS):
        (tmp_path / "arm" / f"seed{seed}").mkdir(parents=True)
        (tmp_path / "arm" / f"seed{seed}" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    seeds = load_run(str(tmp_path / "arm"))
    assert _mean_series(seeds, "s2t/silenced_ratio") == ([4, 8], [pytest.approx(0.001), pytest.approx(0.0075)])
    assert _mean_series(seeds, "s2t/candidate_ratio") == ([4, 8], [pytest.approx(0.002), pytest.approx(0.015)])
    # Not a ratio of counts: the mean over seeds (entropy (0.3 + 0.4) / 2, (0.2 + 0.1) / 2).
    assert _mean_series(seeds, "entropy") == ([4, 8], [pytest.approx(0.35), pytest.approx(0.15)])


# ----------------------------------------------------------------------------------------------------------------
# Readable token labels, integer counts
# ----------------------------------------------------------------------------------------------------------------


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
