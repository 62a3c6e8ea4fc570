"""`stapo-eval`: input errors before the model loads, end to end and resumed, one accuracy per setting, `--compare`."""

import importlib.util
import json
import shutil
from functools import partial
from pathlib import Path

import pytest
from huggingface_hub import constants
from safetensors.torch import load_file, save_file
from testing_utils import REPO, error_line, fake_eval_results, write_jsonl
from transformers import AutoModelForCausalLM, AutoTokenizer

from stapo_trl.cli import eval as stapo_eval
from stapo_trl.cli.eval import main
from stapo_trl.cli.run import write_eval_record
from stapo_trl.evaluation.generation import DECODINGS, evaluate_problems, hf_generate
from stapo_trl.evaluation.results import load_results
from stapo_trl.evaluation.tasks import load_benchmark


ONE_PROBLEM = "--benchmarks tiny-math --backend hf --decoding greedy --limit 1 --samples 1 --max-new-tokens 8".split()
BAD_ARGUMENTS = [
    ("--model m --benchmarks aime24,aime26", "Unknown benchmark 'aime26'. Valid benchmarks: aime24, aime25"),
    ("--model m --decoding t0.5", "t0.7-p0.9, greedy, t<temperature>-p<top_p> (e.g. t0.6-p0.95)."),
    ("--benchmarks aime24", "--model is required"),
    # no argparse prefix matching: an abbreviation is an unknown flag, with the full one suggested
    ("--model m --sample 4", "unrecognized arguments: --sample 4; did you mean --samples"),
    # A relative path without "./" reads as a Hub id: offline, one line instead of transformers' traceback.
    ("--model outputs/no-such --benchmarks aime24", "'outputs/no-such' is not a local directory"),
    ("--model Qwen/No-Such-Model --benchmarks aime24", "not in the local Hugging Face cache"),
    # `--batch-size 0` reached `generate` and failed there with a traceback (status 1).
    ("--model MODEL --batch-size 0", "--batch-size must be >= 1, got 0"),
    ("--model MODEL --benchmarks aime24 --data-dir TMP --max-new-tokens 48", "No data file for benchmark 'aime24'"),
    ("--model MODEL --max-new-tokens 48 --output TMP", "--output TMP is a folder: give a file, e.g. "
     "TMP/stapo_eval.json."),
    ("--model MODEL --max-new-tokens 48 --output TMP/a-file/r.json", "--output TMP/a-file/r.json: TMP/a-file is a "
     "file"),
    # The paper's 20,480 new tokens (the default) or 600 on a 512-position model, from its config.json, or vLLM's cap.
    ("--model MODEL --max-new-tokens 600", "--max-new-tokens 600: max_new_tokens=600 leaves no room for a prompt: "
     "the model has 512 positions (prompt + completion); give a budget below 512."),
    ("--model MODEL --backend vllm --max-model-len 128 --max-new-tokens 200", "--max-new-tokens 200: "
     "max_new_tokens=200 leaves no room for a prompt: the model has 128 positions"),
    ("--model org/tiny --benchmarks tiny-math", "--max-new-tokens 20480: max_new_tokens=20480 leaves no room for a "
     "prompt: the model has 256 positions"),
]  # fmt: skip


@pytest.mark.parametrize("argv, expected", BAD_ARGUMENTS, ids=range(len(BAD_ARGUMENTS)))
def test_bad_arguments_are_one_line_before_anything_loads(argv, expected, tiny_random_model_path, tmp_path, capsys,
                                                          monkeypatch):  # fmt: skip
    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / ("0" * 40)  # a Hub model in the local cache
    (snapshot.parents[1] / "refs").mkdir(parents=True) or snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"model_type": "qwen3", "max_position_embeddings": 256}')
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    (tmp_path / "aime24").mkdir() or (tmp_path / "a-file").write_text("")
    argv = argv.replace("MODEL", tiny_random_model_path).replace("TMP", str(tmp_path)).split()
    monkeypatch.setattr(stapo_eval, "_load_generator", lambda *a, **k: pytest.fail("the model was loaded"))
    if "--data-dir" not in argv:  # a missing file is found when the benchmark loads; the rest before
        monkeypatch.setattr(stapo_eval.tasks, "load_benchmark", lambda *a, **k: pytest.fail("a benchmark was loaded"))
    output = [] if "--output" in argv else ["--output", str(tmp_path / "r.json")]
    with pytest.raises(SystemExit) as info:
        main(["--benchmarks", "tiny-math", *argv, *output])  # the last --benchmarks counts
    assert info.value.code == 2 and expected.replace("TMP", str(tmp_path)) in error_line(capsys, "stapo-eval")
    assert not (tmp_path / "r.json").exists()


def test_decodings_run_in_the_order_given():
    assert stapo_eval.parse_decoding_list("t0.7-p0.9,greedy") == ["t0.7-p0.9", "greedy"]
    assert DECODINGS["greedy"].temperature == 0


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_a_missing_vllm_is_one_line_naming_its_install(tiny_random_model_path, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--model", tiny_random_model_path, "--backend", "vllm", *ONE_PROBLEM[:2], "--max-new-tokens", "8",
              "--output", str(tmp_path / "r.json")])  # fmt: skip
    assert "pip install 'stapo_trl[vllm]'" in error_line(capsys, "stapo-eval")


def test_e2e_results_file_resumed(tiny_math_model_path, shared_data_dir, tmp_path, monkeypatch, capsys):
    argv = [
        "--model", tiny_math_model_path, "--backend", "hf", "--decoding", "paper", "--data-dir", str(shared_data_dir),
        "--benchmarks", "amc23,math500",  # their first problems fit the tiny model's 512 positions
        "--limit", "2", "--samples", "2", "--max-new-tokens", "48", "--output", str(output := tmp_path / "r.json"),
    ]  # fmt: skip
    assert main(argv) == 0
    data = load_results(output)
    assert list(data["results"]) == ["t1.0-p1.0", "t0.7-p0.9"]  # --decoding paper: the paper's two, in order
    for bench, table in [(b, t) for tables in data["results"].values() for b, t in tables.items()]:
        assert 0.0 <= table["avg@2"] <= 1.0 and set(table["pass@k"]) == {"1", "2"} and table["num_grader_errors"] >= 0
        assert table["num_problems"] == table["n_samples"] == 2, table
        assert table["data_source"].endswith(f"{bench}/test.jsonl"), table
    assert len(data["samples"]) == 16  # 2 decodings x 2 benchmarks x 2 problems x 2 samples
    assert {"benchmark", "decoding", "id", "sample", "extracted", "correct", "grader_error"} <= set(data["samples"][0])
    assert data["decodings"]["t0.7-p0.9"] == {"temperature": 0.7, "top_p": 0.9, "top_k": None}
    assert (data["model"]["source"], data["model"]["revision"]) == ("local", str(Path(tiny_math_model_path).resolve()))
    assert data["versions"]["transformers"] and data["versions"]["math-verify"]
    assert data["summary"]["t1.0-p1.0"]["benchmarks"] == ["amc23", "math500"]
    # Resumed: the finished pairs skipped, other settings refused.
    before = output.read_text()
    monkeypatch.setattr(stapo_eval, "_load_generator", lambda *a, **k: pytest.fail("regenerated a finished pair"))
    assert main(argv) == 0 and output.read_text() == before  # nothing rewritten
    out = capsys.readouterr().out
    assert "| Model | AMC23 | MATH-500 | Avg |" in out and "/t0.7-p0.9 |" in out
    argv[argv.index("--max-new-tokens") + 1] = "64"
    with pytest.raises(SystemExit):
        main(argv)
    line = error_line(capsys, "stapo-eval")
    assert "--max-new-tokens 48 in the file, 64 now" in line and "another --output" in line


def test_stapo_eval_samples_what_the_training_evaluation_samples(tiny_math_model_path, tmp_path):
    # the loop below is stapo_trl.cli.run.evaluate_trainer_model's call (stapo-eval's batch size does not matter)
    argv = f"--model {tiny_math_model_path} --benchmarks tiny-math --backend hf --limit 3 --decoding t1.0-p1.0"
    argv += " --samples 2 --max-new-tokens 48 --seed 3 --save-completions --batch-size 1 --output"
    assert main([*argv.split(), str(tmp_path / "r.json")]) == 0
    model, tokenizer = (auto.from_pretrained(tiny_math_model_path) for auto in (AutoModelForCausalLM, AutoTokenizer))
    _, records = evaluate_problems(
        partial(hf_generate, model, tokenizer, batch_size=8), tokenizer, load_benchmark("tiny-math", limit=3), n=2,
        decoding=DECODINGS["t1.0-p1.0"], max_new_tokens=48, seed=3, save_completions=True,
    )  # fmt: skip
    evaluated = [r["completion"] for r in load_results(tmp_path / "r.json")["samples"]]
    assert evaluated == [r["completion"] for r in records] and len(set(evaluated)) > 3  # sampled


def test_an_evaluation_that_drops_long_prompts_records_and_shows_it(tiny_random_model_path, tmp_path, capsys):
    # 5 of 8 AIME problems too long for the tiny model's 512 positions: dropped with a warning, and the table says so.
    rows = [{"problem": "1+1" if i < 3 else "1+1 " * 400, "answer": "2"} for i in range(8)]
    write_jsonl(
        (tmp_path / "data" / "aime24").mkdir(parents=True) or tmp_path / "data" / "aime24" / "test.jsonl", rows
    )
    argv = f"--model {tiny_random_model_path} --benchmarks aime24 --backend hf --decoding greedy --samples 2"
    argv += f" --max-new-tokens 8 --data-dir {tmp_path / 'data'} --output {tmp_path / 'r.json'}"
    assert main(argv.split()) == 0
    table = load_results(tmp_path / "r.json")["results"]["greedy"]["aime24"]
    assert (table["num_problems"], table["num_problems_loaded"]) == (3, 8) and "(3/8)" in capsys.readouterr().out


def test_compare_a_file_of_the_old_seeding_and_stapo_trains_eval_json(tiny_math_model_path, tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for path, value in ((a, 0.2), (b, 0.3)):
        path.write_text(json.dumps(fake_eval_results(path.stem, {"aime24": value}) | {"format_version": 1}))
    assert main(["--compare", str(a), str(b)]) == 0 and "+50.0%" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:  # format_version 1: not resumed
        main(["--model", tiny_math_model_path, *ONE_PROBLEM, "--output", str(a)])
    assert info.value.code == 2 and error_line(capsys, "stapo-eval") == (
        f"stapo-eval: error: {a} holds results of the old seeding (a seed per benchmark and decoding, now one "
        "per sample, as in stapo-train's evaluation), so it cannot be resumed: choose another --output, or delete it "
        "to rerun."
    )
    a.write_text("not json")
    with pytest.raises(SystemExit):
        main(["--compare", str(a), str(b)])
    assert "a.json is not a stapo-eval results file: not JSON" in error_line(capsys, "stapo-eval")
    # stapo-train's eval.json: a rerun writes eval-step{N}.json beside it, as the docs say
    record = {"metric": "avg@4", "accuracy_before": 0.4, "accuracy_after": 0.6}
    names = [Path(write_eval_record(record, str(tmp_path), 500)).name for _ in range(3)]
    assert names == ["eval.json", "eval-step500.json", "eval-step500-2.json"]  # an identical rerun too
    assert json.loads((tmp_path / "eval.json").read_text()) == record  # never replaced
    docs = [" ".join(path.read_text().split()) for path in [REPO / "README.md", *(REPO / "docs").glob("*.md")]]
    assert any("eval-step{N}.json" in text for text in docs)
    assert not any("with other settings writes `eval-step{N}.json`" in text for text in docs)


def test_default_results_go_beside_a_local_model_or_under_outputs_and_other_weights_refuse_them(
    tiny_math_model_path, tmp_path, monkeypatch, capsys
):
    model = tmp_path / "runs" / "demo-stapo"  # a copy: the session's model folder is shared by other tests
    shutil.copytree(tiny_math_model_path, model)
    monkeypatch.chdir((tmp_path / "work").mkdir() or tmp_path / "work")
    assert main(["--model", str(model), *ONE_PROBLEM]) == 0
    assert load_results(model / "stapo_eval.json")["results"]["greedy"]["tiny-math"]["num_problems"] == 1
    assert list((tmp_path / "work").iterdir()) == []  # nothing in the current folder (was stapo_eval_demo-stapo.json)
    lines = capsys.readouterr().out.splitlines()
    assert f"Results file: {model / 'stapo_eval.json'} (the default; --output to choose another)" in lines
    assert lines[-1] == f"Results file: {model / 'stapo_eval.json'}"
    # builtin:tiny-math resolves to the session's copy; its folder is a shared cache, not the results' place.
    monkeypatch.setenv("STAPO_TRL_CACHE", str(Path(tiny_math_model_path).parent))
    assert main(["--model", "builtin:tiny-math", *ONE_PROBLEM]) == 0
    data = load_results(results := Path("outputs") / "stapo-eval" / "builtin-tiny-math.json")
    table, out = data["results"]["greedy"]["tiny-math"], capsys.readouterr().out
    assert data["model"]["name_or_path"] == "builtin:tiny-math" and table["pass@k"]["1"] == table["avg@1"]
    assert f"| builtin:tiny-math/greedy | {100 * table['avg@1']:.1f} |" in out, out
    assert out.splitlines()[-1] == f"Results file: {results}"
    # Two organisations' models of the same name no longer share stapo_eval_Qwen3-1.7B-Base.json in the current folder.
    for name, revision, file in (("Qwen/Qwen3-1.7B-Base", None, "Qwen--Qwen3-1.7B-Base"), ("me/Q", "v2", "me--Q@v2")):
        assert stapo_eval.default_output(name, revision) == Path(f"outputs/stapo-eval/{file}.json")
    # Training on replaces the weights: the file's numbers are of the old ones (they were printed as the new ones).
    tensors = {name: tensor + 1 for name, tensor in load_file(model / "model.safetensors").items()}
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(SystemExit) as info:
        main(["--model", str(model), *ONE_PROBLEM])
    assert info.value.code == 2 and error_line(capsys, "stapo-eval") == (
        f"stapo-eval: error: {model / 'stapo_eval.json'} holds results of other weights (model.safetensors changed "
        "since), so it cannot be resumed: choose another --output, or delete it to rerun."
    )
