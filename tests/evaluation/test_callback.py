"""The in-training benchmark evaluation (`stapo_trl.evaluation.callback.BenchmarkEvalCallback`): it logs avg@k and
pass@k at its steps, restores the train mode, refuses sharded parameters, and keeps the step's training log in
`GRPOTrainer`."""

from types import SimpleNamespace

import pytest

from stapo_trl.evaluation.tasks import BenchmarkProblem


def test_benchmark_eval_callback_logs(tiny_math_model_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerState

    from stapo_trl.evaluation.callback import BenchmarkEvalCallback

    model = AutoModelForCausalLM.from_pretrained(tiny_math_model_path)
    model.train()
    tokenizer = AutoTokenizer.from_pretrained(tiny_math_model_path)
    problems = [
        BenchmarkProblem(f"p{i}", f"{a}+{b}", str(a + b), "tiny-math") for i, (a, b) in enumerate([(12, 34), (47, 38)])
    ]
    callback = BenchmarkEvalCallback("tiny-math", problems=problems, samples=2, every_n_steps=2, max_new_tokens=40)
    args = SimpleNamespace(eval_steps=None, logging_steps=1, fsdp=None, eval_on_start=False)
    state = TrainerState()
    for step in (1, 2):
        state.global_step = step
        callback.on_step_end(args, state, None, model=model, processing_class=tokenizer)
    assert len(state.log_history) == 1  # only at step 2
    logged = state.log_history[0]
    assert logged["step"] == 2
    assert 0.0 <= logged["eval/tiny-math/avg@2"] <= 1.0
    assert "eval/tiny-math/pass@2" in logged
    assert model.training  # restored after generation


def test_benchmark_eval_callback_refuses_sharded_params():
    from transformers import TrainerState

    from stapo_trl.evaluation.callback import BenchmarkEvalCallback

    callback = BenchmarkEvalCallback("aime24", data_dir="unused")
    args = SimpleNamespace(eval_steps=None, logging_steps=1, fsdp="full_shard", eval_on_start=False)
    with pytest.raises(ValueError, match="FSDP"):
        callback.on_train_begin(args, TrainerState(), None)


def test_benchmark_eval_callback_in_grpo_trainer(tiny_math_model_path, tmp_path):
    # Regression: logging from on_step_end through Trainer.log reset `control.should_log`, so the training log of
    # that step disappeared from log_history. Both must be there, at every step.
    from trl import GRPOConfig, GRPOTrainer

    from stapo_trl.data import make_tiny_math_dataset
    from stapo_trl.evaluation.callback import BenchmarkEvalCallback
    from stapo_trl.rewards import math_accuracy_reward

    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=40,  # the tiny model answers in ~30 tokens
        max_steps=2,
        logging_steps=1,
        use_cpu=True,
        bf16=False,
        report_to=[],
        save_strategy="no",
    )
    trainer = GRPOTrainer(
        model=tiny_math_model_path,
        reward_funcs=[math_accuracy_reward],
        args=args,
        train_dataset=make_tiny_math_dataset(num_train=16, num_test=4)["train"],
    )
    BenchmarkEvalCallback("tiny-math", samples=2, every_n_steps=1, limit=3, max_new_tokens=40).attach(trainer)
    trainer.train()
    history = trainer.state.log_history
    for step in (1, 2):
        entries = [h for h in history if h.get("step") == step]
        assert any("eval/tiny-math/avg@2" in h for h in entries), entries
        assert any("loss" in h for h in entries), entries
