"""`stapo_trl.integrations.hub`: Hub access for a model, a dataset or a push answered in one line before anything is
built, and the prompt-token budget of `stapo_trl.data` (prompts longer than the model's positions minus the generation
budget are dropped)."""

import contextlib
import json
import logging
import socket
import threading
import types
from pathlib import Path

import pytest
from datasets import config
from huggingface_hub import constants
from testing_utils import STAPO_RECIPE, addition_rows, free_port, write_jsonl

from stapo_trl.data import keep_short_prompts, model_max_positions, prompt_token_budget


def test_push_to_hub_offline_fails_before_the_model_in_one_line(no_model_built, tmp_path, capsys):
    from huggingface_hub import constants

    from stapo_trl.cli.dry_run import main as dry_run_main
    from stapo_trl.cli.train import main

    assert constants.HF_HUB_OFFLINE  # tests run with HF_HUB_OFFLINE=1 (conftest), as a machine without network would
    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), "--push_to_hub", "true"]
    with pytest.raises(SystemExit) as excinfo:
        main([*argv, "--hub_model_id", "me/stapo-demo"])
    message = str(excinfo.value)
    assert message.startswith("stapo-train: error: push_to_hub: cannot push to hub_model_id='me/stapo-demo': "), (
        message
    )
    assert "offline mode" in message and "HF_HUB_OFFLINE=1" in message and "--push_to_hub false" in message, message
    assert "\n" not in message
    # Without hub_model_id, Trainer pushes to the output folder's name: the message names that.
    with pytest.raises(SystemExit, match=r"hub_model_id='out': offline mode"):
        main(argv)
    capsys.readouterr()
    assert dry_run_main([*argv, "--hub_model_id", "me/stapo-demo"]) == 2
    assert "  - push_to_hub: cannot push to hub_model_id='me/stapo-demo': offline mode" in capsys.readouterr().out


def test_push_to_hub_with_an_unreachable_hub_or_no_token_fails_in_one_line(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from stapo_trl.integrations.hub import check_hub_access

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))  # no stored login
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf_home" / "token"))
    with pytest.raises(ConnectionError, match=r"^push_to_hub: cannot push to hub_model_id='me/x': no Hub token "):
        check_hub_access("me/x", str(tmp_path))
    # A real request to a closed port on this machine: the Hub cannot be reached.
    endpoint = f"http://127.0.0.1:{free_port()}"  # free again once closed: nothing listens there
    with pytest.raises(ConnectionError) as excinfo:
        check_hub_access("me/x", str(tmp_path), token="hf_not_a_real_token", endpoint=endpoint)
    message = str(excinfo.value)
    assert message.startswith("push_to_hub: cannot push to hub_model_id='me/x': "), message
    assert f"the Hub at {endpoint} cannot be reached" in message, message
    assert "--push_to_hub false" in message and "\n" not in message
    # The dry run asks nothing over the network: a token is enough there.
    check_hub_access("me/x", str(tmp_path), token="hf_not_a_real_token", endpoint=endpoint, network=False)


HUB_ID, DATASET_ID = "Qwen/Qwen3-0.6B", "some-org/some-dataset"
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused at once
RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "demo" / "stapo.yaml")


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """An online Hub client (the suite runs with HF_HUB_OFFLINE=1) whose endpoint is unreachable, with empty Hub and
    datasets caches; `hub.cache(repo)` puts a repository's file into the Hub cache, as `hf download` does."""
    cache, datasets_cache = tmp_path / "hub-cache", tmp_path / "datasets-cache"
    cache.mkdir()
    datasets_cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(config, "HF_DATASETS_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", UNREACHABLE)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(config, "HF_DATASETS_CACHE", str(datasets_cache))
    monkeypatch.delenv("HF_HUB_ETAG_TIMEOUT", raising=False)

    class Hub:
        datasets = datasets_cache

        @staticmethod
        def cache(repo: str, filename: str = "config.json", kind: str = "models") -> None:
            snapshot = cache / f"{kind}--{repo.replace('/', '--')}" / "snapshots" / ("0" * 40)
            snapshot.mkdir(parents=True)
            (snapshot.parents[1] / "refs").mkdir()
            (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
            (snapshot / filename).write_text('{"model_type": "qwen3"}')

    return Hub()


def check_hub_model(*args, **kwargs):
    from stapo_trl.integrations.hub import check_hub_model

    return check_hub_model(*args, **kwargs)


def check_hub_dataset(name):
    from stapo_trl.integrations.hub import check_hub_dataset

    return check_hub_dataset(name)


def _one_line_refusal(message: str, offline: bool, name: str = HUB_ID) -> None:
    assert "\n" not in message and name in message and "HF_HUB_OFFLINE" in message, message
    assert ("(no download)" in message) == offline, message
    assert ("outputs/demo-stapo" if name == HUB_ID else f"dataset_name={name!r}") in message, message


def requests_sent(monkeypatch) -> list:
    """The HTTP requests huggingface_hub's client sends from now on (a spy: each is still sent)."""
    from huggingface_hub.utils import get_session

    client = type(get_session())
    sent, send = [], client.send

    def spy(session, request, *args, **kwargs):
        sent.append(request)
        return send(session, request, *args, **kwargs)

    monkeypatch.setattr(client, "send", spy)
    return sent


@pytest.mark.parametrize("kind", ["models", "datasets"])
def test_an_unreachable_hub_is_refused_after_one_request(hub, monkeypatch, kind):
    # In seconds, not after huggingface_hub's retries: one request to the endpoint, refused, and the refusal.
    sent = requests_sent(monkeypatch)
    name = HUB_ID if kind == "models" else DATASET_ID
    with pytest.raises(ConnectionError) as excinfo:
        check_hub_model(HUB_ID) if kind == "models" else check_hub_dataset(DATASET_ID)
    assert [(r.method, str(r.url)) for r in sent] == [("GET", f"{UNREACHABLE}/api/{kind}/{name}")]
    _one_line_refusal(str(excinfo.value), offline=False, name=name)
    assert UNREACHABLE in str(excinfo.value)
    assert f"hf download {'--repo-type dataset ' * (kind == 'datasets')}{name}" in str(excinfo.value)


def test_a_hub_that_does_not_answer_is_refused_by_the_timeout_after_one_request(hub, monkeypatch):
    # A server that accepts connections and never answers: the probe gives up by itself (its timeout), while the server
    # still holds the connection open, and it asked once (no retries).
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
    accepted, sent = [], requests_sent(monkeypatch)

    def serve():
        while True:
            try:
                accepted.append(server.accept()[0])
            except OSError:  # closed by the test
                return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with pytest.raises(ConnectionError, match="does not answer") as excinfo:
            check_hub_model(HUB_ID, timeout=1.0)
        assert [r.method for r in sent if HUB_ID in str(r.url)] == ["GET"]  # one request about the model
        assert accepted and all(c.fileno() != -1 for c in accepted)  # the server closed nothing: the probe gave up
    finally:
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)  # wakes the accept() that close() alone leaves blocked
        server.close()
        for connection in accepted:
            connection.close()
        thread.join(10)
        assert not thread.is_alive()
    assert "Timeout" in str(excinfo.value)
    _one_line_refusal(str(excinfo.value), offline=False)


@pytest.mark.parametrize("flag", ["hub", "datasets"])
def test_offline_an_uncached_id_is_refused_without_asking_the_hub(hub, monkeypatch, flag):
    sent = requests_sent(monkeypatch)
    monkeypatch.setattr(constants if flag == "hub" else config, f"HF_{flag.upper()}_OFFLINE", True)
    with pytest.raises(FileNotFoundError) as excinfo:
        check_hub_dataset(DATASET_ID)
    _one_line_refusal(str(excinfo.value), offline=True, name=DATASET_ID)
    if flag == "hub":
        with pytest.raises(FileNotFoundError) as excinfo:
            check_hub_model(HUB_ID)
        _one_line_refusal(str(excinfo.value), offline=True)
    assert sent == []


@pytest.mark.parametrize("offline", [False, True], ids=["online-unreachable", "offline"])
@pytest.mark.parametrize("filename", ["config.json", "adapter_config.json"], ids=["model", "adapter"])
def test_a_cached_id_passes(hub, monkeypatch, offline, filename):
    hub.cache(HUB_ID, filename)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    check_hub_model(HUB_ID)  # no request: the unreachable endpoint is never asked
    with pytest.raises((ConnectionError, FileNotFoundError)):
        check_hub_model("Qwen/Qwen3-1.7B")  # another id is not cached


@pytest.mark.parametrize("cache", ["hub", "datasets"])
def test_a_cached_dataset_a_local_path_and_a_builder_name_pass(hub, tmp_path, cache):
    if cache == "hub":
        (tmp_path / "hub-cache" / f"datasets--{DATASET_ID.replace('/', '--')}").mkdir()
    else:
        (hub.datasets / DATASET_ID.replace("/", "___")).mkdir()
    for name in (DATASET_ID, str(tmp_path), "json"):  # no request: the unreachable endpoint is never asked
        check_hub_dataset(name)
    check_hub_model(str(tmp_path))  # local folders and built-in names are never sent to the Hub either
    check_hub_model("builtin:tiny-math")
    with pytest.raises(ConnectionError):
        check_hub_dataset("some-org/another-dataset")  # another id is not cached


# The commands, end to end: refused before the dataset is touched, in seconds.
@pytest.mark.parametrize("offline", [False, True], ids=["unreachable", "offline"])
@pytest.mark.parametrize("what", ["model", "dataset"])
def test_stapo_train_refuses_a_hub_id_before_loading_anything(hub, monkeypatch, capsys, tmp_path, no_model_built,
                                                              offline, what):  # fmt: skip
    from stapo_trl.cli import prepare
    from stapo_trl.cli.train import main

    def guard(*args, **kwargs):
        raise AssertionError("the dataset was loaded before the Hub id was checked")

    monkeypatch.setattr(prepare, "load_prompt_dataset", guard)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    flag, name, start = {
        "model": ("--model_name_or_path", HUB_ID, f"Model {HUB_ID!r} is not a local directory"),
        "dataset": ("--dataset_name", DATASET_ID, f"dataset_name={DATASET_ID!r} is not a local path"),
    }[what]
    with pytest.raises(SystemExit) as excinfo:
        main(["--config", RECIPE, "--output_dir", str(tmp_path / "out"), flag, name])
    assert excinfo.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"stapo-train: error: {start}"), line
    _one_line_refusal(line, offline, name)


def test_stapo_eval_refuses_the_hub_id_before_loading_anything(hub, capsys, tmp_path):
    from stapo_trl.cli.eval import main

    with pytest.raises(SystemExit) as excinfo:
        main(["--model", HUB_ID, "--benchmarks", "tiny-math", "--backend", "hf", "--output", str(tmp_path / "r.json")])
    assert excinfo.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("stapo-eval: error: ") and "does not answer" in line, line
    _one_line_refusal(line, offline=False)


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
    with caplog.at_level(logging.WARNING, logger="stapo_trl.data"):
        assert keep_short_prompts([10, 724, 30, 256, 257], 256, what="math500 prompts") == [0, 2, 3]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "Dropped 2 of 5 math500 prompts longer than 256 tokens" in lines[0]
    assert "max_prompt_tokens" in lines[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="stapo_trl.data"):
        assert keep_short_prompts([1, 2], 256) == [0, 1]
        assert keep_short_prompts([1000], None) == [0]
    assert not caplog.records  # nothing dropped: silent
    with pytest.raises(ValueError, match="All 2 prompts are longer than 8 tokens.*max_prompt_tokens"):
        keep_short_prompts([9, 700], 8)


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
    with caplog.at_level(logging.WARNING, logger="stapo_trl.data"):
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
    with caplog.at_level(logging.WARNING, logger="stapo_trl.data"):
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
    assert any("All 1 training prompts are longer than 464 tokens" in e for e in report.errors), report.errors


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
