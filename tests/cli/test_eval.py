"""`stapo-eval` (`stapo_trl.cli.eval`): argument validation before any model is loaded, the end-to-end command on the
tiny model and its resume, `--compare`, decoding settings, and where the results go. The evaluation library itself
(metrics, tables, generation, the benchmark evaluation during training) is tested in `tests/evaluation/`."""

import importlib.util
import json

import pytest
from testing_utils import error_line, fake_eval_results

from stapo_trl.cli import eval as stapo_eval
from stapo_trl.cli.eval import main, parse_decoding_list
from stapo_trl.evaluation.generation import DECODINGS
from stapo_trl.evaluation.results import load_results


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
        (["--model", "m", "--decoding", "t0.5"], "t0.7-p0.9, greedy, t<temperature>-p<top_p> (e.g. t0.6-p0.95)."),
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


def test_missing_data_file_fails_before_model_load(tiny_math_model_path, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(stapo_eval, "_load_generator", lambda *a, **k: pytest.fail("model loaded"))
    (tmp_path / "aime24").mkdir()
    with pytest.raises(SystemExit):
        main(
            [
                "--model",
                tiny_math_model_path,  # never loaded: the data check comes first
                "--max-new-tokens",
                "48",
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
def test_vllm_backend_missing_is_a_clear_error(shared_data_dir, tiny_math_model_path, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(
            ["--model", tiny_math_model_path, "--backend", "vllm", "--benchmarks", "aime24", "--limit", "1"]
            + ["--max-new-tokens", "48"]
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
    monkeypatch.setattr(stapo_eval, "_load_generator", lambda *a, **k: pytest.fail("regenerated a finished pair"))
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
    assert "--max-new-tokens 48 in the file, 64 now" in err and "another --output" in err


def test_a_results_file_of_the_old_seeding_is_not_resumed(tiny_math_model_path, tmp_path, capsys):
    output = tmp_path / "old.json"
    output.write_text(json.dumps(fake_eval_results("old", {"aime24": 0.2}) | {"format_version": 1, "config": {}}))
    argv = ["--model", tiny_math_model_path, "--benchmarks", "tiny-math", "--backend", "hf", "--max-new-tokens", "48"]
    with pytest.raises(SystemExit) as info:
        main([*argv, "--output", str(output)])
    assert info.value.code == 2
    assert error_line(capsys, "stapo-eval") == (
        f"stapo-eval: error: {output} holds results of the old seeding (a seed per benchmark and decoding, now one per "
        "sample, as in stapo-train's evaluation), so it cannot be resumed: choose another --output, or delete it to rerun."
    )


# ----------------------------------------------------------------------------------------------------------------
# One accuracy per model and settings: stapo-eval samples what stapo-train's evaluation samples
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_math_completions(tiny_math_model_path, tmp_path_factory):
    """The 4 x 2 completions of the first 4 tiny-math problems at seed 3: stapo-eval's at --batch-size 1 and 8, and
    those of the loop stapo-train's before/after evaluation calls."""
    from stapo_trl.evaluation.generation import HFGenerator, evaluate_problems
    from stapo_trl.evaluation.tasks import load_benchmark

    argv = ["--model", tiny_math_model_path, "--benchmarks", "tiny-math", "--backend", "hf", "--limit", "4"]
    argv += [
        "--decoding",
        "t1.0-p1.0",
        "--samples",
        "2",
        "--max-new-tokens",
        "48",
        "--seed",
        "3",
        "--save-completions",
    ]
    runs = {}
    for batch_size in ("1", "8"):
        output = tmp_path_factory.mktemp("eval") / "results.json"
        assert main([*argv, "--batch-size", batch_size, "--output", str(output)]) == 0
        runs[batch_size] = [r["completion"] for r in load_results(output)["samples"]]
    generator = HFGenerator(tiny_math_model_path, dtype="float32", device="cpu")
    problems = load_benchmark("tiny-math", limit=4)
    _, records = evaluate_problems(
        generator.generate, generator.tokenizer, problems, n=2, decoding=DECODINGS["t1.0-p1.0"], max_new_tokens=48,
        seed=3, save_completions=True,
    )  # fmt: skip
    return runs | {"training": [r["completion"] for r in records]}


def test_stapo_eval_samples_do_not_depend_on_the_batch_size(tiny_math_completions):
    # One torch RNG stream per process, drawn batch by batch: --batch-size 1 and 8 gave other samples.
    assert tiny_math_completions["1"] == tiny_math_completions["8"]
    assert len(set(tiny_math_completions["1"])) > 4  # sampled, not one completion per problem


def test_stapo_eval_seeds_as_the_training_evaluation_does(tiny_math_completions):
    # stapo-eval added crc32("tiny-math/t1.0-p1.0") to --seed; stapo-train's evaluation seeded with its seed alone.
    assert tiny_math_completions["8"] == tiny_math_completions["training"]


# ----------------------------------------------------------------------------------------------------------------
# --compare: two results files
# ----------------------------------------------------------------------------------------------------------------


def test_compare_names_a_file_that_is_not_json(tmp_path, capsys):
    (tmp_path / "broken.json").write_text("not json")
    with pytest.raises(SystemExit):
        main(["--compare", str(tmp_path / "broken.json"), str(tmp_path / "broken.json")])
    assert "broken.json is not a stapo-eval results file: not JSON" in capsys.readouterr().err


def test_compare_cli(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for path, value in ((a, 0.2), (b, 0.3)):
        data = fake_eval_results(path.stem, {"aime24": value}) | {"format_version": 1}
        path.write_text(json.dumps(data))
    assert main(["--compare", str(a), str(b)]) == 0
    assert "+50.0%" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------------------------
# Decoding settings and the generation budget
# ----------------------------------------------------------------------------------------------------------------


def test_greedy_decoding_is_a_setting_outside_the_paper():
    assert parse_decoding_list("greedy") == ["greedy"]
    assert parse_decoding_list("paper") == ["t1.0-p1.0", "t0.7-p0.9"]  # the paper's protocol does not grow
    assert DECODINGS["greedy"].temperature == 0.0


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
# Where the results go without --output: a place that belongs to the run, printed
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


def test_builtin_model_results_go_under_outputs_with_its_accuracy(tiny_math_model_path, tmp_path, monkeypatch, capsys):
    from pathlib import Path

    # builtin:tiny-math resolves to the session's copy; its folder is a shared cache, not the run's place.
    monkeypatch.setenv("STAPO_TRL_CACHE", str(Path(tiny_math_model_path).parent))
    monkeypatch.chdir(tmp_path)
    argv = ["--benchmarks", "tiny-math", "--backend", "hf", "--decoding", "t1.0-p1.0", "--limit", "32"]
    assert main(["--model", "builtin:tiny-math", *argv, "--samples", "4", "--max-new-tokens", "48"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outputs"]
    results = Path("outputs") / "stapo-eval" / "builtin-tiny-math.json"
    data = load_results(tmp_path / results)
    assert data["model"]["name_or_path"] == "builtin:tiny-math"
    # The tiny model solves ~45 % of the additions at T = 1: avg@4 over 128 samples is well inside [0.2, 0.75]; pass@1
    # is avg@4, pass@4 at least as high; the table prints it in %.
    table = data["results"]["t1.0-p1.0"]["tiny-math"]
    assert 0.2 <= table["avg@4"] <= 0.75 and table["pass@k"]["1"] == pytest.approx(table["avg@4"])
    assert table["avg@4"] < table["pass@k"]["2"] <= table["pass@k"]["4"] <= 1.0
    out = capsys.readouterr().out
    assert f"| builtin:tiny-math/t1.0-p1.0 | {100 * table['avg@4']:.1f} |" in out
    assert out.splitlines()[-1] == f"Results file: {results}"


def test_default_results_path_of_a_hub_id_keeps_its_organisation_and_revision():
    from pathlib import Path

    from stapo_trl.cli.eval import default_output

    # Two organisations' models of the same name no longer share stapo_eval_Qwen3-1.7B-Base.json in the current folder.
    assert default_output("Qwen/Qwen3-1.7B-Base") == Path("outputs/stapo-eval/Qwen--Qwen3-1.7B-Base.json")
    assert default_output("me/Qwen3-1.7B-Base", "v2") == Path("outputs/stapo-eval/me--Qwen3-1.7B-Base@v2.json")


def test_an_output_path_that_cannot_be_written_is_refused_before_the_model(
    tiny_math_model_path, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(stapo_eval, "_load_generator", lambda *a, **k: pytest.fail("model loaded"))
    (tmp_path / "a-file").write_text("")
    for output, expected in (
        (tmp_path, f"--output {tmp_path} is a folder: give a file, e.g. {tmp_path / 'stapo_eval.json'}."),
        (
            tmp_path / "a-file" / "r.json",
            f"--output {tmp_path / 'a-file' / 'r.json'}: {tmp_path / 'a-file'} is a file",
        ),
    ):
        with pytest.raises(SystemExit) as info:
            main(["--model", tiny_math_model_path, *ONE_PROBLEM, "--output", str(output)])
        assert info.value.code == 2
        assert capsys.readouterr().err.startswith(f"stapo-eval: error: {expected}")


# ----------------------------------------------------------------------------------------------------------------
# Range errors of the generation settings
# ----------------------------------------------------------------------------------------------------------------


def test_eval_range_errors_stop_before_the_model_is_loaded(tiny_math_model_path, tmp_path, capsys):
    """`--batch-size 0` reached `generate` and failed there with a traceback (status 1)."""
    base = ["--model", tiny_math_model_path, "--benchmarks", "tiny-math", "--backend", "hf", "--limit", "1"]
    base += ["--samples", "1", "--max-new-tokens", "8", "--output", str(tmp_path / "r.json")]
    for flag in ("--batch-size", "--max-model-len", "--tensor-parallel-size"):
        with pytest.raises(SystemExit) as excinfo:
            main([*base, flag, "0"])
        assert excinfo.value.code == 2
        assert error_line(capsys, "stapo-eval").startswith(f"stapo-eval: error: {flag} must be >= 1, got 0")
    assert not (tmp_path / "r.json").exists()
