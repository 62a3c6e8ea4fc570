"""`stapo_trl.checks.prompt_length`: prompts longer than the model's positions minus the generation budget are
dropped with one warning line naming `max_prompt_tokens` (stapo-eval and stapo-train), or fail when none is left or
too few are left for one rollout step."""

import json
import logging
import types

import pytest
from testing_utils import STAPO_RECIPE, addition_rows, write_jsonl

from stapo_trl.checks.prompt_length import keep_short_prompts, model_max_positions, prompt_token_budget


def test_model_max_positions_sources():
    assert model_max_positions({"max_position_embeddings": 512}) == 512
    assert model_max_positions(types.SimpleNamespace(config=types.SimpleNamespace(n_positions=1024))) == 1024
    generator = types.SimpleNamespace(model=types.SimpleNamespace(config={"max_position_embeddings": 64}))
    assert model_max_positions(generator) == 64  # an HFGenerator
    vllm = types.SimpleNamespace(
        llm_engine=types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=96))
    )
    assert model_max_positions(types.SimpleNamespace(llm=vllm)) == 96  # a VLLMGenerator
    assert model_max_positions({"hidden_size": 64}) is None


def test_prompt_token_budget():
    assert prompt_token_budget(512, 256) == 256
    assert prompt_token_budget(512, 256, max_prompt_tokens=100) == 100
    assert prompt_token_budget(None, 256, max_prompt_tokens=100) == 100
    assert prompt_token_budget(None, 256) is None
    with pytest.raises(ValueError, match="max_new_tokens=512 leaves no room"):
        prompt_token_budget(512, 512)
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        prompt_token_budget(512, 10, max_prompt_tokens=0)


def test_keep_short_prompts_warns_once_and_fails_when_none_left(caplog):
    with caplog.at_level(logging.WARNING, logger="stapo_trl.checks.prompt_length"):
        assert keep_short_prompts([10, 724, 30, 256, 257], 256, what="math500 prompts") == [0, 2, 3]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "Dropped 2 of 5 math500 prompts longer than 256 tokens" in lines[0]
    assert "max_prompt_tokens" in lines[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="stapo_trl.checks.prompt_length"):
        assert keep_short_prompts([1, 2], 256) == [0, 1]
        assert keep_short_prompts([1000], None) == [0]
    assert not caplog.records  # nothing dropped: silent
    with pytest.raises(ValueError, match="All 2 prompts are longer than 8 tokens.*max_prompt_tokens"):
        keep_short_prompts([9, 700], 8, max_positions=512, max_new_tokens=504)


def test_eval_drops_prompts_over_the_models_positions(tiny_random_model_path, caplog):
    from transformers import AutoTokenizer

    from stapo_trl.evaluation.generation import DECODINGS, GeneratedSample, evaluate_problems
    from stapo_trl.evaluation.tasks import BenchmarkProblem

    tokenizer = AutoTokenizer.from_pretrained(tiny_random_model_path)
    problems = [
        BenchmarkProblem(id="short", problem="12+34", gold="46", benchmark="tiny"),
        BenchmarkProblem(id="long", problem="1+" * 300 + "1", gold="301", benchmark="tiny"),
        BenchmarkProblem(id="short2", problem="10+10", gold="20", benchmark="tiny"),
    ]
    seen = []

    def generate_fn(prompt_texts, *, n, **kwargs):
        seen.extend(prompt_texts)
        return [[GeneratedSample(r"\boxed{46}", 3, True)] * n for _ in prompt_texts]

    decoding = DECODINGS["t1.0-p1.0"]
    with caplog.at_level(logging.WARNING, logger="stapo_trl.checks.prompt_length"):
        table, records = evaluate_problems(
            generate_fn, tokenizer, problems, n=2, decoding=decoding, max_new_tokens=256, max_positions=512
        )
    assert len(seen) == 2 and {r["id"] for r in records} == {"short", "short2"}
    assert table["num_problems"] == 2 and table["avg@2"] == pytest.approx(0.5)
    assert any("Dropped 1 of 3 tiny prompts" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="All 1 tiny prompts are longer"):
        evaluate_problems(
            generate_fn, tokenizer, problems[1:2], n=1, decoding=decoding, max_new_tokens=256, max_positions=512
        )


def _rows(tmp_path, prompts):
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps({"problem": p, "answer": "1"}) + "\n" for p in prompts))
    return data


def test_train_drops_prompts_over_the_models_positions(tiny_math_model_path, tmp_path, caplog):
    from stapo_trl.cli.args import parse_args
    from stapo_trl.cli.run import prepare

    data = _rows(tmp_path, ["12+34", "1+" * 400 + "1", "5+6"])  # no max_prompt_tokens: the model's 512 positions
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--dataset_name", str(data)]
    # why: a 16-completion rollout step (2 prompts x 8), so that the 2 kept prompts fill one (fewer are refused)
    argv += ["--eval_before_after", "false", "--per_device_train_batch_size", "8", "--steps_per_generation", "2"]
    argv += ["--output_dir", str(tmp_path / "out")]  # prepare() takes the folder as its run's one writer
    with caplog.at_level(logging.WARNING, logger="stapo_trl.checks.prompt_length"):
        run = prepare(*parse_args(argv))
    assert len(run.train_dataset) == 2
    assert any("Dropped 1 of 3 training prompts" in r.getMessage() for r in caplog.records)
    data = _rows(tmp_path, ["1+" * 400 + "1"])
    argv[argv.index("--dataset_name") + 1] = str(data)
    with pytest.raises(ValueError, match="All 1 training prompts are longer"):
        prepare(*parse_args(argv))


def test_dry_run_counts_the_prompts_the_rule_will_drop(tiny_math_model_path, tmp_path):
    # The dry run said nothing of the prompts training would drop: it reports the count when the data and the model
    # are local (same rule as training).
    from stapo_trl.cli.dry_run import dry_run_recipe

    data = _rows(tmp_path, ["12+34", "1+" * 400 + "1", "5+6"])  # one prompt over the model's 512 positions
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--dataset_name", str(data)]
    argv += ["--eval_before_after", "false"]
    report = dry_run_recipe(argv, 1)
    rows = dict(report.lines)
    assert rows["prompt length"] == "1 of 3 training prompts exceed 464 tokens and will be dropped"  # 512 - 48
    data = _rows(tmp_path, ["1+" * 400 + "1"])
    argv[argv.index("--dataset_name") + 1] = str(data)
    report = dry_run_recipe(argv, 1)
    assert any("every training prompt exceeds 464 tokens" in e for e in report.errors), report.errors


def test_the_printed_dry_run_counts_the_prompts_the_rule_will_drop(tiny_math_model_path, tmp_path, capsys):
    # The kind of the bug the test above caught (a check that gates the count returned None, so the count was never
    # made): the printed plan of `stapo-train --dry_run` and of `python -m stapo_trl.cli.dry_run` carries the count.
    from stapo_trl.cli.dry_run import main as dry_run_main
    from stapo_trl.cli.train import main as train_main

    data = _rows(tmp_path, ["12+34", "1+" * 400 + "1", "5+6"])
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--dataset_name", str(data)]
    argv += ["--eval_before_after", "false", "--output_dir", str(tmp_path / "out")]
    dry_run_main(argv)  # exit status 2: 3 prompts cannot fill the recipe's rollout step (another row)
    assert "1 of 3 training prompts exceed 464 tokens and will be dropped" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        train_main([*argv, "--dry-run"])
    assert "1 of 3 training prompts exceed 464 tokens and will be dropped" in capsys.readouterr().out


def test_prompt_length_filter_leaving_too_few_prompts_fails_with_the_counts(tmp_path, tiny_math_model_path):
    from stapo_trl.cli.args import parse_args
    from stapo_trl.cli.run import prepare

    # 9 prompts, 8 of them far over a 64-token budget: 1 left after filtering, 8 needed.
    rows = addition_rows(1) + [{"problem": "1+" * 100 + "1", "answer": "101"}] * 8
    data = write_jsonl(tmp_path / "long.jsonl", rows)
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--dataset_name", data]
    argv += ["--eval_before_after", "false", "--max_prompt_tokens", "64", "--output_dir", str(tmp_path / "out")]
    with pytest.raises(ValueError, match=r"^1 prompt after filtering \(of 9; .*\); one rollout step needs 8 "):
        prepare(*parse_args(argv))
    # 8 short prompts pass (exactly one rollout step)
    data = write_jsonl(tmp_path / "enough.jsonl", addition_rows(8) + rows[1:])
    argv[argv.index("--dataset_name") + 1] = data
    assert len(prepare(*parse_args(argv)).train_dataset) == 8
