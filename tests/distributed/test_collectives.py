"""S2T's collectives on two CPU ranks: metrics, token records, tau_h per update, a never-firing mask = off."""

import json
import textwrap

import numpy as np
import pytest
from testing_utils import run_torchrun

from stapo_trl.run_folder.logs import read_token_records


pytestmark = pytest.mark.slow

WORKER = textwrap.dedent(
    r"""
    import json, os, sys, warnings
    from datasets import Dataset
    from stapo_trl import STAPOConfig, STAPOTrainer
    from stapo_trl.run_folder.logs import SpuriousTokenLogger

    def length_reward(completions, **kwargs):
        return [float(len(c[0]["content"] if isinstance(c, list) else c) % 4) for c in completions]
    prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}+{i % 7}"}]} for i in range(64)])
    model_path, out = sys.argv[1], sys.argv[2]
    result = {}
    # The paper's geometry: one rollout batch feeds 4 optimizer updates of GA 2 micro-batches each.
    paper = dict(gradient_accumulation_steps=2, steps_per_generation=8, learning_rate=1e-2)
    for name, s2t in [("off", {"s2t_mode": "off", **paper}), ("never", {"s2t_prob_threshold": 1e-30, **paper}),
                      ("stapo", {"s2t_prob_threshold": 0.05, **paper}),
                      ("records", {"s2t_prob_threshold": 0.05, "steps_per_generation": 2})]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args = STAPOConfig(output_dir=os.path.join(out, name), use_cpu=True, bf16=False, report_to=[], seed=0,
                               logging_steps=1, per_device_train_batch_size=4, num_generations=4, max_steps=4,
                               max_completion_length=8, save_strategy="no", **s2t)
            trainer = STAPOTrainer(model_path, reward_funcs=length_reward, args=args, train_dataset=prompts)
        if name == "records":
            trainer.add_callback(SpuriousTokenLogger(trainer, max_silenced=1000, max_kept_candidates=1000,
                                                     max_reference=0))
        updates = []
        original = trainer._compute_s2t_mask

        def record(logps, entropies, advantages, loss_mask, completion_ids, original=original, updates=updates):
            built = original(logps, entropies, advantages, loss_mask, completion_ids)
            updates.append({"tau": built.entropy_threshold if built.num_candidates else None,
                            "local": entropies[built.candidate].double().tolist(),
                            "silenced": int(built.silenced.sum())})
            return built

        trainer._compute_s2t_mask = record
        trainer.train()
        rows = [{k: v for k, v in h.items() if isinstance(v, float)} for h in trainer.state.log_history if "loss" in h]
        params = [float(p.double().sum()) for p in trainer.model.parameters()]
        result[name] = {"rows": rows, "params": params, "updates": updates}
    with open(os.path.join(out, f"rank{trainer.accelerator.process_index}.json"), "w") as f:
        f.write(json.dumps(result))
    for i in range(400):  # report(): one write per line (print's "label:label: [] []" came split)
        report(f"rank {os.environ['RANK']} line {i}:", [], "end")
    trainer.end()
    """
)


def test_s2t_collectives_and_worker_lines_on_two_ranks(tiny_random_model_path, tmp_path):
    lines = run_torchrun(WORKER, tmp_path / "run.py", tiny_random_model_path, str(tmp_path), nproc=2).splitlines()
    for rank in (0, 1):  # ranks reporting at once give whole lines (in-process: tests/cli/test_errors.py)
        missing = [i for i in range(400) if lines.count(f"rank {rank} line {i}: [] end") != 1]
        assert not missing, (rank, missing[:10])
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    # Records (GA 1, one mask per step): reduced metrics the same on both ranks; each silenced token logged once.
    rows = [[{k: v for k, v in r.items() if k.startswith("s2t/")} for r in seen["records"]["rows"]] for seen in ranks]
    assert rows[0] == rows[1] and len(rows[0]) == 4
    records = read_token_records(tmp_path / "records")
    for entry, step in zip(rows[0], [1, 2, 3, 4], strict=True):
        assert len([r for r in records if r["step"] == step and r["silenced"]]) == entry["s2t/num_silenced"]
    assert {r["process_index"] for r in records} == {0, 1}
    assert {r["step"] for r in records} <= {1, 2, 3, 4} and sum(e["s2t/num_silenced"] for e in rows[0]) > 0
    # The baseline and its never-firing twin: the same losses, gradient norms, TRL metrics and weights, step by step.
    for seen in ranks:
        off, never = seen["off"], seen["never"]
        assert len(off["rows"]) == len(never["rows"]) == 4
        for row_off, row_never in zip(off["rows"], never["rows"], strict=True):
            keep = ("s2t/num_loss_tokens", "s2t/num_silenced")
            shared = {k for k in row_off if not k.startswith("s2t/") or k in keep} - {"step_time", "epoch"}
            assert {"loss", "grad_norm", "entropy", "clip_ratio/region_mean"} <= shared
            for key in shared:  # every TRL metric of the row (reward only on rows that generated)
                assert row_never[key] == pytest.approx(row_off[key], rel=1e-5, abs=1e-7), key
            assert row_never["s2t/num_silenced"] == row_off["s2t/num_silenced"] == 0
        assert never["params"] == pytest.approx(off["params"], rel=1e-6, abs=1e-6)
    # STAPO: tau_h per update = the 0.75-quantile (numpy's) of both ranks' candidates, identical on both ranks.
    stapo = [seen["stapo"]["updates"] for seen in ranks]
    assert len(stapo[0]) == len(stapo[1]) == 4
    assert sum(update["silenced"] for rank in stapo for update in rank) > 0
    for update_0, update_1 in zip(*stapo, strict=True):
        union = update_0["local"] + update_1["local"]
        assert update_0["tau"] == update_1["tau"]
        if union:
            assert update_0["tau"] == pytest.approx(float(np.quantile(np.array(union), 0.75)), abs=1e-12)
