import json
import math
import sys
import types

import pytest
import torch
from testing_utils import PROMPTS, text_reward, tiny_stapo_config
from testing_utils import hand_diagnostics_batch as hand_batch
from torch.overrides import TorchFunctionMode

from stapo_trl import STAPOTrainer
from stapo_trl.core.s2t import S2TSettings, s2t_mask
from stapo_trl.diagnostics.token_records import spurious_token_records
from stapo_trl.run_folder.logs import SPURIOUS_TOKENS_FILENAME, SpuriousTokenLogger, read_metrics, read_token_records


VOCAB = ["<pad>", "1", "+", "2", "=", "3", "<eos>"]
ALL = dict(prob_threshold=0.01, max_silenced=10, max_kept_candidates=10, max_reference=10)


class CharTokenizer:
    batch_calls = 0

    def batch_decode(self, sequences, skip_special_tokens=False):
        self.batch_calls += 1
        return ["".join(VOCAB[i] for i in ids) for ids in sequences]


class HostTransfers(TorchFunctionMode):  # counts the calls that bring values to the host (a device sync each)
    count, host = 0, {"item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__"}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name, kwargs = getattr(func, "__name__", ""), kwargs or {}
        self.count += name in self.host or name == "to" and "cpu" in map(str, (*args[1:], kwargs.get("device")))
        return func(*args, **kwargs)


def test_records_of_the_hand_batch_a_capped_sample_in_order_one_transfer_and_the_logger_writing_each_mask_once(
        tmp_path, monkeypatch):  # fmt: skip  # capped, tabled, one transfer per logging step, a uniform sample
    records = spurious_token_records(*hand_batch(), CharTokenizer(), step=7, context_tokens=2, **ALL)
    assert [(r["kind"], r["token"], r["position"], r["context"], r["candidate"]) for r in records] == [
        ("silenced", "+", 1, "1⟦+⟧2=", True), ("kept_candidate", "2", 2, "1+⟦2⟧=3", True),
        ("kept_candidate", "3", 4, "2=⟦3⟧", True), ("reference", "1", 0, "⟦1⟧+2", False),
        ("reference", "=", 3, "+2⟦=⟧3", False),
    ]  # fmt: skip  # context: up to 2 completion tokens each side, never past the last loss token
    assert [r["silenced"] for r in records] == [True, False, False, False, False]
    r, keys = records[0], "prob logprob entropy advantage entropy_threshold prob_threshold step token_id"
    assert [r[k] for k in keys.split()] == pytest.approx([0.001, math.log(0.001), 0.2, 1, 0.5, 0.01, 7, 2])
    assert r["completion_index"] == r["process_index"] == 0
    assert json.loads(json.dumps(records)) == records  # JSON-serialisable as is
    records = spurious_token_records(*hand_batch(prob_threshold=1e-6), CharTokenizer(), step=1)  # no candidate
    assert [r["kind"] for r in records] == ["reference"] * 5 and {r["entropy_threshold"] for r in records} == {None}
    result, logps, entropies, advantages, loss_mask, ids = hand_batch()
    none = s2t_mask(logps, entropies, negative := -advantages.abs(), loss_mask, prob_threshold=0.01)  # no A > 0
    assert spurious_token_records(none, logps, entropies, negative, loss_mask, ids, CharTokenizer(), step=1) == []
    for name, position, value in [("logps", 0, math.nan), ("entropies", 3, math.inf), ("logps", 3, -math.inf)]:
        tensors = {"logps": logps.clone(), "entropies": entropies.clone()}
        tensors[name][0, position] = value
        records = spurious_token_records(result, tensors["logps"], tensors["entropies"], advantages, loss_mask, ids,
                                         CharTokenizer(), step=0, **ALL)  # fmt: skip
        assert len(records) == 4 and position not in [r["position"] for r in records]  # a non-finite one: never
        json.dumps(records, allow_nan=False)
    batch = all_candidates_batch(12, n=5)  # 60 candidates, 30 silenced: no reference
    caps = {"max_silenced": 4, "max_kept_candidates": 3, "max_reference": 2}
    first = spurious_token_records(*batch, CharTokenizer(), step=3, **caps)
    assert [r["kind"] for r in first] == ["silenced"] * 4 + ["kept_candidate"] * 3
    for kind in ("silenced", "kept_candidate"):
        where = [(r["completion_index"], r["position"]) for r in first if r["kind"] == kind]
        assert where == sorted(where) and all(batch[0].silenced[i, j] == (kind == "silenced") for i, j in where)
    assert first == spurious_token_records(*batch, CharTokenizer(), step=3, **caps)  # the same sample when rerun
    drawn = [spurious_token_records(*batch, CharTokenizer(), step=step, **caps)[:4] for step in range(10)]
    assert len({(r["completion_index"], r["position"]) for records in drawn for r in records}) > 4  # step seeds
    assert spurious_token_records(*batch, CharTokenizer(), step=3, **dict.fromkeys(caps, 0)) == []
    tokenizer, batch = CharTokenizer(), all_candidates_batch(128, prob_threshold=0.35)
    with HostTransfers() as transfers:
        records = spurious_token_records(*batch, tokenizer, step=1, context_tokens=3)
    assert len(records) == 384 and transfers.count == 1 and tokenizer.batch_calls == 1
    args = types.SimpleNamespace(output_dir=str(tmp_path), seed=0, report_to=[])  # the trainer's as the callback's
    trainer = types.SimpleNamespace(processing_class=CharTokenizer(), state=types.SimpleNamespace(global_step=0),
        args=args, s2t=S2TSettings(prob_threshold=0.01),
        accelerator=types.SimpleNamespace(num_processes=1, process_index=0, is_main_process=True))  # fmt: skip
    state = types.SimpleNamespace(is_world_process_zero=True, global_step=0)
    log, no_log = types.SimpleNamespace(should_log=True), types.SimpleNamespace(should_log=False)
    logger = SpuriousTokenLogger(trainer, context_tokens=2)
    logger.on_train_begin(args, state, None)
    logger.on_step_end(args, state, log)  # no mask yet: nothing written
    for step, control in ((1, no_log), (2, log), (3, log)):  # update 1's and 2's masks, at global steps 0 and 1
        if step < 3:
            logger.record(*hand_batch())
        state.global_step = trainer.state.global_step = step
        logger.on_step_end(args, state, control)  # step 2 writes both masks, 5 records each; step 3 nothing new
    logger.record(*hand_batch())  # after the last logging step: written at the end of training
    state.global_step = 4
    logger.on_train_end(args, state, None)
    records = read_token_records(tmp_path)
    assert [r["step"] for r in records] == [2] * 10 + [4] * 5
    assert [r["kind"] for r in records[:5]] == ["silenced"] + ["kept_candidate"] * 2 + ["reference"] * 2
    assert logger.silenced_counts == {"+": 3} and logger.kept_candidate_counts == {"2": 3, "3": 3}
    lines = (tmp_path / SPURIOUS_TOKENS_FILENAME).read_text().splitlines()
    assert len(set(lines)) == len(lines) == 15 and [r["update"] for r in records[:10]] == [1] * 5 + [2] * 5
    batch = all_candidates_batch(64)  # the mask's own transfers are not the records'
    for masks in (1, 6):
        logger = SpuriousTokenLogger(trainer, path=str(tmp_path / f"tokens-{masks}.jsonl"))
        with HostTransfers() as at_masks:
            for trainer.state.global_step in range(masks):  # one mask per update
                logger.record(*batch)
        with HostTransfers() as at_logging_step:
            written = logger.write_pending(args, step=6)
        logger.close()
        assert at_masks.count == 0 and at_logging_step.count == 1
        assert [sum(r["kind"] == kind for r in written) for kind in ("silenced", "kept_candidate")] == [256, 64]
        assert {r["update"] for r in written} == set(range(1, masks + 1))  # a sample of every mask's tokens
    counts = torch.zeros(4)  # 4 masks of 12 silenced tokens, a cap of 12: ~3 each
    for seed in range(50):
        trainer.args.seed = seed
        logger = SpuriousTokenLogger(trainer, max_silenced=12, max_kept_candidates=0, max_reference=0)
        for trainer.state.global_step in range(4):
            logger.record(*all_candidates_batch(2))
        records = logger.write_pending(args, 4)
        logger.close()
        assert len(records) == 12
        counts += torch.bincount(torch.tensor([r["update"] - 1 for r in records]), minlength=4)
    assert (counts / 50 - 3).abs().max() < 0.6  # the standard error of each mean is ~0.2
    # 3 masks of one logging step, each with one silenced token and two kept candidates: capped to 2 and 1
    logged, table = [], lambda dataframe: types.SimpleNamespace(dataframe=dataframe)  # wandb (the tracker) stood in
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(run=object(), Table=table, log=logged.append))
    logger = SpuriousTokenLogger(trainer, max_silenced=2, max_kept_candidates=1, max_reference=0)
    for trainer.state.global_step in range(3):
        logger.record(*hand_batch())
    assert logger._pending.shape[:2] == (3, 2)  # per kind, at most the largest cap waits for the logging step
    (tmp_path / "caps").mkdir()
    args.output_dir, args.report_to = str(tmp_path / "caps"), ["wandb"]
    written = logger.write_pending(args, step=5)
    logger.close()
    assert sorted(r["kind"] for r in written) == ["kept_candidate", "silenced", "silenced"]
    assert all(r["step"] == 5 for r in written) and {r["update"] for r in written} <= {1, 2, 3}
    assert read_token_records(tmp_path / "caps") == written and logger._pending is None
    (entry,) = logged
    assert entry["s2t/top_silenced_tokens"].dataframe.to_dict("list") == {
        "token": ["+"], "silenced": [2], "kept_candidate_sampled": [0]}  # fmt: skip


def all_candidates_batch(rows: int, n: int = 12, prob_threshold: float = 1.0):  # n tokens, p in [0.1, 0.6], q = 0.5
    g, advantages, loss_mask = torch.Generator().manual_seed(rows), torch.ones(rows), torch.ones(rows, n)
    entropies, logps = torch.rand(rows, n, generator=g), torch.log(torch.rand(rows, n, generator=g) / 2 + 0.1)
    ids = torch.randint(1, len(VOCAB), (rows, n), generator=g)
    result = s2t_mask(logps, entropies, advantages, loss_mask, prob_threshold=prob_threshold, entropy_quantile=0.5)
    return result, logps, entropies, advantages, loss_mask, ids


@pytest.mark.filterwarnings("ignore")
def test_a_real_run_records_every_silenced_token_of_its_metrics(tiny_random_model_path, tmp_path):
    # max_steps not a multiple of logging_steps: the last row's silenced tokens are recorded too; with two iterations
    # each mask is built again (the same tokens): its records name their update, so no line is a duplicate.
    args = tiny_stapo_config(tmp_path / "run", seed=0, max_steps=3, logging_steps=2, num_iterations=2,
                             s2t_prob_threshold=0.05)  # fmt: skip
    trainer = STAPOTrainer(tiny_random_model_path, reward_funcs=text_reward, args=args, train_dataset=PROMPTS)
    trainer.add_callback(SpuriousTokenLogger(trainer, max_silenced=100_000))  # replaces the built-in one
    trainer.train()
    rows = [row for row in read_metrics(str(tmp_path / "run")) if "s2t/num_silenced" in row]
    silenced = round(sum(row["s2t/num_silenced"] for row in rows))
    assert rows[-1]["step"] == 3 and silenced > 0
    records = read_token_records(tmp_path / "run" / SPURIOUS_TOKENS_FILENAME)
    assert sum(r["kind"] == "silenced" for r in records) == silenced and max(r["step"] for r in records) == 3
    assert all(r["silenced"] == (r["kind"] == "silenced") and "⟦" in r["context"] and r["advantage"] > 0 and
               r["candidate"] == (r["prob"] < 0.05) for r in records)  # fmt: skip
    lines = (tmp_path / "run" / SPURIOUS_TOKENS_FILENAME).read_text().splitlines()
    assert len(set(lines)) == len(lines)
