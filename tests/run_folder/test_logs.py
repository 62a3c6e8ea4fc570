"""`stapo_trl.run_folder.logs`: the run files as written and read back, and the no-learning-signal warning."""

from __future__ import annotations

import json
import logging
import types
import warnings

import pytest
from datasets import Dataset
from testing_utils import PROMPTS, length_reward, tiny_stapo_config
from transformers import AutoTokenizer

from stapo_trl import STAPOConfig, STAPOTrainer
from stapo_trl.data import format_prompt
from stapo_trl.rewards import NoRewardWarning, math_accuracy_reward
from stapo_trl.run_folder import logs
from stapo_trl.run_folder.logs import MetricsLogCallback, SpuriousTokenLogger, add_run_file_callbacks, read_metrics


LOGGER = "stapo_trl.run_folder.logs"
PAIRS = [(a, b) for a in range(10, 100, 11) for b in range(12, 100, 13)]


_warnings = lambda log: [r.getMessage() for r in log.records if r.name == LOGGER and r.levelno >= 30]  # noqa: E731
_state = lambda step: types.SimpleNamespace(is_world_process_zero=True, global_step=step, epoch=0.0)  # noqa: E731


def _decide(caplog, rows, end=True, names=("r",), **trainer) -> list[str]:
    trainer = dict(reward_func_names=list(names), train_dataset=None, model=None, processing_class=None) | trainer
    callback = logs.NoLearningSignalCallback(types.SimpleNamespace(**trainer))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        [callback.on_log(None, _state(step), None, logs=row) for step, row in enumerate(rows, 1)]
        end and callback.on_train_end(None, _state(len(rows)), None)  # a run shorter than 3 logging steps decides here
    return _warnings(caplog)


def test_trainer_writes_each_run_file_once(tiny_random_model_path, tmp_path):
    args = tiny_stapo_config(tmp_path / "a", max_steps=2, logging_steps=1, max_completion_length=8)
    first = STAPOTrainer(tiny_random_model_path, reward_funcs=length_reward, args=args, train_dataset=PROMPTS)
    custom = tmp_path / "custom_tokens.jsonl"
    first.add_callback(SpuriousTokenLogger(first, path=str(custom), max_reference=4))
    first.train()
    callbacks = first.callback_handler.callbacks
    assert sum(isinstance(c, MetricsLogCallback) for c in callbacks) == 1
    assert [c.path for c in callbacks if isinstance(c, SpuriousTokenLogger)] == [str(custom)]
    assert [row["step"] for row in read_metrics(tmp_path / "a") if "loss" in row] == [1, 2]
    assert custom.is_file() and not (tmp_path / "a" / "spurious_tokens.jsonl").exists()
    assert add_run_file_callbacks(first) == []  # a second train() adds nothing


def test_metrics_file_strict_json_resumed_or_moved_aside(tmp_path, caplog):
    args, callback = types.SimpleNamespace(output_dir=str(tmp_path)), MetricsLogCallback()
    callback.on_train_begin(args, _state(0), None)
    for step in (2, 4, 6):
        callback.on_log(args, _state(step), None, logs={"reward": 0.5, "s2t/entropy_threshold": float("nan")})
    callback.on_log(args, _state(6), None, logs={"train_runtime": 1.0})  # the end-of-training summary: not a step
    callback.on_train_end(args, _state(6), None)
    rows = read_metrics(str(tmp_path))
    assert [r["step"] for r in rows] == [2, 4, 6] and rows[0]["s2t/entropy_threshold"] is None  # NaN: null
    callback = MetricsLogCallback()  # resuming from the step-4 checkpoint: step 6 is redone, its old line goes
    callback.on_train_begin(args, _state(4), None)
    callback.on_log(args, _state(6), None, logs={"reward": 0.75})
    callback.on_train_end(args, _state(6), None)
    assert [(r["step"], r["reward"]) for r in read_metrics(str(tmp_path))] == [(2, 0.5), (4, 0.5), (6, 0.75)]
    path = tmp_path / "metrics.jsonl"  # a fresh run: an earlier run's file is kept aside
    for n in (1, 2):
        path.write_text(json.dumps({"step": n}) + "\n")
        (callback := MetricsLogCallback(str(path))).on_train_begin(args, _state(0), None)
        callback.close()
        assert f"metrics.jsonl held an earlier run's records: kept as metrics.{n}.jsonl" in caplog.text
    assert [(tmp_path / f"metrics.{n}.jsonl").read_text() for n in (1, 2)] == ['{"step": 1}\n', '{"step": 2}\n']
    assert path.read_text() == ""


def test_tracker_table_labels_tokens_like_the_figure(tiny_random_model_path, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_random_model_path)
    lead, other, nl = tokenizer.convert_tokens_to_ids(["â", "Ý", "Ċ"])
    logger = SpuriousTokenLogger(types.SimpleNamespace(processing_class=tokenizer), path=str(tmp_path / "t.jsonl"))
    kinds = [("silenced", lead), ("silenced", lead), ("silenced", other), ("kept_candidate", nl), ("reference", 0)]
    logger._count([{"kind": kind, "token_id": i, "token": tokenizer.decode([i])} for kind, i in kinds])
    assert logger.silenced_counts == {"byte 0xE2": 2, "byte 0xDD": 1} and logger.kept_candidate_counts == {"\\n": 1}


@pytest.mark.parametrize("row", [1, 3, 6])
def test_a_resume_killed_while_it_rewrites_the_file_loses_no_row(tmp_path, monkeypatch, row):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": step, "reward": step / 10} for step in range(1, 9)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 9, "rew')  # a last line cut short
    written, dumps, calls = path.read_text(), json.dumps, iter(range(row - 1))  # killed at the row-th json.dumps
    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(json, "dumps", lambda obj, **kw: dumps(obj, **kw) if next(calls, None) is not None else
                      (_ for _ in ()).throw(KeyboardInterrupt()))  # fmt: skip
        MetricsLogCallback(str(path)).on_train_begin(None, _state(6), None)  # resuming from checkpoint-6
    assert path.read_text() == written  # every row written so far is still there
    (callback := MetricsLogCallback(str(path))).on_train_begin(None, _state(6), None)
    callback.on_log(None, _state(7), None, logs={"reward": 0.7})
    callback.close()
    assert [r["step"] for r in logs.read_jsonl(path)] == [1, 2, 3, 4, 5, 6, 7] and len(callback.kept) == 6
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]  # no temporary file left


@pytest.mark.parametrize("model, plain, steps", [("tiny_math_model_path", True, 3),
                                                  ("tiny_random_model_path", False, 1)])  # fmt: skip
def test_the_warning_names_the_prompt_format_a_builtin_model_was_trained_on(request, caplog, model, plain, steps):
    prompts = [f"What is {a} plus {b}?" if plain else format_prompt(f"{a}+{b}") for a, b in PAIRS]
    dataset = Dataset.from_list([{"prompt": p, "solution": str(a + b)} for p, (a, b) in zip(prompts, PAIRS)])
    model = types.SimpleNamespace(config=types.SimpleNamespace(_name_or_path=request.getfixturevalue(model)))
    row = {"frac_reward_zero_std": 1.0} | {f"rewards/math_accuracy_reward/{k}": 0.0 for k in ("mean", "std")}
    (message,) = _decide(caplog, [row] * steps, names=["math_accuracy_reward"], train_dataset=dataset, model=model,
                         processing_class=types.SimpleNamespace(chat_template="{{ x }}"))  # fmt: skip
    where = "the first 3 logging steps (steps 1-3)" if plain else "the first logging step (step 1)"
    assert message.startswith(f"No learning signal. In {where}, every prompt group had ")
    parts = ["frac_reward_zero_std = 1", "math_accuracy_reward gave 0", "(here: solution)"]
    parts += ["Your prompts are plain text, so TRL does not apply the model's chat template",
              "builtin:tiny-math was trained on one prompt format only",
              "Please reason step by step, and put your final answer within"] if plain else [
              "builtin:tiny-random has random weights: it answers nothing correctly"]  # fmt: skip
    assert [part for part in parts if part not in message] == []


def _unjudged(completions, **kwargs):
    return [None] * len(completions)


def _not_a_number(completions, **kwargs):
    return [float("nan")] * len(completions)


@pytest.mark.parametrize(
    "rewards, expected",
    [
        ([_unjudged], "_unjudged"),  # reported: trained to the end, exit 0; TRL's dump at every step named no reward
        pytest.param([_not_a_number], "_not_a_number", marks=pytest.mark.slow),  # NaN is TRL's None
        pytest.param([_unjudged, _not_a_number], "_unjudged, _not_a_number", marks=pytest.mark.slow),
        ([_unjudged, length_reward], None),  # TRL's "not applicable": the other reward still teaches
        pytest.param([math_accuracy_reward], "learns", marks=pytest.mark.slow),  # a run that learns: no warning
    ],
    ids=["none", "nan", "none-and-nan", "none-beside-a-value", "learns"],
)
def test_no_reward_is_warned(rewards, expected, tmp_path, tiny_random_model_path, tiny_math_model_path, caplog):
    args = STAPOConfig(output_dir=str(tmp_path / "out"), max_steps=3, logging_steps=1, num_generations=4,
                       learning_rate=1e-4, save_strategy="no", report_to="none", disable_tqdm=True, seed=0,
                       per_device_train_batch_size=16 if (learns := expected == "learns") else 8,
                       max_completion_length=40 if learns else 8)  # fmt: skip
    if learns:
        dataset = Dataset.from_list([{"prompt": format_prompt(f"{a}+{b}"), "solution": str(a + b)} for a, b in PAIRS])
    trainer = STAPOTrainer(tiny_math_model_path if learns else tiny_random_model_path, rewards, args=args,
                           train_dataset=dataset if learns else PROMPTS)  # fmt: skip
    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NoRewardWarning)
        trainer.train()
    no_reward = [str(w.message) for w in caught if w.category is NoRewardWarning]
    trl_dumps = [r for r in caplog.records if "All reward functions returned None" in r.getMessage()]
    assert trainer.state.global_step == 3
    if learns:
        assert _warnings(caplog) == []
        return
    (message,) = _warnings(caplog)
    if expected is None:
        assert no_reward == [] and trl_dumps == []
        assert message.startswith("A reward function gave every completion the same value in the first 3 logging ")
        assert "(_unjudged gave None): it adds nothing" in message and "length_reward" not in message.split("Lik")[0]
        return
    assert no_reward == [
        f"No reward at step {step}: no reward function ({expected}) gave any of the 8 completions a value (every one "
        "None or NaN), so the step has no learning signal."
        for step in (1, 2, 3)
    ]
    assert len(trl_dumps) == 3
    assert message.startswith("No learning signal. In the first 3 logging steps (steps 1-3), no reward function gave ")


ROW, S0 = {"frac_reward_zero_std": 1.0, "rewards/r/mean": 0.0, "rewards/r/std": 0.0}, {"rewards/s/mean": 0.0}
LENGTH = "(1) The length: every completion was cut at max_completion_length=12 (completions/clipped_ratio = 1)"
SAME, SPREAD = "gave every completion the same value", {"frac_reward_zero_std": 0.5, "rewards/r/std": 0.5}


@pytest.mark.parametrize("rows, end, expected, absent", [
    ([ROW] * 3, False, ["No learning signal. In the first 3 logging steps (steps 1-3), every prompt group"], [LENGTH]),
    ([ROW | S0 | SPREAD | {"rewards/r/mean": m, "rewards/s/std": 0.0} for m in (0.2, 0.4, 0.6)], False,
     [f"A reward function {SAME} in the first 3 logging steps (steps 1-3) (s gave 0): it adds nothing",
      "(2) The reward: call s on a right and a wrong completion"], []),
    ([ROW] * 2, False, None, []),  # 2 of 3 rows
    ([ROW | SPREAD | {"rewards/r/mean": 0.4}] * 3, False, None, []),
    ([ROW | {"rewards/r/mean": m} for m in (0.0, 1.0, 0.0)], False, ["No learning signal"], [SAME]),  # r moved
    ([ROW | {"completions/clipped_ratio": 1.0}] * 3, True, [LENGTH], []),
    ([ROW | {"completions/clipped_ratio": 1.0}], True, ["the first logging step (step 1)", LENGTH], []),
    ([ROW | {"completions/clipped_ratio": 1.0}] * 2, True, [LENGTH], []),
    ([ROW | {"completions/clipped_ratio": r} for r in (1.0, 0.9, 1.0)], True, ["No learning signal"], [LENGTH]),
])  # fmt: skip
def test_the_first_rows_decide_the_warning(caplog, rows, end, expected, absent):
    warned = _decide(caplog, rows, end, ("r", "s"), args=types.SimpleNamespace(max_completion_length=12))
    assert len(warned) == bool(expected) and [p for p in expected or [] if p not in warned[0]] == []
    assert [p for p in absent if p in warned[0]] == []
