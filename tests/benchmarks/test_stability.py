"""`benchmarks/stability.py`: the pre-declared instability criteria on hand-made curves, the exact paired tests, the
regime choice, and a rerun that skips finished runs (no training: every run here is written by hand)."""

import itertools
import json
import math
import sys
from pathlib import Path

import pytest


sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "benchmarks"))  # the experiment's modules
import stability  # noqa: E402


HORIZON = 2000


def curve(fn, horizon: int = HORIZON) -> list[tuple[int, float]]:
    """(update, fn(update)) every 4 updates, as the trainer logs."""
    return [(s, fn(s)) for s in range(4, horizon + 1, 4)]


def evals(values: list[float], every: int = 250) -> list[tuple[int, float]]:
    """Held-out accuracies at updates 0, every, 2 x every, ..."""
    return [(i * every, v) for i, v in enumerate(values)]


LEARNS = evals([0.40, 0.55, 0.62, 0.66, 0.68, 0.69, 0.70, 0.70, 0.71])  # no drop, a 31 pp gain
FLAT_REWARD = curve(lambda s: 0.5)


def classify(entropy, accuracy=LEARNS, reward=FLAT_REWARD, **kwargs):
    return stability.classify_run(entropy, accuracy, HORIZON, reward=reward, **kwargs)


def test_trailing_mean_covers_the_window_in_updates_and_skips_missing_values():
    steps, values = [4, 8, 12, 16], [1.0, None, 3.0, float("nan")]
    assert stability.trailing_mean(steps, values, 8) == [1.0, 1.0, 3.0, 3.0]  # (s - 8, s]: 12 -> {8, 12}
    assert math.isnan(stability.trailing_mean([4], [None], 100)[0])


def test_a_level_entropy_and_a_learning_run_raise_no_flag():
    s = classify(curve(lambda s: 0.3))
    assert s["e0"] == pytest.approx(0.3) and s["e_late_ratio"] == pytest.approx(1.0)
    assert s["gain"] == pytest.approx(0.70 - 0.40, abs=0.011)
    for flag in ("explosion", "rebound", "collapse", "collapse_no_gain", "accuracy_drop", "early_blowup"):
        assert not s[flag], flag
    assert not s["late_unstable"]


def test_a_late_explosion_is_late_unstable_and_an_early_one_is_an_early_blowup():
    late = classify(curve(lambda s: 0.3 if s < 1500 else 0.9))
    assert late["explosion"] and late["late_unstable"] and not late["early_blowup"]
    assert 1500 <= late["explosion_onset"] <= 1600  # the 100-update trailing mean crosses 0.6 within the window
    early = classify(curve(lambda s: 0.3 if s <= 20 else 0.9))
    assert early["early_blowup"] and not early["explosion"]  # onset inside the first 10 % of the horizon


def test_a_rebound_from_a_low_counts_even_below_the_start_level():
    # Falls to 0.05 (a sixth of E0), then climbs back to 0.15: 3x its minimum, never above 2 x E0.
    s = classify(curve(lambda s: 0.3 if s <= 20 else (0.05 if s < 1200 else 0.15)))
    assert s["rebound"] and not s["explosion"] and s["late_unstable"]
    assert s["rebound_ratio"] == pytest.approx(3.0)
    assert not classify(curve(lambda s: 0.3 if s <= 20 else 0.05))["rebound"]  # stays low: no rebound


def test_a_collapse_is_an_instability_only_without_an_accuracy_gain():
    collapsing = curve(lambda s: 0.3 if s <= 20 else 0.05)
    learned = classify(collapsing)  # E_late / E0 = 1/6, but held-out accuracy gained 31 pp
    assert learned["collapse"] and not learned["collapse_no_gain"] and not learned["late_unstable"]
    stuck = classify(collapsing, accuracy=evals([0.40, 0.42, 0.41, 0.43, 0.42, 0.41, 0.42, 0.43, 0.42]))
    assert stuck["collapse_no_gain"] and stuck["late_unstable"]


def test_an_accuracy_drop_needs_10_pp_from_a_peak_reached_before_the_last_quarter():
    level = curve(lambda s: 0.3)
    falls = classify(level, accuracy=evals([0.40, 0.55, 0.70, 0.68, 0.65, 0.62, 0.60, 0.58, 0.56]))
    assert falls["acc_peak"] == 0.70 and falls["acc_peak_step"] == 500
    assert falls["acc_final"] == pytest.approx(0.57) and falls["drop"] == pytest.approx(0.13)
    assert falls["accuracy_drop"] and falls["late_unstable"]
    small = classify(level, accuracy=evals([0.40, 0.55, 0.70, 0.68, 0.65, 0.64, 0.63, 0.62, 0.61]))
    assert small["drop"] == pytest.approx(0.085) and not small["accuracy_drop"]
    # A peak at update 1500 (= 0.75 x horizon) is too late to count, however large the fall after it.
    late_peak = classify(level, accuracy=evals([0.40, 0.50, 0.55, 0.60, 0.62, 0.64, 0.90, 0.60, 0.60]))
    assert late_peak["acc_peak_step"] == 1500 and not late_peak["accuracy_drop"]


def test_a_reward_that_dies_early_is_an_early_blowup_and_a_dead_run_uses_its_last_updates():
    dying = curve(lambda s: 0.4 if s < 60 else 0.0, horizon=160)
    s = classify(curve(lambda s: 0.3, horizon=160), reward=dying, stopped_at=160)
    assert s["early_blowup"] and s["blowup_onset"] <= 200
    assert s["e_late"] == pytest.approx(0.3)  # the last 100 updates before the stop, not the empty last 10 %
    assert stability.dead_since(dying, 160, 100)
    assert not stability.dead_since(dying, 140, 100)  # update 56 (reward 0.4) is still inside (40, 140]
    assert not stability.dead_since([(96, 0.0), (100, 0.0)], 100, 100)  # two rows do not cover 100 updates


def brute_force_wilcoxon(diffs):
    """Two-sided exact p by enumerating all 2^n sign assignments of the mid-ranks (independent of the DP)."""
    nonzero = [d for d in diffs if d != 0]
    mags = sorted(abs(d) for d in nonzero)
    rank = {m: (mags.index(m) + 1 + len(mags) - mags[::-1].index(m)) / 2 for m in mags}
    ranks = [rank[abs(d)] for d in nonzero]
    w = sum(r for r, d in zip(ranks, nonzero) if d > 0)
    sums = [sum(r for r, s in zip(ranks, signs) if s) for signs in itertools.product((0, 1), repeat=len(ranks))]
    lower = sum(x <= w + 1e-9 for x in sums) / len(sums)
    upper = sum(x >= w - 1e-9 for x in sums) / len(sums)
    return w, min(1.0, 2 * min(lower, upper))


@pytest.mark.parametrize(
    "diffs",
    [
        [0.1, 0.2, 0.3, 0.4, 0.5],
        [0.3, -0.1, 0.2, 0.2, -0.2, 0.5, 0.0, 0.4],
        [-1.0, 2.0, -3.0, 4.0, 5.0, 6.0, -7.0, 8.0, 9.0, 10.0, 11.0, 12.0],
        [1.0, 1.0, -1.0, 1.0],
    ],
)
def test_wilcoxon_matches_enumeration(diffs):
    w, p = stability.wilcoxon_signed_rank(diffs)
    w_ref, p_ref = brute_force_wilcoxon(diffs)
    assert w == pytest.approx(w_ref) and p == pytest.approx(p_ref)


def test_wilcoxon_and_the_paired_comparison_on_known_values():
    assert stability.wilcoxon_signed_rank([0.1, 0.2, 0.3, 0.4, 0.5]) == (15.0, pytest.approx(2 / 32))
    assert stability.wilcoxon_signed_rank([0.0, 0.0]) == (0.0, 1.0)
    cmp = stability.paired_comparison({1: 0.5, 2: 0.4, 3: float("nan"), 4: 0.1}, {1: 0.2, 2: 0.1, 3: 0.0, 5: 0.0})
    assert cmp["seeds"] == [1, 2] and cmp["differences"] == pytest.approx([0.3, 0.3])  # paired, finite only
    assert cmp["positive"] == 2 and cmp["p_sign"] == pytest.approx(0.5)
    assert stability.paired_comparison({}, {1: 0.0}) == {"n": 0}


def summary(lr, arm, unstable, early=False):
    return {"lr": lr, "arm": arm, "late_unstable": unstable, "early_blowup": early}


def test_the_regime_is_the_lowest_lr_where_an_unmasked_arm_has_two_late_unstable_seeds():
    runs = [summary(1e-4, "justrl", i == 0) for i in range(4)]  # one seed: not enough
    runs += [summary(3e-4, "stapo", True) for _ in range(4)]  # a masked arm never makes a regime
    runs += [summary(3e-4, "grpo", i < 2) for i in range(4)]
    runs += [summary(6e-4, "justrl", True, early=True) for _ in range(4)]  # early blow-ups: not the drift
    assert stability.select_regime(runs) == {
        "lr": 3e-4,
        "arm": "grpo",
        "late_unstable": 2,
        "early_blowup": 0,
        "seeds": 4,
    }
    assert stability.select_regime(runs[:4] + runs[-4:]) is None


def write_finished_run(spec, out: Path) -> Path:
    """A finished run as `run_one` leaves it (`run.json` + `DONE`), made by hand: level entropy, a learning run."""
    folder = spec.folder(out)
    folder.mkdir(parents=True)
    steps = list(range(4, spec.updates + 1, 4))
    record = {
        "spec": {**vars(spec)},
        "resumed_from": None,
        "stopped_at": None,
        "curves": {
            "step": steps,
            "entropy": [0.3] * len(steps),
            "reward": [0.5] * len(steps),
            "s2t/silenced_ratio": [0.0] * len(steps),
            "s2t/candidate_ratio": [1e-4] * len(steps),
            "completions/mean_length": [30.0] * len(steps),
        },
        "heldout": [{"step": s, "accuracy": 0.4 + s / 1000, "pass": 0.9} for s in range(0, spec.updates + 1, 20)],
        "timing": {"wall_s": 12.0, "cpu_s": 11.0, "eval_s": 1.0, "updates_timed": spec.updates},
        "silenced_tokens": 0.0,
    }
    (folder / stability.RUN_FILE).write_text(json.dumps(record))
    (folder / stability.DONE).write_text("done\n")
    return folder


def test_a_rerun_skips_finished_runs_and_rewrites_the_report(tmp_path, capsys):
    out, results = tmp_path / "runs", tmp_path / "results"
    argv = ["--pilot", "--seeds", "0", "--lrs", "1e-4", "--arms", "justrl", "stapo", "--updates", "40"]
    argv += ["--eval-every", "20", "--out", str(out), "--results-dir", str(results), "--name", "t"]
    args = stability.parse_args(argv)
    specs = stability.phase_specs(args)
    assert [(s.arm, s.lr, s.seed, s.updates) for s in specs] == [("justrl", 1e-4, 0, 40), ("stapo", 1e-4, 0, 40)]
    folders = [write_finished_run(spec, out) for spec in specs]
    before = [(f / stability.RUN_FILE).read_bytes() for f in folders]

    assert stability.run_one(specs[0], out)["summary"]["acc_final"] == pytest.approx(0.43)  # read back, not trained
    stability.main(argv)
    assert "2 runs, 2 already done, 0 to run" in capsys.readouterr().out
    assert [(f / stability.RUN_FILE).read_bytes() for f in folders] == before
    assert stability.spent_hours(out, "pilot") == pytest.approx(22 / 3600)  # CPU seconds, not wall
    raw = json.loads((results / "t.json").read_text(), parse_constant=pytest.fail)  # strict JSON: no NaN
    assert stability.strict_json({"a": [math.nan, 1.0], "b": (math.inf,)}) == {"a": [None, 1.0], "b": [None]}
    assert sorted(r["spec"]["arm"] for r in raw["runs"]) == ["justrl", "stapo"]
    assert raw["regime"] is None
    report = (results / "t.md").read_text()
    assert "| 0.0001 | justrl | 1 | 0/1 |" in report and (results / "t-pilot.png").is_file()


def test_the_budget_stops_new_runs(tmp_path, capsys):
    out = tmp_path / "runs"
    argv = ["--pilot", "--seeds", "0", "1", "--lrs", "1e-4", "--arms", "justrl", "--updates", "40", "--out", str(out)]
    argv += [
        "--results-dir",
        str(tmp_path / "results"),
        "--budget-hours",
        "0.001",
    ]  # 3.6 s: one run of 11 CPU-s spends it
    write_finished_run(stability.phase_specs(stability.parse_args(argv))[0], out)
    stability.main(argv)
    assert "Budget spent (0.00 of 0.001 h): 1 runs not started." in capsys.readouterr().out
    assert not (out / "pilot" / "lr0.0001" / "justrl" / "seed1").exists()
