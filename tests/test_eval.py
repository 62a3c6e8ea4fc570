"""`stapo-eval` (`stapo_trl.cli.eval`, `stapo_trl.evaluation`): metrics, argument validation, the end-to-end CLI on the tiny model, resume,
comparison tables and the in-training callback."""

import importlib.util
import itertools
import json
from types import SimpleNamespace

import pytest

from stapo_trl.cli import eval as stapo_eval
from stapo_trl.cli.eval import main
from stapo_trl.cli.eval_args import parse_decoding_list
from stapo_trl.evaluation.generation import (
    DECODINGS,
    GeneratedSample,
    build_prompt_text,
    hf_generate,
)
from stapo_trl.evaluation.metrics import benchmark_metrics, pass_at_k, pass_k_values
from stapo_trl.evaluation.results import format_comparison, format_results_table, load_results
from stapo_trl.evaluation.tasks import BenchmarkProblem
from stapo_trl.evaluation.vllm_generation import VLLMGenerator


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    # Generation with a 142k-parameter model is dominated by thread hand-offs: on a busy 2-core machine two OpenMP
    # threads make it ~10x slower than one. Restored afterwards so other test modules keep their setting.
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ----------------------------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------------------------


def _pass_at_k_brute_force(n, c, k):
    # Enumerate every k-subset of n samples (the first c correct); pass@k = share of subsets with a correct one.
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_brute_force():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(_pass_at_k_brute_force(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_edges():
    assert pass_at_k(32, 0, 32) == 0.0
    assert pass_at_k(32, 32, 1) == 1.0
    assert pass_at_k(32, 8, 1) == pytest.approx(0.25)  # pass@1 == avg accuracy
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 8)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_pass_k_values_are_powers_of_two():
    assert pass_k_values(32) == [1, 2, 4, 8, 16, 32]
    assert pass_k_values(4) == [1, 2, 4]
    assert pass_k_values(6) == [1, 2, 4]
    assert pass_k_values(1) == [1]


def test_benchmark_metrics_hand_built():
    # Problem 0: 2/4 correct, problem 1: 0/4, problem 2: 4/4 -> avg@4 = (0.5 + 0 + 1) / 3 = 0.5.
    correct = [[True, False, True, False], [False] * 4, [True] * 4]
    table = benchmark_metrics(correct, 4)
    assert table["avg@4"] == pytest.approx(0.5)
    assert table["pass@k"]["1"] == pytest.approx(0.5)  # pass@1 is the mean accuracy
    # pass@4: problem 0 -> 1, problem 1 -> 0, problem 2 -> 1.
    assert table["pass@k"]["4"] == pytest.approx(2 / 3)
    assert table["num_problems"] == 3 and table["n_samples"] == 4


# ----------------------------------------------------------------------------------------------------------------
# Argument validation (fails before any model is loaded)
# ----------------------------------------------------------------------------------------------------------------


def test_decoding_aliases():
    assert parse_decoding_list("paper") == ["t1.0-p1.0", "t0.7-p0.9"]
    assert parse_decoding_list("t0.7-p0.9") == ["t0.7-p0.9"]
    with pytest.raises(ValueError) as info:
        parse_decoding_list("beam")
    for name in ["paper", *DECODINGS]:
        assert name in str(info.value)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--model", "m", "--benchmarks", "aime24,aime26"], "aime25"),  # lists the valid names
        (["--model", "m", "--decoding", "t0.5-p1.0"], "t0.7-p0.9"),
        (["--benchmarks", "aime24"], "--model is required"),
        (["--model", "m", "--samples", "0"], "--samples must be >= 1"),
        # no argparse prefix matching: an abbreviation is an unknown flag, with the full one suggested
        (["--model", "m", "--sample", "4"], "unrecognized arguments: --sample 4; did you mean --samples"),
        (["--model", "m", "--benchmark", "aime24"], "did you mean --benchmarks"),
        (["--model", "./no/such/model", "--benchmarks", "aime24"], "'./no/such/model' does not exist"),
        # A relative path without "./" reads as a Hub id: offline, one line instead of transformers' traceback.
        (["--model", "outputs/no-such", "--benchmarks", "aime24"], "'outputs/no-such' is not a local directory"),
        (["--model", "Qwen/No-Such-Model", "--benchmarks", "aime24"], "not in the local Hugging Face cache"),
    ],
)
def test_bad_arguments_fail_early(argv, expected, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert expected in err
    assert err.startswith("stapo-eval: error: ") and err.count("\n") == 1  # one line, no usage block


def test_missing_data_file_fails_before_model_load(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(stapo_eval, "_make_generator", lambda *a, **k: pytest.fail("model loaded"))
    (tmp_path / "aime24").mkdir()
    with pytest.raises(SystemExit):
        main(
            [
                "--model",
                str(tmp_path),  # an existing folder (never loaded: the data check comes first)
                "--benchmarks",
                "aime24",
                "--data-dir",
                str(tmp_path),
                "--output",
                str(tmp_path / "r.json"),
            ]
        )
    assert "No data file" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_backend_missing_is_a_clear_error(shared_data_dir, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(
            ["--model", str(tmp_path), "--backend", "vllm", "--benchmarks", "aime24", "--limit", "1"]
            + ["--data-dir", str(shared_data_dir), "--output", str(tmp_path / "r.json")]
        )
    assert "pip install" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------------------
# End to end on the tiny model (two real benchmark files), then resume
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def e2e_run(tiny_math_model_path, shared_data_dir, tmp_path_factory):
    output = tmp_path_factory.mktemp("eval") / "results.json"
    argv = [
        "--model", tiny_math_model_path,
        "--backend", "hf",
        "--benchmarks", "amc23,math500",  # their first problems fit the tiny model's 512 positions
        "--decoding", "paper",
        "--data-dir", str(shared_data_dir),
        "--limit", "2",
        "--samples", "2",
        "--max-new-tokens", "48",  # the tiny model answers in ~30 tokens
        "--output", str(output),
    ]  # fmt: skip
    assert main(argv) == 0
    return argv, output


def test_e2e_results_file(e2e_run, tiny_math_model_path, capsys):
    _, output = e2e_run
    data = load_results(output)
    assert set(data["results"]) == {"t1.0-p1.0", "t0.7-p0.9"}
    for tables in data["results"].values():
        assert set(tables) == {"amc23", "math500"}
        for bench, table in tables.items():
            assert 0.0 <= table["avg@2"] <= 1.0
            assert set(table["pass@k"]) == {"1", "2"}
            assert table["num_problems"] == 2 and table["n_samples"] == 2
            assert table["num_grader_errors"] >= 0
            assert table["data_source"].endswith(f"{bench}/test.jsonl")
    # 2 decodings x 2 benchmarks x 2 problems x 2 samples.
    assert len(data["samples"]) == 16
    record = data["samples"][0]
    assert {"benchmark", "decoding", "id", "sample", "extracted", "correct", "grader_error"} <= set(record)
    assert data["decodings"]["t0.7-p0.9"] == {"temperature": 0.7, "top_p": 0.9, "top_k": None}
    assert data["model"]["source"] == "local" and data["model"]["revision"].endswith(
        tiny_math_model_path.rstrip("/").split("/")[-1]
    )
    assert data["versions"]["transformers"] and data["versions"]["math-verify"]
    assert data["summary"]["t1.0-p1.0"]["benchmarks"] == ["amc23", "math500"]
    gen_time = sum(t["generation_time_s"] for tables in data["results"].values() for t in tables.values())
    print(f"tiny model, HF backend on CPU: {gen_time / len(data['samples']):.3f} s per sample (48 new tokens max)")


def test_e2e_resume_skips_finished_pairs(e2e_run, monkeypatch, capsys):
    argv, output = e2e_run
    before = output.read_text()
    monkeypatch.setattr(stapo_eval, "_make_generator", lambda *a, **k: pytest.fail("regenerated a finished pair"))
    assert main(argv) == 0
    assert output.read_text() == before  # nothing rewritten
    table = capsys.readouterr().out
    assert "| Model | AMC23 | MATH-500 | Avg |" in table
    assert "/t0.7-p0.9 |" in table


def test_e2e_resume_with_other_settings_is_refused(e2e_run, capsys):
    argv, _ = e2e_run
    changed = list(argv)
    changed[changed.index("--max-new-tokens") + 1] = "64"
    with pytest.raises(SystemExit):
        main(changed)
    err = capsys.readouterr().err
    assert "max_new_tokens" in err and "another --output" in err


# ----------------------------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------------------------


def _fake_results(name, values):
    tables = {b: {"avg@4": v, "n_samples": 4, "pass@k": {}} for b, v in values.items()}
    return {"model": {"name_or_path": name, "source": "hub"}, "results": {"t1.0-p1.0": tables}}


def test_tables_and_relative_gain():
    six = ["aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench"]
    a = _fake_results("grpo", dict(zip(six, [0.1, 0.1, 0.4, 0.6, 0.2, 0.4])))  # Avg 0.30
    b = _fake_results("stapo", dict(zip(six, [0.2, 0.1, 0.5, 0.6, 0.2, 0.5])))  # Avg 0.35
    table = format_results_table([a, b])
    assert table.splitlines()[0] == "| Model | AIME24 | AIME25 | AMC23 | MATH-500 | Minerva | OlympiadBench | Avg |"
    assert "| grpo/t1.0-p1.0 | 10.0 | 10.0 | 40.0 | 60.0 | 20.0 | 40.0 | 30.0 |" in table
    comparison = format_comparison(a, b)
    # (b - a) / a: AIME24 (0.2 - 0.1) / 0.1 = +100 %, Avg (0.35 - 0.30) / 0.30 = +16.7 %.
    assert "| rel. gain (b-a)/a | +100.0% | +0.0% | +25.0% | +0.0% | +0.0% | +25.0% | +16.7% |" in comparison


def test_incomplete_average_is_marked():
    table = format_results_table([_fake_results("m", {"aime24": 0.5})])
    assert "| m/t1.0-p1.0 | 50.0 | 50.0* |" in table


def test_comparison_averages_the_shared_benchmarks_and_lists_what_differs():
    a = _fake_results("grpo", {"aime24": 0.1, "amc23": 0.4, "math500": 0.6})
    b = _fake_results("stapo", {"aime24": 0.2, "amc23": 0.5})  # no MATH-500
    a["config"], b["config"] = {"max_new_tokens": 32, "limit": 3}, {"max_new_tokens": 16, "limit": 3}
    b["results"]["t1.0-p1.0"]["aime24"] = {"avg@2": 0.2, "n_samples": 2, "pass@k": {}}
    comparison = format_comparison(a, b)
    # Avg over AIME24 and AMC23 only, for both rows: a 0.25, b 0.35 -> +40 %; MATH-500 has no gain.
    assert "| grpo/t1.0-p1.0 | 10.0 | 40.0 | 60.0 | 25.0* |" in comparison
    assert "| stapo/t1.0-p1.0 | 20.0 | 50.0 | - | 35.0* |" in comparison
    assert "| rel. gain (b-a)/a | +100.0% | +25.0% | n/a | +40.0% |" in comparison
    assert "Avg over the 2 paper benchmark(s) both files have: aime24, amc23." in comparison
    assert "max_new_tokens: 32 vs 16" in comparison and "aime24 / t1.0-p1.0: 4 vs 2 samples" in comparison
    assert "limit" not in comparison.split("Not like for like")[1]  # equal settings are not listed


def test_compare_names_a_file_that_is_not_json(tmp_path, capsys):
    (tmp_path / "broken.json").write_text("not json")
    with pytest.raises(SystemExit):
        main(["--compare", str(tmp_path / "broken.json"), str(tmp_path / "broken.json")])
    assert "broken.json is not a stapo-eval results file: not JSON" in capsys.readouterr().err


def test_compare_cli(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for path, value in ((a, 0.2), (b, 0.3)):
        data = _fake_results(path.stem, {"aime24": value}) | {"format_version": 1}
        path.write_text(json.dumps(data))
    assert main(["--compare", str(a), str(b)]) == 0
    assert "+50.0%" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------------------------
# In-training callback
# ----------------------------------------------------------------------------------------------------------------


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


def test_vllm_generator_with_a_fake_vllm(monkeypatch):
    # vLLM is GPU-only and absent here: a stand-in module checks the calls we make (SamplingParams(n, temperature,
    # top_p, max_tokens), token-id prompts without extra special tokens) and the mapping of its outputs.
    import sys
    import types

    calls = {}

    class SamplingParams:
        def __init__(self, **kwargs):
            calls["sampling"] = kwargs
            calls.setdefault("seeds", []).append(kwargs["seed"])
            self.n = kwargs["n"]

    class FakeTokenizer:
        def __call__(self, text, add_special_tokens=True):
            calls.setdefault("add_special_tokens", []).append(add_special_tokens)
            return {"input_ids": [ord(c) for c in text]}

    class LLM:
        def __init__(self, **kwargs):
            calls["llm"] = kwargs

        def get_tokenizer(self):
            return FakeTokenizer()

        def generate(self, prompts, params):
            calls["prompts"] = prompts
            assert len(params) == len(prompts)  # one SamplingParams per prompt (its own seed)
            n = params[0].n
            out = types.SimpleNamespace(text=r"\boxed{3}", token_ids=[1, 2, 3], finish_reason="stop")
            cut = types.SimpleNamespace(text=r"\boxed{", token_ids=[1] * 8, finish_reason="length")
            return [types.SimpleNamespace(outputs=[out] * (n - 1) + [cut]) for _ in prompts]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams))
    gpu_platform = types.SimpleNamespace(is_cpu=lambda: False)
    monkeypatch.setitem(sys.modules, "vllm.platforms", types.SimpleNamespace(current_platform=gpu_platform))
    generator = VLLMGenerator("some/model", seed=3, tensor_parallel_size=2)
    samples = generator.generate(["ab", "c"], n=4, temperature=0.7, top_p=0.9, max_new_tokens=20480, seed=5)
    assert calls["sampling"] == {"n": 4, "temperature": 0.7, "top_p": 0.9, "max_tokens": 20480, "seed": 9}
    # vLLM seeds sample j of a request with seed + j: prompt i starts at 5 + 4 i, so no two samples share a seed.
    assert calls["seeds"] == [5, 9]
    assert calls["llm"]["model"] == "some/model" and calls["llm"]["tensor_parallel_size"] == 2
    assert calls["llm"]["gpu_memory_utilization"] == 0.9 and "enforce_eager" not in calls["llm"]  # GPU defaults
    assert calls["prompts"] == [{"prompt_token_ids": [97, 98]}, {"prompt_token_ids": [99]}]
    assert calls["add_special_tokens"] == [False, False]
    assert [len(s) for s in samples] == [4, 4]
    assert samples[0][0] == GeneratedSample(r"\boxed{3}", 3, True)
    assert samples[0][-1].finished is False


@pytest.mark.parametrize(
    "correct, ids, problem",
    [
        ([[True, False], []], ["p0", "p1"], "p1"),  # one empty row
        ([[], []], ["a", "b"], "a"),  # every row empty: the first is named
        ([[True], [], [False]], None, "#1"),  # no ids: the row index is named
    ],
)
def test_benchmark_metrics_empty_row_names_benchmark_and_problem(correct, ids, problem):
    with pytest.raises(ValueError) as info:
        benchmark_metrics(correct, 2, benchmark="aime24", problem_ids=ids)
    assert "aime24" in str(info.value) and f"problem {problem} " in str(info.value)


def test_greedy_decoding_is_a_setting_outside_the_paper():
    assert parse_decoding_list("greedy") == ["greedy"]
    assert parse_decoding_list("paper") == ["t1.0-p1.0", "t0.7-p0.9"]  # the paper's protocol does not grow
    assert DECODINGS["greedy"].temperature == 0.0


def test_hf_generate_at_temperature_zero_is_argmax_decoding(tiny_random_model_path):
    # Temperature 0 means argmax decoding (as in vLLM): the same tokens as a hand-written argmax loop over the model's
    # logits, whatever the seed. transformers would refuse temperature=0.0 with do_sample=True.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_random_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_random_model_path, dtype=torch.float32)
    prompts = [build_prompt_text(tokenizer, p) for p in ["12+34", "7+8"]]
    expected = []
    for text in prompts:
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]  # (1, P)
        new = []
        with torch.no_grad():
            for _ in range(6):
                next_id = int(
                    model(torch.cat([ids, torch.tensor([new], dtype=torch.long)], dim=1)).logits[0, -1].argmax()
                )
                new.append(next_id)
                if next_id == tokenizer.eos_token_id:
                    break
        expected.append(tokenizer.decode(new, skip_special_tokens=True))
    for seed in (0, 1):
        samples = hf_generate(model, tokenizer, prompts, n=2, temperature=0.0, top_p=1.0, max_new_tokens=6, seed=seed)
        assert [[s.text for s in row] for row in samples] == [[e, e] for e in expected]


def test_vllm_max_lora_rank_is_the_smallest_supported_rank_holding_the_adapter(tmp_path):
    import json

    from stapo_trl.evaluation.vllm_generation import vllm_max_lora_rank

    def adapter(name, **config):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "adapter_config.json").write_text(json.dumps(config))
        return str(folder)

    assert vllm_max_lora_rank(adapter("r8", r=8)) == 8
    assert vllm_max_lora_rank(adapter("r12", r=12)) == 16
    assert vllm_max_lora_rank(adapter("pattern", r=8, rank_pattern={"q_proj": 40})) == 64  # a per-module rank
    with pytest.raises(ValueError, match="LoRA rank 1024 is above vLLM's largest max_lora_rank 512"):
        vllm_max_lora_rank(adapter("huge", r=1024))


def test_generation_budget_beyond_the_models_positions_is_one_line(tiny_math_model_path, tmp_path, capsys):
    """The paper's 20,480 new tokens on a 512-position model (`make evaluate` without --max-new-tokens): one line
    naming the flag, not a traceback from inside the first benchmark."""
    argv = ["--model", tiny_math_model_path, "--benchmarks", "tiny-math", "--backend", "hf", "--limit", "1"]
    with pytest.raises(SystemExit) as info:
        main([*argv, "--samples", "1", "--max-new-tokens", "600", "--output", str(tmp_path / "r.json")])
    assert info.value.code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "error" in line]  # after the load bar
    assert line.startswith("stapo-eval: error: --max-new-tokens 600: max_new_tokens=600 leaves no room for a prompt:")
    assert "the model has 512 positions" in line


# ----------------------------------------------------------------------------------------------------------------
# Where the results go without --output (issue 23, item 3): a place that belongs to the run, printed
# ----------------------------------------------------------------------------------------------------------------

# why: the smallest real evaluation (one tiny-math problem, one sample, 8 tokens): only where the file goes matters
ONE_PROBLEM = [
    "--benchmarks",
    "tiny-math",
    "--backend",
    "hf",
    "--decoding",
    "greedy",
    "--limit",
    "1",
    "--samples",
    "1",
]
ONE_PROBLEM += ["--max-new-tokens", "8"]


def test_default_results_go_next_to_a_local_model_and_the_path_is_printed(
    tiny_math_model_path, tmp_path, monkeypatch, capsys
):
    import shutil

    model = tmp_path / "runs" / "demo-stapo"  # a copy: the session's model folder is shared by other tests
    shutil.copytree(tiny_math_model_path, model)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["--model", str(model), *ONE_PROBLEM]) == 0
    results = model / "stapo_eval.json"
    assert load_results(results)["results"]["greedy"]["tiny-math"]["num_problems"] == 1
    assert list(work.iterdir()) == []  # nothing in the current folder (it was stapo_eval_demo-stapo.json)
    out = capsys.readouterr().out
    assert f"Results file: {results} (the default; --output to choose another)" in out.splitlines()
    assert out.splitlines()[-1] == f"Results file: {results}"


def test_default_results_of_a_builtin_model_go_under_outputs(tiny_math_model_path, tmp_path, monkeypatch, capsys):
    from pathlib import Path

    # builtin:tiny-math resolves to the session's copy; its folder is a shared cache, not the run's place.
    monkeypatch.setenv("STAPO_TRL_CACHE", str(Path(tiny_math_model_path).parent))
    monkeypatch.chdir(tmp_path)
    assert main(["--model", "builtin:tiny-math", *ONE_PROBLEM]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outputs"]
    results = Path("outputs") / "stapo-eval" / "builtin-tiny-math.json"
    assert load_results(tmp_path / results)["model"]["name_or_path"] == "builtin:tiny-math"
    assert capsys.readouterr().out.splitlines()[-1] == f"Results file: {results}"


def test_default_results_path_of_a_hub_id_keeps_its_organisation_and_revision():
    from pathlib import Path

    from stapo_trl.cli.eval import default_output

    # Two organisations' models of the same name no longer share stapo_eval_Qwen3-1.7B-Base.json in the current folder.
    assert default_output("Qwen/Qwen3-1.7B-Base") == Path("outputs/stapo-eval/Qwen--Qwen3-1.7B-Base.json")
    assert default_output("me/Qwen3-1.7B-Base", "v2") == Path("outputs/stapo-eval/me--Qwen3-1.7B-Base@v2.json")


def test_an_output_path_that_cannot_be_written_is_refused_before_the_model(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(stapo_eval, "_make_generator", lambda *a, **k: pytest.fail("model loaded"))
    (tmp_path / "a-file").write_text("")
    for output, expected in (
        (tmp_path, f"--output {tmp_path} is a folder: give a file, e.g. {tmp_path / 'stapo_eval.json'}."),
        (
            tmp_path / "a-file" / "r.json",
            f"--output {tmp_path / 'a-file' / 'r.json'}: {tmp_path / 'a-file'} is a file",
        ),
    ):
        with pytest.raises(SystemExit) as info:
            main(["--model", str(tmp_path), *ONE_PROBLEM, "--output", str(output)])
        assert info.value.code == 2
        assert capsys.readouterr().err.startswith(f"stapo-eval: error: {expected}")
