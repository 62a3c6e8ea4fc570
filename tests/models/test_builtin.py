import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accelerate.state import AcceleratorState, PartialState
from testing_utils import subprocess_env
from transformers import AutoModelForCausalLM, AutoTokenizer

import stapo_trl.models.cache as builtin_cache
from stapo_trl.cli.eval import main
from stapo_trl.data import INSTRUCTION, format_prompt, make_tiny_math_dataset
from stapo_trl.evaluation.results import load_results
from stapo_trl.models import resolve_model_path
from stapo_trl.models.names import BUILTIN_MODELS, INFO_FILE, builtin_model_dir, default_cache_dir, read_builtin_info
from stapo_trl.models.sft_math import evaluate_tiny_math, sft_warm_up, summarize_token_statistics
from stapo_trl.models.tiny import SFT_CONFIG


def test_resolve_builds_once_keeps_the_process_state_refuses_bad_paths_and_tiny_math_reloads_offline_as_stapo_eval(
        tiny_math_model_path, tmp_path, monkeypatch, caplog, capsys):  # fmt: skip  # build: test_a_killed_build_...
    def build(name, out, **kwargs):  # as TrainingArguments and Trainer do: accelerate's state reset, seeds set
        AcceleratorState._reset_state(reset_partial_state=True)
        torch.manual_seed(123), random.seed(123)
        builds.append(name) or shutil.copytree(tiny_math_model_path, out, dirs_exist_ok=True)

    builds, state = [], (dict(PartialState._shared_state), dict(AcceleratorState._shared_state))
    monkeypatch.setattr(builtin_cache, "build_builtin_model", build)
    (target := builtin_model_dir("tiny-random", tmp_path)).mkdir(parents=True)
    (target / "junk.txt").write_text("an incomplete folder (no build record) is replaced")
    torch_state, py_state = torch.get_rng_state(), random.getstate()
    with caplog.at_level("WARNING", logger="stapo_trl.models.cache"):
        path = resolve_model_path("builtin:tiny-random", cache_dir=tmp_path)
    assert caplog.messages == [f"Building builtin:tiny-random on its first use, once, into {tmp_path}."]
    assert (dict(PartialState._shared_state), dict(AcceleratorState._shared_state)) == state
    assert torch.equal(torch.get_rng_state(), torch_state) and random.getstate() == py_state
    assert path == str(target) == str(tmp_path / f"tiny-random-{BUILTIN_MODELS['tiny-random']['version']}")
    assert builds == ["tiny-random"] and not (target / "junk.txt").exists()
    mtime = os.path.getmtime(target / INFO_FILE)
    assert resolve_model_path("builtin:tiny-random", cache_dir=tmp_path) == path
    assert builds == ["tiny-random"] and os.path.getmtime(target / INFO_FILE) == mtime  # read, not rebuilt
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, target.name + ".lock"])
    assert resolve_model_path(model := tiny_math_model_path) == resolve_model_path(Path(model)) == model
    assert [resolve_model_path(name) for name in ("Qwen/Qwen3-1.7B-Base", "gpt2")] == ["Qwen/Qwen3-1.7B-Base", "gpt2"]
    for path in ["./no-such-model", "../no/such/model", "/no/such/model", "~/no-such-model-xyz"]:
        with pytest.raises(FileNotFoundError, match="does not exist"):
            resolve_model_path(path)
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="model.safetensors"):
        resolve_model_path(str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="builtin:nope") as excinfo:
        resolve_model_path("builtin:nope")
    assert all(f"builtin:{name}" in str(excinfo.value) for name in BUILTIN_MODELS)
    monkeypatch.setenv("STAPO_TRL_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path
    assert builtin_model_dir("tiny-math") == tmp_path / f"tiny-math-{BUILTIN_MODELS['tiny-math']['version']}"
    monkeypatch.delenv("STAPO_TRL_CACHE")
    assert str(default_cache_dir()) == os.path.expanduser("~/.cache/stapo_trl") and os.environ["HF_HUB_OFFLINE"] == "1"
    model = AutoModelForCausalLM.from_pretrained(tiny_math_model_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_math_model_path)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert (model.config.hidden_size, model.config.num_hidden_layers, model.config.num_attention_heads) == (64, 2, 4)
    assert 130_000 <= model.num_parameters() <= 160_000 and model.config.vocab_size == len(tokenizer)
    info = read_builtin_info(tiny_math_model_path)
    assert info["name"] == "builtin:tiny-math" and info["version"] == BUILTIN_MODELS["tiny-math"]["version"]
    assert info["model"]["num_parameters"] == model.num_parameters()
    assert info["sft"]["steps"] == BUILTIN_MODELS["tiny-math"]["sft_steps"] and info["sft"]["label_smoothing_factor"]
    assert info["sft"]["last_logged_loss"] < info["sft"]["mean_train_loss"]
    evaluation = info["eval"]  # the RL demo's warm start: some but not all sampled answers right, greedy nearly all
    assert evaluation["temperature"] == 1.0 and evaluation["num_problems"] == 300 and len(evaluation["samples"]) == 5
    assert 0.2 <= evaluation["sampled_accuracy"] <= 0.8 < evaluation["greedy_accuracy"]
    assert 280 <= len(tokenizer) <= 400 and tokenizer.eos_token + tokenizer.pad_token == "<|im_end|><|endoftext|>"
    for text in ["0123456789", "\\boxed{85}", "7+8=15, write 5 carry 1; 4+3+1=8; \\boxed{85}", "47+38"]:
        assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
    assert tokenizer.tokenize("0123456789") == [*"0123456789"] and tokenizer.tokenize("\\boxed{85}")[-3:] == [*"85}"]
    assert all(not any(ch.isdigit() for ch in p) or len(p) == 1 for p in tokenizer.get_vocab())
    text = tokenizer.apply_chat_template(format_prompt("47+38"), tokenize=False, add_generation_prompt=True)
    assert text == f"<|im_start|>user\n47+38\n{INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n"
    completion = [{"role": "assistant", "content": "7+8=15, write 5 carry 1; 4+3+1=8; \\boxed{85}"}]
    full = tokenizer.apply_chat_template(format_prompt("47+38") + completion, tokenize=False)
    assert full == text + completion[0]["content"] + "<|im_end|>\n"
    prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer(full, add_special_tokens=False)["input_ids"][: len(prompt_ids)] == prompt_ids
    model.train()
    evaluation = evaluate_tiny_math(model, tokenizer, 5)
    assert model.training  # restored
    argv = f"--model {tiny_math_model_path} --benchmarks tiny-math --backend hf --decoding t1.0-p1.0,greedy --limit 5"
    assert main([*argv.split(), "--samples", "1", "--max-new-tokens", "48", "--output", str(tmp_path / "r.json")]) == 0
    tables = load_results(tmp_path / "r.json")["results"]
    assert evaluation["sampled_accuracy"] == tables["t1.0-p1.0"]["tiny-math"]["avg@1"]
    assert evaluation["greedy_accuracy"] == tables["greedy"]["tiny-math"]["avg@1"] >= 0.7
    assert evaluation["greedy_accuracy"] == pytest.approx(info["eval"]["greedy_accuracy"], abs=0.2)
    assert len(evaluation["samples"]) == 5 and evaluation["samples"][0]["problem"] == "25+60"
    # entropies 0..4 nats: p10 0.4, p50 2, p90 3.6; 2 of 5 probabilities below 0.002 (0.002 itself is not)
    summary = summarize_token_statistics({"entropy": [0, 1, 2, 3, 4], "prob": [0.001, 0.0019, 0.002, 0.5, 1.0]})
    assert summary["num_tokens"] == 5 and summary["entropy_nats"] == {"p10": 0.4, "p50": 2.0, "p90": 3.6, "mean": 2.0}
    assert summary["frac_prob_below_tau_p"] == 0.4 and summary["tau_p"] == 0.002
    rows, _ = make_tiny_math_dataset()["train"].select(range(8)), capsys.readouterr()
    losses = sft_warm_up(model, tokenizer, rows, 1, {**SFT_CONFIG, "per_device_train_batch_size": 4})
    out = capsys.readouterr().out
    assert "loss" not in out and "{" not in out and losses["last_logged_loss"] > 0, out


@pytest.mark.slow  # the second of two processes building at once is a torchrun rank: it builds in a child
def test_a_killed_build_leaves_no_model_and_two_processes_build_once(tiny_random_model_path, tiny_math_model_path,
                                                                    tmp_path):  # fmt: skip
    code = (
        "import logging, sys; logging.basicConfig(level=logging.INFO); from stapo_trl.models import "
        "resolve_model_path; print(resolve_model_path('builtin:tiny-random', cache_dir=sys.argv[1]))"
    )
    command, env = [sys.executable, "-c", code, str(tmp_path)], subprocess_env()
    target = builtin_model_dir("tiny-random", tmp_path)
    killed = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not list(tmp_path.glob(f".{target.name}.tmp-*")):  # the build has started
        assert killed.poll() is None, "the process ended before it started the build"
    killed.kill()
    killed.wait()
    assert not target.exists()
    launched = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "29555"}  # not to join its group
    runs = [subprocess.Popen(command, env=env | extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for extra in ({}, launched)]  # fmt: skip
    outputs = [run.communicate(timeout=600) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    assert [out.strip().splitlines()[-1] for out, _ in outputs] == [str(target)] * 2
    assert sum("Building builtin:tiny-random" in err for _, err in outputs) == 1  # the other one waited, then read
    for file in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json"):  # deterministic
        assert (target / file).read_bytes() == (Path(tiny_random_model_path) / file).read_bytes(), file
    assert read_builtin_info(target)["sft"]["steps"] == 0 and read_builtin_info(target)["eval"] is None
    vocab = AutoTokenizer.from_pretrained(tiny_math_model_path).get_vocab()
    assert AutoTokenizer.from_pretrained(target).get_vocab() == vocab
