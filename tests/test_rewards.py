"""TRL-convention rewards (`stapo_trl.rewards`): accuracy, format, the registry and its resolver, and a user's reward
named by its dotted path that reads extra dataset columns in a real `stapo-train` run."""

import json
import logging
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from testing_utils import STAPO_RECIPE, addition_rows, write_jsonl

from stapo_trl.rewards import REWARDS, completion_text, format_reward, get_reward_funcs, math_accuracy_reward


def _chat(text):
    return [{"role": "assistant", "content": text}]


def test_math_accuracy_strings_and_chat():
    completions = [r"\boxed{85}", _chat(r"so \boxed{085}"), r"\boxed{84}", "85", _chat("")]
    solution = ["85", "85", "85", "85", "85"]
    assert math_accuracy_reward(completions, solution) == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_math_accuracy_symbolic_and_float_golds():
    completions = [r"\boxed{\frac{1}{2}}", r"\boxed{27}", r"\boxed{2, 1}"]
    assert math_accuracy_reward(completions, ["0.5", 27.0, ["$1$", "$2$"]]) == [1.0, 1.0, 1.0]


def test_unparseable_gold_gives_none_and_logs(caplog):
    with caplog.at_level(logging.WARNING, logger="stapo_trl.rewards"):
        rewards = math_accuracy_reward([r"\boxed{\frac{}", r"\boxed{1}"], [r"\frac{zz", r"\frac{zz"])
    assert rewards == [None, None]  # never 0 or 1 (TRL turns None into NaN)
    assert any("does not parse" in r.message for r in caplog.records)


def test_grader_error_scores_zero_and_is_logged(monkeypatch, caplog):
    import math_verify.grader

    monkeypatch.setattr(
        math_verify.grader, "sympy_expr_eq", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom"))
    )
    logged = {}
    with caplog.at_level(logging.WARNING, logger="stapo_trl.rewards"):
        rewards = math_accuracy_reward(
            [r"\boxed{x+1}", r"\boxed{7}", r"\boxed{10^{10^{10}}}", r"\boxed{1}"],
            ["1+x", "7", "7", r"\frac{zz"],
            log_metric=lambda k, v: logged.__setitem__(k, v),
        )
    assert rewards == [0.0, 1.0, 0.0, None]  # the integer path does not need math-verify; a refusal is a timeout
    assert logged == {
        "grading/error_ratio": 0.5,
        "grading/timeout_ratio": 0.25,
        "grading/gold_unparseable_ratio": 0.25,
    }
    assert any("2/4 completions hit a grader error" in r.message for r in caplog.records)


def test_length_mismatch_raises():
    with pytest.raises(ValueError, match="solution"):
        math_accuracy_reward(["a", "b"], ["1"])


def test_accepts_trl_kwargs():
    # GRPOTrainer passes prompts, completion_ids, dataset columns and trainer_state as keyword arguments.
    rewards = math_accuracy_reward(
        completions=[r"\boxed{3}"], solution=["3"], prompts=["1+2"], completion_ids=[[1, 2]], trainer_state=None
    )
    assert rewards == [1.0]


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"steps... \boxed{85}", 1.0),
        (r"steps... $\boxed{85}$.", 1.0),
        (r"\[ \boxed{85} \]", 1.0),
        (r"first \boxed{3}, then \boxed{85}", 1.0),  # intermediate boxes are fine; the last one counts
        (r"\boxed{85} and then more text", 0.0),  # the answer must end the completion
        (r"no box at all", 0.0),
        (r"\boxed{}", 0.0),
        (r"\boxed{8", 0.0),  # unterminated
        ("", 0.0),
    ],
)
def test_format_reward(text, expected):
    assert format_reward([text]) == [expected]
    assert format_reward([_chat(text)]) == [expected]


def test_completion_text_layouts():
    assert completion_text("x") == "x"
    assert completion_text(None) == ""
    assert completion_text([]) == ""
    assert completion_text([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]) == "a"
    assert (
        completion_text(
            [{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
        )
        == "ab"
    )


def test_registry_and_resolver():
    assert get_reward_funcs(["math_accuracy", "format"]) == [math_accuracy_reward, format_reward]
    assert get_reward_funcs("math_accuracy,format") == [math_accuracy_reward, format_reward]
    assert get_reward_funcs(["math_accuracy_reward"]) == [math_accuracy_reward]
    assert get_reward_funcs(["stapo_trl.rewards.format_reward"]) == [format_reward]
    # TRL names reward metrics after __name__.
    assert {f.__name__ for f in REWARDS.values()} == {"math_accuracy_reward", "format_reward"}


@pytest.mark.parametrize("name", ["accuracy", "stapo_trl.rewards.nope", "not_a_module_xyz.func"])
def test_unknown_reward_lists_registry(name):
    with pytest.raises(ValueError) as info:
        get_reward_funcs([name])
    assert str(sorted(REWARDS)) in str(info.value)


# ----------------------------------------------------------------------------------------------------------------
# Upright-constant golds score, pathological answers are refused (0.0)
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        (r"\boxed{1-\frac{1}{e}}", r"1 - \frac{1}{\mathrm{e}}", 1.0),  # the reported gold, once "unparseable" (None)
        (r"\boxed{1+\frac{1}{e}}", r"1 - \frac{1}{\mathrm{e}}", 0.0),
        (r"\boxed{\frac{\pi}{6}}", r"\operatorname{arcsin}\frac{1}{2}", 1.0),
        (r"\boxed{e^{-2}}", r"{\rm e}^{-2}", 1.0),
    ],
)
def test_upright_gold_is_scored(completion, gold, expected):
    assert math_accuracy_reward([completion], [gold]) == [expected]


def test_batch_of_512_with_pathological_answers_is_bounded():
    # Five answers that would run for minutes if evaluated: refused (0.0, counted as timeouts), the rest graded.
    golds = [r"\frac{1}{3}", r"2\sqrt{2}", "17", r"\frac{\pi}{4}"]
    answers = [r"\frac{2}{6}", r"\sqrt{8}", "17", r"\frac{\pi}{4}"]
    completions = [rf"so \boxed{{{answers[i % 4]}}}" for i in range(512)]
    solution = [golds[i % 4] for i in range(512)]
    bad = {3: r"10^{10^{10}}", 100: r"2003^{2002^{2001}}", 200: r"(10^{7})!", 300: r"9^{9^{9^{9}}}", 511: "7^{7^{77}}"}
    for i, text in bad.items():
        completions[i] = rf"\boxed{{{text}}}"
    logged = {}
    rewards = math_accuracy_reward(completions, solution, log_metric=lambda k, v: logged.__setitem__(k, v))
    assert [rewards[i] for i in bad] == [0.0] * 5  # never correct
    assert sum(rewards) == 512 - 5
    assert logged["grading/timeout_ratio"] == pytest.approx(5 / 512)


# A user's reward module, written to a temporary folder on sys.path and named by its dotted path.
REWARD_MODULE = '''
CALLS = []


def difficulty_reward(completions, solution, difficulty, source, **kwargs):
    """A user reward that reads two extra dataset columns: harder problems weigh more."""
    CALLS.append(list(zip(kwargs["prompts"], solution, difficulty, source)))
    return [float(d) for d in difficulty]
'''


def test_extra_columns_reach_a_dotted_path_reward(tmp_path, tiny_math_model_path, monkeypatch):
    import importlib

    from stapo_trl.cli.train import main

    module = f"user_rewards_{tmp_path.name}"
    (tmp_path / f"{module}.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    # 8 problems (one rollout step) with two extra columns; `problem` -> prompt and `answer` -> solution are mapped.
    rows = [{**row, "difficulty": i / 10, "source": f"set-{i % 3}"} for i, row in enumerate(addition_rows(8))]
    data = write_jsonl(tmp_path / "graded.jsonl", rows)
    out = tmp_path / "out"
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--dataset_name", data]
    argv += ["--output_dir", str(out), "--reward_funcs", f"{module}.difficulty_reward", "--max_steps", "1"]
    argv += ["--eval_before_after", "false", "--disable_tqdm", "true", "--logging_steps", "1", "--save_steps", "100"]
    main(argv)
    calls = importlib.import_module(module).CALLS
    # One rollout step of 64 completions: 8 prompts x 8, each completion with its own prompt's row.
    seen = [item for call in calls for item in call]
    assert len(seen) == 64
    by_problem = {row["problem"]: (row["answer"], row["difficulty"], row["source"]) for row in rows}
    for prompt, solution, difficulty, source in seen:
        problem = prompt[0]["content"].split("\n")[0]
        assert (solution, difficulty, source) == by_problem[problem], prompt
    assert sorted({item[2] for item in seen}) == [i / 10 for i in range(8)]
    # TRL logs the reward's mean: the mean difficulty over the 8 prompts (each 8 times) = 0.35
    log = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert log[0]["rewards/difficulty_reward/mean"] == pytest.approx(0.35)


# A dotted reward path names a module in the folder the command runs from, as `python script.py` would find it: the
# README's `stapo-train ... --reward_funcs my_rewards.exact_match` failed as printed ("No module named 'my_rewards'")
# because an installed command does not have that folder on sys.path.


@pytest.fixture
def user_folder(tmp_path, monkeypatch):
    """The current folder is a fresh one that is not on sys.path; sys.path and sys.modules are restored after."""
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.setattr(sys, "modules", dict(sys.modules))
    return tmp_path


def test_a_module_in_the_current_folder_is_imported(user_folder):
    (user_folder / "my_rewards.py").write_text("def exact_match(completions, solution, **kwargs):\n    return [1.0]\n")
    (func,) = get_reward_funcs(["my_rewards.exact_match"])
    assert func.__name__ == "exact_match" and func([["x"]], ["1"]) == [1.0]


def test_a_package_in_the_current_folder_is_imported(user_folder):
    (user_folder / "lab" / "rl").mkdir(parents=True)
    (user_folder / "lab" / "__init__.py").write_text("")
    (user_folder / "lab" / "rl" / "__init__.py").write_text("")
    (user_folder / "lab" / "rl" / "rewards.py").write_text("def brevity(completions, **kwargs):\n    return [0.5]\n")
    (func,) = get_reward_funcs("lab.rl.rewards.brevity")
    assert func([["x"]]) == [0.5]


def test_a_missing_module_names_the_current_folder_and_pythonpath(user_folder):
    with pytest.raises(ValueError) as excinfo:
        get_reward_funcs(["nowhere_rewards.exact_match"])
    message = str(excinfo.value)
    assert "No module named 'nowhere_rewards'" in message and str(user_folder) in message and "PYTHONPATH" in message
    assert "\n" not in message


# ---------------------------------------------------------------------------------------------------------------
# What a reward function returns, checked where the product trainer resolves it (`checked_reward`)
# ---------------------------------------------------------------------------------------------------------------


def returns_none(completions, **kwargs):
    return None


def returns_one_number(completions, **kwargs):
    return 1.0


def returns_text(completions, **kwargs):
    return "0.5"


def returns_texts(completions, **kwargs):
    return ["1.0"] * len(completions)


def returns_a_dict(completions, **kwargs):
    return {i: 1.0 for i in range(len(completions))}


def returns_lists(completions, **kwargs):
    return [[1.0] for _ in completions]


@pytest.mark.parametrize(
    "reward, returned",
    [
        (returns_none, "None"),  # the reported case: TRL's `TypeError: 'NoneType' object is not iterable`
        (returns_one_number, "1.0"),  # a batch score instead of one per completion
        (returns_text, "'0.5'"),  # a score left as text (TRL would take its characters for 3 rewards)
        # Reported: scores as text stopped TRL with `ValueError: too many dimensions 'str'`, a traceback into torch.
        (returns_texts, "['1.0', '1.0', '1.0', '1.0']"),
        (returns_a_dict, "{0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}"),  # TRL trained on its keys, 0 to 3: silently wrong
        (returns_lists, "[[1.0], [1.0], [1.0], [1.0]]"),  # TRL: `RuntimeError: expand(torch.FloatTensor{[4, 1]} ...`
    ],
)
def test_a_reward_that_returns_no_list_of_numbers_is_one_line_naming_it_at_the_first_step(
    reward, returned, tmp_path, tiny_random_model_path
):
    from testing_utils import PROMPTS, tiny_stapo_config

    from stapo_trl import STAPOTrainer

    trainer = STAPOTrainer(tiny_random_model_path, reward, args=tiny_stapo_config(tmp_path), train_dataset=PROMPTS)
    with pytest.raises(TypeError) as raised:
        trainer.train()
    assert str(raised.value) == (
        f"Reward function {reward.__name__} returned {returned} at step 1, but 4 were expected (one per "
        "prompt-completion pair): return one float per completion, None for one it cannot judge."
    )


@pytest.mark.parametrize(
    "returned",
    [
        np.array([1.0, 0.0, 0.5]),
        torch.tensor([1.0, 0.0, 0.5]),
        [np.True_, np.False_, 0.5],  # a comparison's result
        (torch.tensor(v) for v in (1.0, 0.0, 0.5)),  # 0-d tensors, from a generator
        [1, False, Fraction(1, 2)],
    ],
)
def test_every_sequence_of_numbers_trl_trains_on_passes_as_its_values(returned):
    from stapo_trl.rewards import checked_reward

    rewards = checked_reward(lambda completions, **kwargs: returned)(completions=["a", "b", "c"])
    assert torch.tensor(rewards, dtype=torch.float32).tolist() == [1.0, 0.0, 0.5]  # as TRL converts them


def test_reward_names_signatures_and_per_completion_none_are_as_in_trl(tmp_path, tiny_random_model_path, caplog):
    """The checked function keeps TRL's metric name and the signature the column check reads; `None` for some
    completions (a reward that cannot judge them) trains without a word, as in TRL."""
    import inspect

    from testing_utils import PROMPTS, tiny_stapo_config

    from stapo_trl import STAPOTrainer
    from stapo_trl.rewards import resolve_reward_names

    def half_judged(completions, prompts, **kwargs):
        return [None if i % 2 else 1.0 + i for i in range(len(completions))]

    (checked,) = resolve_reward_names([half_judged])
    assert checked.__name__ == "half_judged" and list(inspect.signature(checked).parameters)[:2] == [
        "completions",
        "prompts",
    ]
    trainer = STAPOTrainer(
        tiny_random_model_path, half_judged, args=tiny_stapo_config(tmp_path, max_steps=2, logging_steps=1),
        train_dataset=PROMPTS,
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="stapo_trl.rewards"):
        trainer.train()
    assert trainer.reward_func_names == ["half_judged"]
    assert [row["rewards/half_judged/mean"] for row in trainer.state.log_history[:2]] == [2.0, 2.0]  # (1 + 3) / 2
    assert [r.getMessage() for r in caplog.records if r.name == "stapo_trl.rewards"] == []


def divides_by_zero(completions, **kwargs):
    return [1 / 0] * len(completions)


def reads_a_missing_column(completions, **kwargs):
    return [float(kwargs["difficulty"])] * len(completions)


@pytest.mark.parametrize(
    "reward, kind",
    [(divides_by_zero, ZeroDivisionError), (reads_a_missing_column, KeyError), (returns_text, TypeError)],
)
def test_a_reward_that_raises_keeps_its_traceback_with_its_name_and_step(
    reward, kind, tmp_path, tiny_random_model_path
):
    # Measured: a 60-line traceback that named no step. In Python the exception is the reward's own, with a note.
    import traceback

    from testing_utils import PROMPTS, tiny_stapo_config

    from stapo_trl import STAPOTrainer

    trainer = STAPOTrainer(tiny_random_model_path, reward, args=tiny_stapo_config(tmp_path), train_dataset=PROMPTS)
    with pytest.raises(kind) as raised:
        trainer.train()
    assert raised.value.__notes__ == [f"In reward function {reward.__name__} at step 1."]  # reported: "step 0"
    frames = traceback.extract_tb(raised.value.__traceback__)
    assert kind is TypeError or frames[-1].name == reward.__name__  # the reward's own line is in the traceback


INF = (
    "inf or -inf for {} at step 1: the advantages of their groups are then not numbers, and those groups teach nothing"
)
NAN = "NaN for {} at step 1: TRL takes NaN for None (no reward), so they teach nothing"


@pytest.mark.parametrize(
    "returned, warned",
    [
        ([math.inf, 1.0, None, 0.0], INF.format("1 of 4 completions (25%)")),  # measured: trained on without a word
        ([-math.inf, -math.inf, None, 0.0], INF.format("2 of 4 completions (50%)")),
        ([np.float32("inf")] * 4, INF.format("4 of 4 completions (100%)")),
        ([math.nan, 1.0, None, 0.0], NAN.format("1 of 4 completions (25%)")),  # reported: NaN was never named
        ([np.float32("nan")] * 3 + [1.0], NAN.format("3 of 4 completions (75%)")),
        ([torch.tensor(math.nan)] * 4, NAN.format("4 of 4 completions (100%)")),  # every one: still named, as NaN
    ],
    ids=["inf", "minus-inf", "numpy-inf", "nan", "numpy-nan", "all-nan-tensors"],
)
def test_a_reward_returning_inf_or_nan_is_warned_once_naming_it_and_the_share(returned, warned, caplog):
    from types import SimpleNamespace

    from stapo_trl.rewards import checked_reward

    def unsure(completions, **kwargs):
        return returned

    checked = checked_reward(unsure)
    with caplog.at_level(logging.WARNING, logger="stapo_trl.rewards"):
        for step in (0, 1):
            checked(completions=["a", "b", "c", "d"], trainer_state=SimpleNamespace(global_step=step))
    assert [r.getMessage() for r in caplog.records if r.name == "stapo_trl.rewards"] == [
        f"Reward function unsure returned {warned}. Return a finite number, or None for a completion it cannot judge "
        "(shown once)"
    ]


def short_by_one(completions, **kwargs):
    return [1.0] * (len(completions) - 1)


def one_too_many(completions, **kwargs):
    return [1.0] * (len(completions) + 1)


def empty(completions, **kwargs):
    return []


@pytest.mark.parametrize("reward, count", [(short_by_one, 3), (one_too_many, 5), (empty, 0)])
def test_a_reward_returning_another_count_is_trls_value_error_naming_it_and_the_step(
    reward, count, tmp_path, tiny_random_model_path
):
    # Reported (63 values for 64 completions): TRL's ValueError, a 19-frame traceback through stapo-train.
    from testing_utils import PROMPTS, tiny_stapo_config

    from stapo_trl import STAPOTrainer

    trainer = STAPOTrainer(tiny_random_model_path, reward, args=tiny_stapo_config(tmp_path), train_dataset=PROMPTS)
    with pytest.raises(ValueError, match=r"but 4 were expected \(one per prompt-completion pair\)") as raised:
        trainer.train()
    assert str(raised.value) == (
        f"Reward function {reward.__name__} returned {count} rewards at step 1, but 4 were expected (one per "
        "prompt-completion pair): return one float per completion, None for one it cannot judge."
    )


def test_a_reward_returning_inf_in_training_is_warned_once(tmp_path, tiny_random_model_path, caplog):
    from testing_utils import PROMPTS, tiny_stapo_config

    from stapo_trl import STAPOTrainer

    def sometimes_inf(completions, **kwargs):
        return [math.inf if i == 0 else 0.0 for i in range(len(completions))]

    args = tiny_stapo_config(tmp_path, max_steps=2, logging_steps=1)
    with caplog.at_level(logging.WARNING, logger="stapo_trl.rewards"):
        STAPOTrainer(tiny_random_model_path, sometimes_inf, args=args, train_dataset=PROMPTS).train()
    lines = [r.getMessage() for r in caplog.records if r.name == "stapo_trl.rewards"]
    assert len(lines) == 1 and lines[0].startswith("Reward function sometimes_inf returned inf or -inf for 1 of 4 ")
