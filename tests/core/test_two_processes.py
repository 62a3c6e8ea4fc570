"""tau_h over both ranks' candidates: tests/distributed/test_collectives.py."""

import json
import textwrap

import pytest
from testing_utils import run_torchrun


WORKER = textwrap.dedent(
    r"""
    import json, sys
    import torch
    from datasets import Dataset
    from stapo_trl.core import STAPOConfig, STAPOTrainer
    from stapo_trl.integrations.process_group import import_group_capturing_modules

    import_group_capturing_modules()  # before the config creates the group: TRL imports DeepSpeed's comm module later
    model_path, out_dir = sys.argv[1], sys.argv[2]
    args = STAPOConfig(output_dir=out_dir, use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=2,
                       num_generations=2, gradient_accumulation_steps=2, steps_per_generation=4, num_iterations=2,
                       max_completion_length=8, s2t_entropy_quantile=0.5)
    trainer = STAPOTrainer(model_path, reward_funcs=lambda completions, **kwargs: [0.0] * len(completions), args=args,
                           train_dataset=Dataset.from_dict({"prompt": ["1+1="] * 16}))
    rank, world = trainer.accelerator.process_index, trainer.accelerator.num_processes
    seen = {"D": trainer._gather(torch.tensor([1.0, 2.0, 3.0]) if rank == 0 else torch.tensor([])).tolist(),
            "empty": trainer._gather(torch.tensor([], dtype=torch.float64)).tolist(), "E": []}
    # 2 updates of GA 2 micro-batches, rank-dependent token counts, no candidates (A <= 0)
    trainer.model.train()
    ones = torch.ones(2, 4, dtype=torch.long)
    trainer._buffered_inputs = [
        {"prompt_ids": ones[:, :2], "prompt_mask": ones[:, :2], "completion_ids": ones, "advantages": torch.zeros(2),
         "completion_mask": (torch.arange(8) < k).long().view(2, 4), "old_per_token_logps": torch.zeros(2, 4),
         "s2t_entropies": torch.ones(2, 4)} for k in ([3, 5, 2, 4] if rank == 0 else [1, 1, 1, 1])
    ]
    for step in range(4, 8):  # the second pass over a rollout batch (num_iterations 2): no generation
        trainer._step = step
        seen["E"].append(float(trainer._prepare_inputs(None)["num_items_in_batch"]))
    json.dump(seen, open(f"{out_dir}/rank{rank}.json", "w"))
    torch.distributed.destroy_process_group()  # gloo's threads left running could abort the exit (SIGABRT)
    report(f"rank {rank} of {world} done")
    """
)


@pytest.mark.slow  # two new processes under torchrun: ~20 s
def test_s2t_gather_and_normalizer_on_two_ranks(tiny_random_model_path, tmp_path):
    output = run_torchrun(WORKER, tmp_path / "worker.py", tiny_random_model_path, str(tmp_path), nproc=2)
    assert "rank 0 of 2 done" in output and "rank 1 of 2 done" in output, output[-3000:]
    for seen in [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]:
        # kept 3 + 5 + 1 + 1 = 10, then 2 + 4 + 1 + 1 = 8; num_items = count x steps_per_generation / GA
        assert (seen["D"], seen["empty"], seen["E"]) == ([1.0, 2.0, 3.0], [], [20.0, 20.0, 16.0, 16.0])
