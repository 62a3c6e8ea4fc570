"""Built-in `builtin:` models: the build, the cache, offline reloading and use as `GRPOTrainer(model=...)`."""

import os
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import stapo_trl.models.cache as builtin_cache
from stapo_trl.data import INSTRUCTION, format_prompt, make_tiny_math_dataset
from stapo_trl.models import (
    BUILTIN_MODELS,
    INFO_FILE,
    builtin_model_dir,
    default_cache_dir,
    read_builtin_info,
    resolve_model_path,
)
from stapo_trl.models.build import one_torch_thread as build_on_one_thread
from stapo_trl.models.warmup import measure_accuracy


@pytest.fixture
def one_torch_thread():
    # Generation and training of a 144k-parameter model are dominated by thread hand-offs: one thread is ~3x faster
    # than two on a busy 2-core machine (see `stapo_trl.models.build.one_torch_thread`).
    with build_on_one_thread():
        yield


# ----------------------------------------------------------------------------------------------------------------
# The SFT-warmed model
# ----------------------------------------------------------------------------------------------------------------


def test_tiny_math_reloads_offline_and_records_its_accuracy(tiny_math_model_path):
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    model = AutoModelForCausalLM.from_pretrained(tiny_math_model_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_math_model_path)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 2
    assert model.config.num_attention_heads == 4
    assert 130_000 <= model.num_parameters() <= 160_000
    assert model.config.vocab_size == len(tokenizer)

    info = read_builtin_info(tiny_math_model_path)
    assert info["name"] == "builtin:tiny-math"
    assert info["version"] == BUILTIN_MODELS["tiny-math"]["version"]
    assert info["model"]["num_parameters"] == model.num_parameters()
    assert info["sft"]["steps"] == BUILTIN_MODELS["tiny-math"]["sft_steps"]
    assert info["sft"]["label_smoothing_factor"] == 0.02
    # The warm start the RL demo needs: some but not all sampled answers right (T = 1.0).
    evaluation = info["eval"]
    assert evaluation["temperature"] == 1.0 and evaluation["num_problems"] == 300
    assert 0.2 <= evaluation["sampled_accuracy"] <= 0.8
    # Label smoothing leaves a low-probability tail that sampling hits; the argmax is nearly always right.
    assert evaluation["greedy_accuracy"] > evaluation["sampled_accuracy"]
    assert len(evaluation["samples"]) == 5
    assert info["sft"]["last_logged_loss"] < info["sft"]["mean_train_loss"]


def test_tiny_math_reloaded_model_solves_held_out_problems(tiny_math_model_path, one_torch_thread):
    # Re-measure on the reloaded weights (greedy, 50 held-out problems): the saved model is the trained one.
    model = AutoModelForCausalLM.from_pretrained(tiny_math_model_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_math_model_path)
    test = make_tiny_math_dataset()["test"].select(range(50))
    accuracy, completions = measure_accuracy(model, tokenizer, test["prompt"], test["solution"], do_sample=False)
    assert accuracy >= 0.7, completions[:5]
    assert accuracy == pytest.approx(read_builtin_info(tiny_math_model_path)["eval"]["greedy_accuracy"], abs=0.2)
    # The worked-steps format is learnt, not just the answer.
    assert sum(c.startswith(t) for c, t in zip(completions, test["completion"])) >= 30


def test_both_builtins_share_the_tokenizer(tiny_math_model_path, tiny_random_model_path):
    math_tok = AutoTokenizer.from_pretrained(tiny_math_model_path)
    random_tok = AutoTokenizer.from_pretrained(tiny_random_model_path)
    assert math_tok.get_vocab() == random_tok.get_vocab()
    info = read_builtin_info(tiny_random_model_path)
    assert info["sft"]["steps"] == 0 and info["eval"] is None


def test_grpo_trainer_accepts_the_builtin_path(tiny_math_model_path, tmp_path, one_torch_thread):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    prompts = make_tiny_math_dataset()["train"].select(range(16))

    def length_reward(completions, **kwargs):  # varies across samples at T = 1.0, so advantages are non-zero
        return [len(c[0]["content"]) / 40 for c in completions]

    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=3,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=40,
        learning_rate=1e-3,
        use_cpu=True,
        bf16=False,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        activation_checkpointing=False,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=tiny_math_model_path,
        reward_funcs=length_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts["prompt"], "solution": prompts["solution"]}),
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 3
    logs = [log for log in trainer.state.log_history if "reward" in log]
    assert len(logs) == 3
    # The SFT model ends most completions with eos well before the 40-token limit.
    assert all(log["completions/mean_length"] < 40 for log in logs)
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])]
    assert len(changed) == len(before)


# ----------------------------------------------------------------------------------------------------------------
# The tokenizer
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(tiny_random_model_path):
    return AutoTokenizer.from_pretrained(tiny_random_model_path)


def test_tokenizer_size_and_special_tokens(tokenizer):
    assert 280 <= len(tokenizer) <= 400
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id


def test_tokenizer_round_trips_digits_and_boxed(tokenizer):
    for text in ["0123456789", "\\boxed{85}", "7+8=15, write 5 carry 1; 4+3+1=8; \\boxed{85}", "47+38"]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text
    # Every digit is its own token, never merged with a neighbour (as in Qwen).
    assert tokenizer.tokenize("0123456789") == list("0123456789")
    pieces = tokenizer.tokenize("\\boxed{85}")
    assert pieces[-3:] == ["8", "5", "}"]
    assert all(not any(ch.isdigit() for ch in p) or len(p) == 1 for p in tokenizer.get_vocab())


def test_chat_template(tokenizer):
    text = tokenizer.apply_chat_template(format_prompt("47+38"), tokenize=False, add_generation_prompt=True)
    assert text == f"<|im_start|>user\n47+38\n{INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n"
    # The prompt renders as a prefix of prompt + completion, so SFT/GRPO see the same context at train and test time.
    completion = [{"role": "assistant", "content": "7+8=15, write 5 carry 1; 4+3+1=8; \\boxed{85}"}]
    full = tokenizer.apply_chat_template(format_prompt("47+38") + completion, tokenize=False)
    assert full == text + completion[0]["content"] + "<|im_end|>\n"
    prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    full_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    assert full_ids[: len(prompt_ids)] == prompt_ids


# ----------------------------------------------------------------------------------------------------------------
# resolve_model_path and the cache
# ----------------------------------------------------------------------------------------------------------------


def test_resolve_builds_once_then_reuses_the_cache(tmp_path, monkeypatch):
    builds = []
    real_build = builtin_cache.build_builtin_model

    def counting_build(name, output_dir, **kwargs):
        builds.append(name)
        return real_build(name, output_dir, **kwargs)

    monkeypatch.setattr(builtin_cache, "build_builtin_model", counting_build)
    target = builtin_model_dir("tiny-random", tmp_path)
    target.mkdir(parents=True)
    (target / "junk.txt").write_text("an incomplete folder (no info file) is replaced, not trusted")

    path = resolve_model_path("builtin:tiny-random", cache_dir=tmp_path)
    assert path == str(target) == str(tmp_path / f"tiny-random-{BUILTIN_MODELS['tiny-random']['version']}")
    assert builds == ["tiny-random"]
    assert not (target / "junk.txt").exists()
    mtime = os.path.getmtime(target / INFO_FILE)

    assert resolve_model_path("builtin:tiny-random", cache_dir=tmp_path) == path
    assert builds == ["tiny-random"]  # second call: no rebuild
    assert os.path.getmtime(target / INFO_FILE) == mtime
    # Only the model folder and its lock file are left (the temporary build folder was renamed away).
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, target.name + ".lock"])
    AutoModelForCausalLM.from_pretrained(path)


def test_resolve_passes_through_directories_and_hub_ids(tmp_path, tiny_random_model_path):
    assert resolve_model_path(tiny_random_model_path) == tiny_random_model_path
    assert resolve_model_path(Path(tiny_random_model_path)) == tiny_random_model_path
    assert resolve_model_path("Qwen/Qwen3-1.7B-Base") == "Qwen/Qwen3-1.7B-Base"
    assert resolve_model_path("gpt2") == "gpt2"


@pytest.mark.parametrize("path", ["./no-such-model", "../no/such/model", "/no/such/model", "~/no-such-model-xyz"])
def test_resolve_missing_local_path(path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model_path(path)


def test_resolve_file_is_not_a_model_dir(tmp_path):
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="model.safetensors"):
        resolve_model_path(str(file))


def test_resolve_unknown_builtin_lists_the_known_names():
    with pytest.raises(ValueError, match="builtin:nope") as excinfo:
        resolve_model_path("builtin:nope")
    for name in BUILTIN_MODELS:
        assert f"builtin:{name}" in str(excinfo.value)


def test_cache_dir_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("STAPO_TRL_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path
    assert builtin_model_dir("tiny-math") == tmp_path / f"tiny-math-{BUILTIN_MODELS['tiny-math']['version']}"
    monkeypatch.delenv("STAPO_TRL_CACHE")
    assert str(default_cache_dir()) == os.path.expanduser("~/.cache/stapo_trl")


def test_launched_processes_build_in_a_child(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert builtin_cache._is_launched_process()
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    assert builtin_cache._is_launched_process()


def test_in_process_build_leaves_accelerate_state_and_rngs_alone():
    from accelerate.state import AcceleratorState, PartialState

    before = (dict(PartialState._shared_state), dict(AcceleratorState._shared_state))
    torch_state, py_state = torch.get_rng_state(), random.getstate()
    with builtin_cache._preserved_process_state():
        AcceleratorState._reset_state(reset_partial_state=True)  # what TrainingArguments does
        torch.manual_seed(123)  # what Trainer does
        random.seed(123)
    assert (dict(PartialState._shared_state), dict(AcceleratorState._shared_state)) == before
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert random.getstate() == py_state


@pytest.mark.slow
def test_build_in_a_child_process_under_a_launcher(tmp_path, monkeypatch):
    # What every rank of `torchrun --nproc_per_node 2` sees; the child must not join that (absent) process group.
    for var, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "29555"}.items():
        monkeypatch.setenv(var, value)
    path = resolve_model_path("builtin:tiny-random", cache_dir=tmp_path)
    assert read_builtin_info(path)["name"] == "builtin:tiny-random"
    AutoModelForCausalLM.from_pretrained(path)


# ----------------------------------------------------------------------------------------------------------------
# The sampled-token statistics of the warm-up check (entropy, probability of the drawn token)
# ----------------------------------------------------------------------------------------------------------------


def test_recorded_token_statistics_match_a_forward_pass(tiny_math_model_path, one_torch_thread):
    # The recorder must see the distribution each token was drawn from: at T = 1, top-p 1, top-k 0 that is the
    # softmax of the logits, which a teacher-forced forward pass over prompt + completion reproduces.
    from transformers import LogitsProcessorList

    from stapo_trl.models.warmup import _TokenStatisticsRecorder

    model = AutoModelForCausalLM.from_pretrained(tiny_math_model_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_math_model_path)
    prompts = make_tiny_math_dataset()["test"]["prompt"][:4]
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    recorder = _TokenStatisticsRecorder()
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(
            **batch,
            max_new_tokens=40,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            logits_processor=LogitsProcessorList([recorder]),
        )
    prompt_len = batch["input_ids"].shape[1]
    completion_ids = out[:, prompt_len:]  # (B, T)
    entropy, prob = recorder.finish(completion_ids)  # (B, T) each
    assert entropy.shape == prob.shape == completion_ids.shape

    attention_mask = torch.cat([batch["attention_mask"], torch.ones_like(completion_ids)], dim=1)  # (B, P + T)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=out, attention_mask=attention_mask, position_ids=position_ids).logits
    logps = torch.log_softmax(logits[:, prompt_len - 1 : -1].float(), dim=-1)  # (B, T, V): predicts completion token t
    expected_prob = logps.gather(2, completion_ids.unsqueeze(2)).squeeze(2).exp()
    expected_entropy = -(logps.exp() * logps).sum(dim=-1)
    for row in range(len(prompts)):
        ends = (completion_ids[row] == tokenizer.eos_token_id).nonzero()
        n = int(ends[0]) + 1 if len(ends) else completion_ids.shape[1]  # up to and including the first eos
        torch.testing.assert_close(prob[row, :n], expected_prob[row, :n], atol=1e-4, rtol=1e-3)
        torch.testing.assert_close(entropy[row, :n], expected_entropy[row, :n], atol=1e-4, rtol=1e-3)


def test_token_statistics_summary_on_hand_values():
    from stapo_trl.models.warmup import summarize_token_statistics

    # Entropies 0..4 nats: linear-interpolated p10 = 0.4, p50 = 2, p90 = 3.6, mean 2. Probabilities: 2 of 5 below 0.002
    # (0.002 itself is not below).
    summary = summarize_token_statistics({"entropy": [0, 1, 2, 3, 4], "prob": [0.001, 0.0019, 0.002, 0.5, 1.0]})
    assert summary["num_tokens"] == 5
    assert summary["entropy_nats"] == {"p10": 0.4, "p50": 2.0, "p90": 3.6, "mean": 2.0}
    assert summary["frac_prob_below_tau_p"] == 0.4 and summary["tau_p"] == 0.002


def test_measure_accuracy_counts_tokens_up_to_eos_and_keeps_the_train_mode(tiny_math_model_path, one_torch_thread):
    model = AutoModelForCausalLM.from_pretrained(tiny_math_model_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_math_model_path)
    test = make_tiny_math_dataset()["test"].select(range(8))
    model.train()
    stats = {}
    _, completions = measure_accuracy(
        model, tokenizer, test["prompt"], test["solution"], do_sample=False, token_statistics=stats
    )
    assert model.training  # restored: the callback of a running SFT evaluates mid-training
    # One entry per completion token plus its eos (greedy completions are the canonical worked steps, which re-tokenize
    # to the same tokens; they end well before 48 tokens). A sampled stray token may not re-tokenize the same way.
    lengths = [len(tokenizer(c, add_special_tokens=False)["input_ids"]) + 1 for c in completions]
    assert len(stats["entropy"]) == len(stats["prob"]) == sum(lengths)
    assert all(h >= 0 for h in stats["entropy"]) and all(0 < p <= 1 for p in stats["prob"])
    # The statistics are a side record: the accuracy and completions are those of a call without them.
    sampled = measure_accuracy(model, tokenizer, test["prompt"], test["solution"], do_sample=True, token_statistics={})
    assert measure_accuracy(model, tokenizer, test["prompt"], test["solution"], do_sample=True) == sampled
