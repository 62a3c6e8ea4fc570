"""vLLM on the CPU (`make test-vllm`): eval against HF, colocate rollouts and weight sync; refusals run without it."""

import dataclasses
import importlib.util
import math
import os
import signal
import subprocess
import sys
import time
import warnings

import pytest
import torch
from testing_utils import PROMPTS, REPO, STAPO_RECIPE, ForwardCounter, free_port, length_reward
from trl import GRPOTrainer

from stapo_trl import STAPOConfig, STAPOTrainer
from stapo_trl.cli.args import parse_args
from stapo_trl.cli.dry_run import dry_run_recipe
from stapo_trl.evaluation.generation import DECODINGS, HFGenerator, VLLMGenerator, build_prompt_text, evaluate_problems
from stapo_trl.evaluation.tasks import load_benchmark
from stapo_trl.grading import extract_boxed_answer
from stapo_trl.integrations.vllm_support import check_vllm_args


def test_server_mode_on_a_cpu_only_run_is_refused_at_construction_and_by_the_dry_run(tiny_random_model_path, tmp_path):
    config = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[])
    args = STAPOConfig(**config, use_vllm=True, vllm_mode="server")
    raised = ((ValueError, r"vllm_mode='server' needs a CUDA GPU .*NCCL") if importlib.util.find_spec("vllm") else
              (ImportError, "^vLLM is not available and `use_vllm` is set to True"))  # fmt: skip
    with pytest.raises(raised[0], match=raised[1]):
        STAPOTrainer(tiny_random_model_path, reward_funcs=length_reward, args=args, train_dataset=PROMPTS)
    with pytest.raises(ValueError, match="vllm_mode='server'"):
        check_vllm_args(args)
    check_vllm_args(STAPOConfig(**config, use_vllm=True, vllm_mode="colocate"))
    check_vllm_args(STAPOConfig(**config, use_vllm=False, vllm_mode="server"))  # vLLM off: the mode is never used
    # The dry run: a CPU recipe asking for a vLLM server is an error; a GPU recipe checked without a GPU a warning.
    argv = ["--config", "recipes/demo/stapo.yaml", "--use_vllm", "true", "--vllm_mode", "server"]
    report = dry_run_recipe(argv, 1, force_cpu=False)
    assert not report.ok and any("needs a CUDA GPU on a CPU-only run" in e for e in report.errors), report.summary()
    report = dry_run_recipe(["--config", "recipes/Qwen3-1.7B/stapo.yaml"], 4, force_cpu=True)
    assert report.ok and any("CUDA-only" in w for w in report.warnings), report.summary()


@pytest.mark.vllm
def test_vllm_eval_agrees_with_hf_generate_and_serves_a_lora_adapter_like_hf(tiny_math_h64_model_path, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    problems = load_benchmark("tiny-math", limit=100)

    def run(generator, decoding, n, limit=100, max_new_tokens=48):
        table, records = evaluate_problems(generator.generate, generator.tokenizer, problems[:limit], n=n, seed=0,
            decoding=decoding, max_new_tokens=max_new_tokens, save_completions=True)  # fmt: skip
        return table, records, [[r["correct"] for r in records[i * n : (i + 1) * n]] for i in range(limit)]

    hf = HFGenerator(tiny_math_h64_model_path, dtype="float32", device="cpu", batch_size=256)
    hf_greedy, hf_sampled = run(hf, DECODINGS["greedy"], 1), run(hf, DECODINGS["t1.0-p1.0"], 4)
    vllm = VLLMGenerator(tiny_math_h64_model_path, dtype="float32", max_model_len=256)
    try:
        vllm_greedy = run(vllm, DECODINGS["greedy"], 1)
        vllm_sampled = run(vllm, DECODINGS["t1.0-p1.0"], 4)  # a per-request seed: needs chunked prefill off (CPU)
        text = build_prompt_text(vllm.tokenizer, problems[0].problem)  # twice in one call: each prompt its own seed
        twice = vllm.generate([text, text], n=8, temperature=1.0, top_p=1.0, max_new_tokens=48, seeds=[0, 8])
        assert [s.text for s in twice[0]] != [s.text for s in twice[1]]
    finally:
        vllm.llm.llm_engine.engine_core.shutdown()
    pairs = zip(hf_greedy[1], vllm_greedy[1], strict=True)
    same = sum(extract_boxed_answer(h["completion"]) == extract_boxed_answer(v["completion"]) for h, v in pairs)
    assert same >= 95, f"greedy answers agree on {same}/100 problems only"  # float32 kernels differ: near-ties flip
    per_problem = [torch.tensor([sum(row) / len(row) for row in rows]) for _, _, rows in (hf_sampled, vllm_sampled)]
    means, variances = [p.mean().item() for p in per_problem], [p.var().item() / len(p) for p in per_problem]
    z = (means[1] - means[0]) / math.sqrt(sum(variances))
    assert abs(z) < 4, f"avg@4 at T=1 within sampling error: hf {means[0]:.3f} vs vllm {means[1]:.3f}: z = {z:.2f}"
    assert vllm_sampled[0]["num_truncated"] < 40  # completions end (eos is recognised), as with HF
    torch.manual_seed(0)  # a LoRA adapter folder: served on its base model as HF's merged model generates
    base = AutoModelForCausalLM.from_pretrained(tiny_math_h64_model_path, dtype=torch.float32)
    lora = LoraConfig(r=12, lora_alpha=24, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False)
    get_peft_model(base, lora).save_pretrained(adapter := str(tmp_path / "adapter"))
    AutoTokenizer.from_pretrained(tiny_math_h64_model_path).save_pretrained(adapter)

    def completions(generator):
        return [r["completion"] for r in run(generator, DECODINGS["greedy"], 1, limit=40, max_new_tokens=24)[1]]

    hf_base = completions(HFGenerator(tiny_math_h64_model_path, dtype="float32", device="cpu"))
    hf_adapter = completions(HFGenerator(adapter, dtype="float32", device="cpu"))
    vllm = VLLMGenerator(adapter, dtype="float32", max_model_len=256)
    try:
        assert vllm.llm.llm_engine.vllm_config.lora_config.max_lora_rank == 16  # r = 12 rounded up to vLLM's 16
        vllm_adapter = completions(vllm)
    finally:
        vllm.llm.llm_engine.engine_core.shutdown()
    same_as_hf = sum(v == h for v, h in zip(vllm_adapter, hf_adapter, strict=True))
    same_as_base = sum(v == b for v, b in zip(vllm_adapter, hf_base, strict=True))
    assert sum(h != b for h, b in zip(hf_adapter, hf_base, strict=True)) >= 20  # the adapter changes the outputs
    assert same_as_hf >= 36, f"vLLM with the adapter matches the merged HF model on {same_as_hf}/40 only"
    assert same_as_base < same_as_hf


def _prompt_logprobs(llm, token_ids):
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=0)
    out = llm.generate([{"prompt_token_ids": token_ids}], params, use_tqdm=False)[0]
    return torch.tensor([lp[t].logprob for lp, t in zip(out.prompt_logprobs[1:], token_ids[1:])], dtype=torch.float64)


def _hf_logprobs(model, token_ids):
    with torch.no_grad():
        logits = model(torch.tensor([token_ids]), use_cache=False).logits[0, :-1].double()  # (L-1, V)
    return logits.log_softmax(-1).gather(1, torch.tensor(token_ids[1:]).unsqueeze(1)).squeeze(1)


@pytest.mark.vllm
def test_colocate_training_with_vllm_rollouts_its_loss_and_its_weight_sync(tiny_math_h64_model_path, tmp_path):
    from stapo_trl.integrations.vllm_support import sync_weights_by_reload

    args = STAPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], per_device_train_batch_size=4,
        num_generations=2, max_completion_length=12, logging_steps=1, save_strategy="no", seed=0, learning_rate=1e-2,
        s2t_prob_threshold=0.05, use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.15,
        vllm_max_model_length=128, vllm_importance_sampling_correction=True)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = STAPOTrainer(tiny_math_h64_model_path, reward_funcs=length_reward, args=args, train_dataset=PROMPTS)
    trainer.args.max_steps = 3
    counter = ForwardCounter(trainer.model)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()  # syncs weights into vLLM before every generation after the first optimizer step
    for name, p in trainer.model.named_parameters():
        assert not torch.equal(before[name], p), f"{name} did not change"
    assert counter.count == 3  # TRL's old-log-prob forward only: the mask comes from the loss's own forward
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == 3
    for entry in logged:  # importance_sampling_ratio: the rollouts came from vLLM
        keys = ("s2t/silenced_ratio", "s2t/candidate_ratio", "s2t/num_candidates", "s2t/num_silenced")
        assert {*keys, "sampling/importance_sampling_ratio/mean"} <= set(entry), entry
    assert sum(entry["s2t/num_candidates"] for entry in logged) > 0
    trainer.model.train()  # the loss under vLLM's IS correction equals TRL's when the threshold never fires
    trainer.current_gradient_accumulation_steps = 1
    batch = GRPOTrainer._generate_and_score_completions(trainer, [PROMPTS[i] for i in range(4)])
    assert "importance_sampling_ratio" in batch and batch["old_per_token_logps"] is not None
    settings = trainer.s2t  # the S2T values the trainer reads (from its config, at construction)
    trainer.s2t = dataclasses.replace(settings, prob_threshold=1e-30)  # no token is that improbable: no candidate
    try:
        stapo_loss = trainer._compute_loss(trainer.model, dict(batch))  # the trainer's geometry: the mask in the loss
    finally:
        trainer.s2t = settings
    assert trainer._metrics["train"]["s2t/num_candidates"][-1] == 0
    trl_loss = GRPOTrainer._compute_loss(trainer, trainer.model, dict(batch))
    assert stapo_loss.item() == pytest.approx(trl_loss.item(), rel=1e-6, abs=1e-7)
    generation = trainer.vllm_generation  # vLLM generates with the new weights after a sync (STAPOTrainer's, on CPU)
    assert generation.sync_weights.__func__ is sync_weights_by_reload
    llm, tokenizer = generation.llm, trainer.processing_class
    text = "<|im_start|>user\n47+38<|im_end|>\n<|im_start|>assistant\n7+8=15, write 5 carry 1; 4+3+1=8; \\boxed{85}"
    token_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    trainer.model.eval()  # vLLM runs this float32 checkpoint in bfloat16 on the CPU: log-probs differ by rounding
    rounding = (_prompt_logprobs(llm, token_ids) - _hf_logprobs(trainer.model, token_ids)).abs().mean()
    generator = torch.Generator().manual_seed(0)  # every parameter re-drawn: the log-probs move by whole nats
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.copy_(p + 0.5 * p.std() * torch.randn(p.shape, generator=generator))
    trainer.model.eval()
    expected = _hf_logprobs(trainer.model, token_ids)
    stale = (_prompt_logprobs(llm, token_ids) - expected).abs().mean()
    generation.sync_weights()
    synced = (_prompt_logprobs(llm, token_ids) - expected).abs().mean()
    generation.sync_weights()  # twice in a row (every optimizer step syncs): still the training model's weights
    synced_twice = (_prompt_logprobs(llm, token_ids) - expected).abs().mean()
    print(f"mean |vLLM - trainer| log-prob: same weights {rounding:.4f}, stale {stale:.4f}, synced {synced:.4f}")
    assert stale > 0.3, "the new weights hardly change the log-probs: the test is void"
    assert max(synced, synced_twice) < max(3 * rounding, 0.02), (rounding, synced, synced_twice)


CLIENT_STEP = """\
#!/usr/bin/env bash
# Stand-in for `accelerate launch`: generates through TRL's client, then "trains" until the test's Ctrl-C.
"$PYTHON" - "$STUB_PORT" "$STUB_MODEL" > "$STUB_RECORD" 2>&1 <<'PY'
import sys
from transformers import AutoTokenizer
from trl.generation.vllm_client import VLLMClient
tokenizer = AutoTokenizer.from_pretrained(sys.argv[2])
client = VLLMClient(base_url=f"http://127.0.0.1:{sys.argv[1]}", connection_timeout=30)
ids = tokenizer("<|im_start|>user\\n47+38<|im_end|>\\n<|im_start|>assistant\\n", add_special_tokens=False)["input_ids"]
out = client.generate(prompts=[ids], n=3, max_tokens=16, temperature=1.0)
print("GENERATED", len(out["completion_ids"]), [len(c) for c in out["completion_ids"]])
PY
exec "$PYTHON" - "$STUB_RECORD" "$STUB_MODE" <<'PY'
import sys, time
print("training started", file=open(sys.argv[1], "a"), flush=True)
time.sleep(300 * (sys.argv[2] == "sleep"))
sys.exit(1 if sys.argv[2] == "fail" else 0)
PY
"""


@pytest.mark.vllm
@pytest.mark.parametrize("mode, status", [("success", 0), ("fail", 1), ("sleep", 130)])
def test_launch_serves_the_builtin_model_on_cpu_and_tears_down(tiny_math_h64_model_path, tmp_path, mode, status):
    port = free_port()
    # The demo as a server-mode GPU recipe; transformers 5.19 names the checkpointing field the old way.
    text = (REPO / "recipes/demo/stapo.yaml").read_text().replace("use_cpu: true", "")
    text = text.replace("activation_checkpointing:", "gradient_checkpointing:")
    recipe, step, record = tmp_path / "server.yaml", tmp_path / "step", tmp_path / "record"
    recipe.write_text(f"# launch: accelerate_config=ddp num_processes=1 vllm_gpus=1\n{text}\nuse_vllm: true\n"
                      f"vllm_mode: server\nvllm_server_port: {port}\n")  # fmt: skip
    step.write_text(CLIENT_STEP)
    step.chmod(0o755)
    # The colocated engine of the trainer tests set these in this process: a launcher child must not inherit them.
    inherited = ("CUDA_VISIBLE_DEVICES", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in inherited} | dict(PYTHON=sys.executable,
        TRL_BIN=str(REPO / "scripts/vllm_cpu_serve.sh"), ACCELERATE_BIN=str(step), STUB_PORT=str(port),
        STUB_MODEL=tiny_math_h64_model_path, STUB_RECORD=str(record), STUB_MODE=mode, HEALTH_INTERVAL="1",
        HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")  # fmt: skip
    command = ["bash", str(REPO / "scripts/launch.sh"), str(recipe), "--gpus", "0,1", "--timeout", "400", "--log-dir",
               str(tmp_path), "--serve-args", "--gpu_memory_utilization 0.15 --enforce_eager true", "--",
               "--model_name_or_path", tiny_math_h64_model_path]  # fmt: skip

    def as_from_a_terminal():
        # SIGINT at its default and unblocked (pytest run in the background has it ignored, and a child inherits it)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    launcher = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True, preexec_fn=as_from_a_terminal)  # fmt: skip
    if mode == "sleep":  # Ctrl-C while training runs: SIGINT to the launcher's whole foreground group
        deadline = time.time() + 500
        while not (record.exists() and "training started" in record.read_text()) and time.time() < deadline:
            time.sleep(1)
        os.killpg(launcher.pid, signal.SIGINT)
    output, _ = launcher.communicate(timeout=600)
    print(output)
    assert launcher.returncode == status, output
    assert "GENERATED 3" in record.read_text(), record.read_text()
    assert "vLLM server is up after" in output
    server_pid = int(output.split("vLLM server started (pid ")[1].split(",")[0])
    for _ in range(40):  # the EXIT trap stops the server's whole process group (setsid)
        try:
            os.killpg(server_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.5)
    else:
        os.killpg(server_pid, signal.SIGKILL)
        pytest.fail(f"launch.sh left the vLLM server (process group {server_pid}) running after {mode}")


@pytest.mark.vllm
def test_paper_recipes_parse_on_the_vllm_environments_transformers():
    # transformers 5.19 (the vLLM environment's) reads the recipes' activation_checkpointing as gradient_checkpointing
    recipes = [f"recipes/{m}/{a}.yaml" for m in ("Qwen3-1.7B", "Qwen3-8B", "Qwen3-14B") for a in ("stapo", "grpo",
               "justrl", "entropy20")]  # fmt: skip
    demo = ["--config", STAPO_RECIPE, "--activation_checkpointing", "true"]
    for argv in [["--config", r] for r in recipes] + [demo]:
        assert parse_args([*argv, "--use_cpu", "true"])[1].gradient_checkpointing is True, argv
        assert argv[1] == STAPO_RECIPE or dry_run_recipe(argv, 8).ok, argv
