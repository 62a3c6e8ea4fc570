"""Rewards (`stapo_trl.rewards`): accuracy, format, the registry and resolver, `checked_reward`, dotted paths."""

import inspect
import json
import logging
import math
import re
import sys
import traceback
from fractions import Fraction
from types import SimpleNamespace

import math_verify.grader
import numpy as np
import pytest
import torch
from testing_utils import PROMPTS, STAPO_RECIPE, addition_rows, tiny_stapo_config, write_jsonl

from stapo_trl import STAPOTrainer, rewards
from stapo_trl.cli.train import main as train_main
from stapo_trl.rewards import checked_reward, completion_text, format_reward, get_reward_funcs, math_accuracy_reward


_chat = lambda text: [{"role": "assistant", "content": text}]  # noqa: E731


def test_math_accuracy_and_format_rewards_completion_text_the_registry_and_the_current_folder(monkeypatch, caplog,
        tmp_path, tmp_path_factory):  # fmt: skip
    completions = [r"\boxed{85}", _chat(r"so \boxed{085}"), r"\boxed{84}", "85", _chat(""), r"\boxed{\frac{1}{2}}",
                   r"\boxed{27}", r"\boxed{2, 1}", r"\boxed{1-\frac{1}{e}}", r"\boxed{\frac{\pi}{6}}",
                   r"\boxed{e^{-2}}"]  # fmt: skip
    golds = ["85"] * 5 + ["0.5", 27.0, ["$1$", "$2$"], r"1 - \frac{1}{\mathrm{e}}",
                          r"\operatorname{arcsin}\frac{1}{2}", r"{\rm e}^{-2}"]  # fmt: skip
    # GRPOTrainer passes prompts, completion_ids, dataset columns and trainer_state as keyword arguments too.
    extra = dict(prompts=["1+2"] * len(golds), completion_ids=[[1]] * len(golds), trainer_state=None)
    assert math_accuracy_reward(completions, golds, **extra) == [1.0, 1.0, 0.0, 0.0, 0.0] + [1.0] * 6
    assert math_accuracy_reward([r"\boxed{1+\frac{1}{e}}"], golds[8:9]) == [0.0]
    with pytest.raises(ValueError, match="solution"):
        math_accuracy_reward(completions, golds[:-1])
    # Five answers that would run for minutes if evaluated: refused (0.0, counted as timeouts), the rest graded.
    golds = [r"\frac{1}{3}", r"2\sqrt{2}", "17", r"\frac{\pi}{4}"]
    answers = [r"\frac{2}{6}", r"\sqrt{8}", "17", r"\frac{\pi}{4}"]
    bad = {3: r"10^{10^{10}}", 100: r"2003^{2002^{2001}}", 200: r"(10^{7})!", 300: r"9^{9^{9^{9}}}", 511: "7^{7^{77}}"}
    completions, logged = [rf"\boxed{{{bad.get(i, answers[i % 4])}}}" for i in range(512)], {}
    got = math_accuracy_reward(completions, [golds[i % 4] for i in range(512)], log_metric=logged.__setitem__)
    assert [got[i] for i in bad] == [0.0] * 5 and sum(got) == 512 - 5
    assert logged["grading/timeout_ratio"] == pytest.approx(5 / 512)
    # Grader errors score 0.0, unparseable golds None: logged and counted.
    monkeypatch.setattr(math_verify.grader, "sympy_expr_eq", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("x")))
    logged, completions = {}, [r"\boxed{x+1}", r"\boxed{7}", r"\boxed{10^{10^{10}}}", r"\boxed{\frac{}"]
    with caplog.at_level(logging.WARNING, logger="stapo_trl.rewards"):
        got = math_accuracy_reward(completions, ["1+x", "7", "7", r"\frac{zz"], log_metric=logged.__setitem__)
    assert got == [0.0, 1.0, 0.0, None]  # the integer path needs no math-verify; a refusal is a timeout
    ratios = {"error_ratio": 0.5, "timeout_ratio": 0.25, "gold_unparseable_ratio": 0.25}
    assert logged == {f"grading/{k}": v for k, v in ratios.items()}
    messages = "\n".join(r.getMessage() for r in caplog.records)
    assert "2/4 completions hit a grader error" in messages and r"gold answer '\\frac{zz' does not parse" in messages
    ends = [r"steps... \boxed{85}", r"steps... $\boxed{85}$.", r"\[ \boxed{85} \]",
            r"first \boxed{3}, then \boxed{85}"]  # fmt: skip
    no = [r"\boxed{85} and then more text", "no box at all", r"\boxed{}", r"\boxed{8", ""]
    assert format_reward(ends + no) == format_reward(list(map(_chat, ends + no))) == [1.0] * 4 + [0.0] * 5
    turns = [[{"role": "user", "content": "q"}, *_chat("a")], _chat([{"type": "text", "text": t} for t in "ab"])]
    assert [completion_text(c) for c in ("x", None, [], *turns)] == ["x", "", "", "a", "ab"]
    both = [math_accuracy_reward, format_reward]
    assert get_reward_funcs(["math_accuracy", "format"]) == get_reward_funcs("math_accuracy,format") == both
    assert get_reward_funcs(["math_accuracy_reward", "stapo_trl.rewards.format_reward"]) == both
    assert list(rewards.REWARDS.values()) == both and list(rewards.REWARDS) == ["math_accuracy", "format"]
    for name in ["accuracy", "stapo_trl.rewards.nope", "not_a_module_xyz.func", " "]:  # unknown: the registry listed
        with pytest.raises(ValueError, match=re.escape("['format', 'math_accuracy']")):
            get_reward_funcs([name])
    # The current folder off sys.path (as for an installed command), nor another test's, its modules unimported.
    monkeypatch.chdir(tmp_path)
    others, mine = str(tmp_path_factory.getbasetemp()), ("my_rewards", "lab", "nowhere_rewards")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".") and not p.startswith(others)])
    monkeypatch.setattr(sys, "modules", {k: v for k, v in sys.modules.items() if k.split(".")[0] not in mine})
    (tmp_path / "lab" / "rl").mkdir(parents=True)
    for path, text in [("my_rewards.py", "def exact_match(completions, solution, **kwargs):\n    return [1.0]\n"),
                       ("lab/__init__.py", ""), ("lab/rl/__init__.py", ""),
                       ("lab/rl/rewards.py", "def brevity(completions, **kwargs):\n    return [0.5]\n")]:  # fmt: skip
        (tmp_path / path).write_text(text)
    exact_match, brevity = get_reward_funcs("my_rewards.exact_match,lab.rl.rewards.brevity")
    assert exact_match.__name__ == "exact_match" and exact_match([["x"]], ["1"]) == [1.0] and brevity([["x"]]) == [0.5]
    with pytest.raises(ValueError) as excinfo:
        get_reward_funcs(["nowhere_rewards.exact_match"])
    message = str(excinfo.value)
    assert "No module named 'nowhere_rewards'" in message and f"({tmp_path}) or PYTHONPATH" in message
    assert "\n" not in message


@pytest.mark.slow  # a stapo-train run
def test_extra_columns_reach_a_dotted_path_reward(tmp_path, tiny_math_model_path, monkeypatch):
    module = f"user_rewards_{tmp_path.name}"
    (tmp_path / f"{module}.py").write_text("CALLS = []\ndef difficulty_reward(completions, solution, difficulty, "
        "source, **kwargs):\n    CALLS.append(list(zip(kwargs['prompts'], solution, difficulty, source)))\n"
        "    return [float(d) for d in difficulty]\n")  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    # 8 problems (one rollout step) with two extra columns; `problem` -> prompt and `answer` -> solution are mapped.
    rows = [{**row, "difficulty": i / 10, "source": f"set-{i % 3}"} for i, row in enumerate(addition_rows(8))]
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--dataset_name"]
    argv += [write_jsonl(tmp_path / "graded.jsonl", rows), "--output_dir", str(tmp_path / "out"), "--max_steps", "1"]
    train_main([*argv, "--reward_funcs", f"{module}.difficulty_reward", *"--eval_before_after false --save_steps 100 "
                "--disable_tqdm true --logging_steps 1".split()])  # fmt: skip
    seen = [item for call in sys.modules[module].CALLS for item in call]
    assert len(seen) == 64  # one rollout step: 8 prompts x 8, each completion with its own prompt's row
    by_problem = {row["problem"]: (row["answer"], row["difficulty"], row["source"]) for row in rows}
    for prompt, solution, difficulty, source in seen:
        assert (solution, difficulty, source) == by_problem[prompt[0]["content"].split("\n")[0]], prompt
    log = json.loads((tmp_path / "out" / "trainer_state.json").read_text())["log_history"]
    assert log[0]["rewards/difficulty_reward/mean"] == pytest.approx(0.35)  # TRL's mean: the 8 prompts' difficulty


def unsure(completions, returned, **kwargs):
    return returned


ONE_PER = "at step 1, but 4 were expected (one per prompt-completion pair): return one float per completion, None for "
INF = ("inf or -inf for {} at step 1: the advantages of their groups are then not numbers, and those groups teach "
       "nothing")  # fmt: skip
NAN = "NaN for {} at step 1: TRL takes NaN for None (no reward), so they teach nothing"


@pytest.mark.parametrize("returned, raised, line", [
    (None, TypeError, "None"), (1.0, TypeError, "1.0"), ("0.5", TypeError, "'0.5'"),  # TRL: a str's characters
    (["1.0"] * 4, TypeError, "['1.0', '1.0', '1.0', '1.0']"), ([[1.0]] * 4, TypeError, "[[1.0], [1.0], [1.0], [1.0]]"),
    ({i: 1.0 for i in range(4)}, TypeError, "{0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}"),  # TRL trained on its keys
    ([1.0] * 3, ValueError, "3 rewards"), ([1.0] * 5, ValueError, "5 rewards"), ([], ValueError, "0 rewards"),
    ([math.inf, 1.0, None, 0.0], None, INF.format("1 of 4 completions (25%)")),
    ([-math.inf, -math.inf, None, 0.0], None, INF.format("2 of 4 completions (50%)")),
    ([np.float32("inf")] * 4, None, INF.format("4 of 4 completions (100%)")),
    ([math.nan, 1.0, None, 0.0], None, NAN.format("1 of 4 completions (25%)")),
    ([np.float32("nan")] * 3 + [1.0], None, NAN.format("3 of 4 completions (75%)")),
    ([torch.tensor(math.nan)] * 4, None, NAN.format("4 of 4 completions (100%)")),  # every one: still named, as NaN
])  # fmt: skip
def test_checked_reward_refuses_no_number_per_completion_and_warns_inf_or_nan_once(returned, raised, line, caplog):
    checked, four = checked_reward(unsure), dict(completions=["a", "b", "c", "d"], returned=returned)
    if raised:
        with pytest.raises(raised) as error:
            checked(**four, trainer_state=SimpleNamespace(global_step=0))  # step 1 being trained
        assert str(error.value) == f"Reward function unsure returned {line} {ONE_PER}one it cannot judge."
        assert error.value.__notes__ == ["In reward function unsure at step 1."]
        return
    with caplog.at_level(logging.WARNING, logger="stapo_trl.rewards"):
        for step in (0, 1):
            checked(**four, trainer_state=SimpleNamespace(global_step=step))
    assert [r.getMessage() for r in caplog.records if r.name == "stapo_trl.rewards"] == [f"Reward function unsure "
        f"returned {line}. Return a finite number, or None for a completion it cannot judge (shown once)"]  # fmt: skip


def half_judged(completions, prompts, trainer_state, **kwargs):
    if trainer_state.global_step == 1:  # the second step
        return [1 / 0]
    return [None if i % 2 else 1.0 + i for i in range(len(completions))]


def test_the_trainer_checks_its_rewards_under_trls_names(tmp_path, tiny_random_model_path, caplog):
    for returned in [np.array([1.0, 0.0, 0.5]), torch.tensor([1.0, 0.0, 0.5]), [np.True_, np.False_, 0.5],
                     (torch.tensor(v) for v in (1.0, 0.0, 0.5)), [1, False, Fraction(1, 2)]]:  # fmt: skip
        got = checked_reward(unsure)(completions=["a", "b", "c"], returned=returned)  # what TRL trains on passes
        assert torch.tensor(got, dtype=torch.float32).tolist() == [1.0, 0.0, 0.5]
    # TRL's name and signature kept; `None` for some completions trains silently; an exception gets a note
    (checked,) = rewards.resolve_reward_names([half_judged])
    assert checked.__name__ == "half_judged"
    assert list(inspect.signature(checked).parameters)[:2] == ["completions", "prompts"]
    args = tiny_stapo_config(tmp_path, max_steps=2, logging_steps=1)
    trainer = STAPOTrainer(tiny_random_model_path, half_judged, args=args, train_dataset=PROMPTS)
    with caplog.at_level(logging.WARNING, logger="stapo_trl.rewards"), pytest.raises(ZeroDivisionError) as raised:
        trainer.train()
    assert raised.value.__notes__ == ["In reward function half_judged at step 2."]
    assert traceback.extract_tb(raised.value.__traceback__)[-1].name == "half_judged"  # the reward's own line
    assert trainer.state.log_history[0]["rewards/half_judged/mean"] == 2.0  # step 1: (1 + 3) / 2, the None left out
    assert [r.getMessage() for r in caplog.records if r.name == "stapo_trl.rewards"] == []
