"""Two ranks: after an input error (status 2), `trainer.end()` and `stapo-train`, no process group, no gloo thread."""

import sys
import textwrap

import pytest
from testing_utils import SMALL_TWO_RANK_DEMO, STAPO_RECIPE, accelerate_launch, run_torchrun


pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]
# `stapo-train ARGV` or one step of `which` trainer; after `trainer.end()` nothing holds the group, the model generates
WORKER = textwrap.dedent(
    r"""
    import gc, os, sys, types
    import torch
    import torch.distributed as dist
    from datasets import Dataset
    from stapo_trl import STAPOConfig, STAPOTrainer
    from stapo_trl.cli.train import main
    from stapo_trl.trainer.trainers import GRPOBaselineTrainer

    def gloo_threads():
        names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
        return sorted(n for n in names if "gloo" in n)
    which, *argv = sys.argv[1:]
    if which == "stapo-train":
        try:
            main(argv)
        except SystemExit as e:
            report(f"exit {e.code}; group: {dist.is_initialized()}; gloo threads left: {gloo_threads()}")
            raise
        report("gloo threads after the end:", gloo_threads())
        sys.exit()
    model_path, out = argv
    args = STAPOConfig(output_dir=out, use_cpu=True, bf16=False, report_to="none", max_completion_length=8,
                       per_device_train_batch_size=4, num_generations=4, max_steps=1, save_strategy="no",
                       beta=0.04 if which == "grpo" else 0.0)  # with beta, GRPOTrainer prepares a reference model
    trainer_class = GRPOBaselineTrainer if which == "grpo" else STAPOTrainer
    trainer = trainer_class(model=model_path, reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
                            args=args, train_dataset=Dataset.from_dict({"prompt": ["1+1="] * 16}))
    trainer.train()
    report("wrapper during training:", type(trainer.model_wrapped).__name__)
    group = dist.distributed_c10d._get_default_group()
    holders = [f"{f.__module__}.{f.__qualname__}" for f in gc.get_objects() if isinstance(f, types.FunctionType)
               and any(d is group for d in (f.__defaults__ or ()) + tuple((f.__kwdefaults__ or {}).values()))]
    report("functions holding the group in a default:", holders)
    assert gloo_threads(), "no gloo threads while the group exists: the check below would prove nothing"
    del group
    trainer.end()
    report("gloo threads after the end:", gloo_threads())
    ids = trainer.processing_class("1+1=", return_tensors="pt").input_ids
    with torch.no_grad():
        new = trainer.model.generate(ids, max_new_tokens=2, do_sample=False).shape[1] - ids.shape[1]
    report("generated after end:", new)
    """
)


@pytest.mark.parametrize("argv, message", [
    (["--s2t_entropy_quantile", "1.5"], "--s2t_entropy_quantile: s2t_entropy_quantile=1.5 must be in [0, 1]"),
    (["--reward_funcs", "math_acuracy"], "Unknown reward 'math_acuracy'."),
    (["--dataset_name", "/nonexistent/train.jsonl"], "Dataset file '/nonexistent/train.jsonl' does not exist."),
], ids=["range", "reward", "data"])  # fmt: skip
def test_an_input_error_under_accelerate_ends_each_rank_with_status_2_and_no_process_group(tmp_path, argv, message):
    argv = ["stapo-train", "--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), *argv]
    output = run_torchrun(WORKER, tmp_path / "w.py", *argv, nproc=2, launch=accelerate_launch, status=1)
    assert output.count("exit 2; group: False; gloo threads left: []") == 2, output[-3000:]
    assert "exitcode  : 2 (pid:" in output and "exitcode  : 1 (pid:" not in output, output[-3000:]
    assert any(line.startswith(f"stapo-train: error: {message}") for line in output.splitlines()), output[-3000:]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("which", ["stapo", "grpo", "stapo-train"])
def test_the_end_of_two_rank_training_releases_gloo(tiny_random_model_path, tiny_math_model_path, tmp_path, which):
    out = tmp_path / "run"
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--output_dir", str(out)]
    argv = [*argv, *SMALL_TWO_RANK_DEMO] if which == "stapo-train" else [tiny_random_model_path, str(tmp_path)]
    output = run_torchrun(WORKER, tmp_path / "w.py", which, *argv, nproc=2)
    assert output.count("gloo threads after the end: []") == 2, output[-3000:]
    if which == "stapo-train":
        assert (out / "model.safetensors").exists()
    else:
        assert "wrapper during training: DistributedDataParallel" in output, output[-3000:]
        holders = output.count("functions holding the group in a default: []")
        assert holders == output.count("generated after end: 2") == 2, output[-3000:]
