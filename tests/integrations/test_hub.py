"""Hub checks (`stapo_trl.integrations.hub`) in one line before anything is built, and the prompt-token budget."""

import logging
import socket
import types

import huggingface_hub.utils
import pytest
from datasets import config
from huggingface_hub import constants
from testing_utils import STAPO_RECIPE, addition_rows, free_port, write_jsonl
from transformers import AutoTokenizer

from stapo_trl.cli.args import parse_args
from stapo_trl.cli.dry_run import dry_run_recipe
from stapo_trl.cli.dry_run import main as dry_run_main
from stapo_trl.cli.eval import main as eval_main
from stapo_trl.cli.run import prepare
from stapo_trl.cli.train import main as train_main
from stapo_trl.data import keep_short_prompts, model_max_positions, prompt_token_budget
from stapo_trl.evaluation.generation import DECODINGS, GeneratedSample, evaluate_problems
from stapo_trl.evaluation.tasks import BenchmarkProblem
from stapo_trl.integrations.hub import check_hub_access, check_hub_dataset, check_hub_model


HUB_ID, DATASET_ID = "Qwen/Qwen3-0.6B", "some-org/some-dataset"
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: the connection is refused at once
PUSH = "push_to_hub: cannot push to hub_model_id="


def test_push_to_hub_offline_online_unreachable_or_without_a_token_and_a_silent_hub_fail_in_one_line(tmp_path, capsys,
        no_model_built, monkeypatch):  # fmt: skip
    assert constants.HF_HUB_OFFLINE  # conftest
    argv = ["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), "--push_to_hub", "true"]
    with pytest.raises(SystemExit) as excinfo:
        train_main([*argv, "--hub_model_id", "me/stapo-demo"])
    message = str(excinfo.value)
    assert message.startswith(f"stapo-train: error: {PUSH}'me/stapo-demo': ") and "\n" not in message
    assert "offline mode" in message and "HF_HUB_OFFLINE=1" in message and "--push_to_hub false" in message
    with pytest.raises(SystemExit, match=r"hub_model_id='out': offline mode"):  # Trainer's default: the folder's name
        train_main(argv)
    capsys.readouterr()
    assert dry_run_main([*argv, "--hub_model_id", "me/stapo-demo"]) == 2
    assert f"  - {PUSH}'me/stapo-demo': offline mode" in capsys.readouterr().out
    for name, value in dict(HF_HUB_OFFLINE=False, HF_TOKEN_PATH=str(tmp_path / "hf_home" / "token")).items():
        monkeypatch.setattr(constants, name, value)  # online: no token, or an unreachable Hub
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    endpoint = f"http://127.0.0.1:{free_port()}"  # a real request to a closed port
    unreachable = f"the Hub at {endpoint} cannot be reached"
    for kwargs, cause in [({}, "no Hub token "), (dict(token="hf_x", endpoint=endpoint), unreachable)]:
        with pytest.raises(ConnectionError) as excinfo:
            check_hub_access("me/x", str(tmp_path), **kwargs)
        assert str(excinfo.value).startswith(f"{PUSH}'me/x': {cause}") and "\n" not in str(excinfo.value)
        assert "--push_to_hub false" in str(excinfo.value)
    check_hub_access("me/x", str(tmp_path), token="hf_x", endpoint=endpoint, network=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # a model check: refused by the timeout
    with socket.create_server(("127.0.0.1", 0), backlog=4) as server:  # the kernel accepts; nothing ever answers
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        sent = requests_sent(monkeypatch)
        with pytest.raises(ConnectionError, match="does not answer") as excinfo:
            check_hub_model(HUB_ID, timeout=1.0)
    assert [r.method for r in sent if HUB_ID in str(r.url)] == ["GET"] and "Timeout" in str(excinfo.value)
    _one_line_refusal(str(excinfo.value), offline=False)


@pytest.fixture
def hub(monkeypatch, tmp_path):  # an online Hub client with an unreachable endpoint and empty caches
    for name, value in dict(HF_HUB_OFFLINE=False, ENDPOINT=UNREACHABLE, HF_HUB_CACHE=str(tmp_path / "hub")).items():
        monkeypatch.setattr(constants, name, value)
    monkeypatch.setattr(config, "HF_DATASETS_OFFLINE", False)
    monkeypatch.setattr(config, "HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.delenv("HF_HUB_ETAG_TIMEOUT", raising=False)


def _one_line_refusal(message: str, offline: bool, name: str = HUB_ID) -> None:
    assert "\n" not in message and name in message and "HF_HUB_OFFLINE" in message, message
    assert ("(no download)" in message) == offline, message
    assert ("outputs/demo-stapo" if name == HUB_ID else f"dataset_name={name!r}") in message, message


def requests_sent(monkeypatch) -> list:  # the HTTP requests sent from now on (each still sent)
    client, sent = type(huggingface_hub.utils.get_session()), []
    monkeypatch.setattr(client, "send", lambda s, r, *a, send=client.send, **k: sent.append(r) or send(s, r, *a, **k))
    return sent


@pytest.mark.parametrize("what, offline", [("model", None), ("dataset", None), ("eval", None), ("model", "HUB"),
                                           ("dataset", "HUB"), ("eval", "HUB"), ("dataset", "DATASETS")])  # fmt: skip
def test_an_uncached_id_is_refused_in_one_line_after_one_request_or_offline_without_any(hub, monkeypatch, capsys,
        tmp_path, no_model_built, what, offline):  # fmt: skip
    monkeypatch.setattr("stapo_trl.cli.prepare.load_prompt_dataset", lambda *a, **k: pytest.fail("loaded first"))
    if offline:
        monkeypatch.setattr(constants if offline == "HUB" else config, f"HF_{offline}_OFFLINE", True)
    kind, name = ("datasets", DATASET_ID) if what == "dataset" else ("models", HUB_ID)
    sent = requests_sent(monkeypatch)
    with pytest.raises(FileNotFoundError if offline else ConnectionError) as excinfo:
        check_hub_model(HUB_ID) if kind == "models" else check_hub_dataset(DATASET_ID)
    assert [(r.method, str(r.url)) for r in sent] == [("GET", f"{UNREACHABLE}/api/{kind}/{name}")] * (not offline)
    download = f"hf download {'--repo-type dataset ' * (kind == 'datasets')}{name}"
    assert offline or UNREACHABLE in str(excinfo.value) and download in str(excinfo.value)
    start = {"model": f"stapo-train: error: Model {name!r} is not a local directory", "eval": "stapo-eval: error: ",
             "dataset": f"stapo-train: error: dataset_name={name!r} is not a local path"}[what]  # fmt: skip
    flag = {"model": "--model_name_or_path", "dataset": "--dataset_name"}.get(what)
    with pytest.raises(SystemExit) as exited:
        if what == "eval":
            eval_main(f"--model {name} --benchmarks tiny-math --backend hf --output {tmp_path / 'r.json'}".split())
        train_main(["--config", STAPO_RECIPE, "--output_dir", str(tmp_path / "out"), flag, name])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert exited.value.code == 2 and line.startswith(start), line
    assert offline or what != "eval" or "does not answer" in line, line
    for message in (str(excinfo.value), line):
        _one_line_refusal(message, bool(offline), name)


@pytest.mark.parametrize("offline", [False, True], ids=["online-unreachable", "offline"])
@pytest.mark.parametrize("filename, cache", [("config.json", "hub"), ("adapter_config.json", "datasets")])
def test_a_cached_id_a_local_path_and_a_builder_name_pass(hub, monkeypatch, tmp_path, offline, filename, cache):
    snapshot = tmp_path / "hub" / f"models--{HUB_ID.replace('/', '--')}" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    (snapshot / filename).write_text('{"model_type": "qwen3"}')  # a model, an adapter
    folder = {"hub": f"datasets--{DATASET_ID.replace('/', '--')}", "datasets": DATASET_ID.replace("/", "___")}[cache]
    (tmp_path / cache / folder).mkdir(parents=True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    for name in (DATASET_ID, str(tmp_path), "json"):  # no request: the unreachable endpoint is never asked
        check_hub_dataset(name)
    for name in (HUB_ID, str(tmp_path), "builtin:tiny-math"):
        check_hub_model(name)
    for check, name in ((check_hub_model, "Qwen/Qwen3-1.7B"), (check_hub_dataset, "some-org/another-dataset")):
        with pytest.raises((ConnectionError, FileNotFoundError)):
            check(name)


def test_model_max_positions_prompt_token_budget_keep_short_prompts_eval_train_and_the_dry_run(tiny_random_model_path,
        tiny_math_model_path, tmp_path, caplog):  # fmt: skip
    caplog.set_level(logging.WARNING, logger="stapo_trl.data")
    ns = types.SimpleNamespace  # a config, a model, an HFGenerator, a VLLMGenerator, no length
    models = [{"max_position_embeddings": 512}, ns(config=ns(n_positions=1024)), {"hidden_size": 64},
              ns(model=ns(config={"max_position_embeddings": 64})),
              ns(llm=ns(llm_engine=ns(model_config=ns(max_model_len=96))))]  # fmt: skip
    assert list(map(model_max_positions, models)) == [512, 1024, None, 64, 96]
    assert [prompt_token_budget(512, 256), prompt_token_budget(512, 256, max_prompt_tokens=100)] == [256, 100]
    assert [prompt_token_budget(None, 256, max_prompt_tokens=100), prompt_token_budget(None, 256)] == [100, None]
    for kwargs, message in [(dict(max_new_tokens=512), "max_new_tokens=512 leaves no room"),
                            (dict(max_new_tokens=10, max_prompt_tokens=0), "max_prompt_tokens")]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            prompt_token_budget(512, **kwargs)
    assert keep_short_prompts([10, 724, 30, 256, 257], 256, what="math500 prompts") == [0, 2, 3]
    (line,) = [r.getMessage() for r in caplog.records]
    assert "Dropped 2 of 5 math500 prompts longer than 256 tokens" in line and "max_prompt_tokens" in line
    caplog.clear()
    assert keep_short_prompts([1, 2], 256) == [0, 1] and keep_short_prompts([1000], None) == [0]
    assert not caplog.records  # nothing dropped: silent
    with pytest.raises(ValueError, match="All 2 prompts are longer than 8 tokens.*max_prompt_tokens"):
        keep_short_prompts([9, 700], 8)
    tokenizer = AutoTokenizer.from_pretrained(tiny_random_model_path)
    problems = [BenchmarkProblem(id=i, problem=p, gold=g, benchmark="tiny") for i, p, g in
                [("short", "12+34", "46"), ("long", "1+" * 300 + "1", "301"), ("short2", "10+10", "20")]]  # fmt: skip
    seen, sample = [], GeneratedSample(r"\boxed{46}", 3, True)
    generate_fn = lambda texts, *, n, **kwargs: seen.extend(texts) or [[sample] * n for _ in texts]  # noqa: E731
    run = dict(n=2, decoding=DECODINGS["t1.0-p1.0"], max_new_tokens=256, max_positions=512)
    table, records = evaluate_problems(generate_fn, tokenizer, problems, **run)
    assert len(seen) == 2 and {r["id"] for r in records} == {"short", "short2"}
    assert table["num_problems"] == 2 and table["avg@2"] == pytest.approx(0.5)
    assert any("Dropped 1 of 3 tiny prompts" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="All 1 tiny prompts are longer"):
        evaluate_problems(generate_fn, tokenizer, problems[1:2], **run)
    caplog.clear()  # stapo-train and its dry run drop prompts over the model's positions
    mixed, long = (write_jsonl(tmp_path / f"{i}.jsonl", [{"problem": p, "answer": "1"} for p in problems])
                   for i, problems in enumerate([["12+34", "1+" * 400, "5+6"], ["1+" * 400 + "1"]]))  # fmt: skip
    argv = ["--config", STAPO_RECIPE, "--model_name_or_path", tiny_math_model_path, "--dataset_name", mixed]
    argv += ["--eval_before_after", "false", "--output_dir", str(tmp_path / "out")]
    count = "1 of 3 training prompts exceed 464 tokens and will be dropped"  # the model's 512 positions - 48
    assert dict(dry_run_recipe(argv, 1).lines)["prompt length"] == count  # the commands print these rows
    # a 16-completion rollout step (2 prompts x 8), so that the 2 kept prompts fill one
    train = [*argv, "--per_device_train_batch_size", "8", "--steps_per_generation", "2"]
    assert len(prepare(*parse_args(train)).train_dataset) == 2
    assert any("Dropped 1 of 3 training prompts" in r.getMessage() for r in caplog.records)
    train[train.index(mixed)] = argv[argv.index(mixed)] = long
    with pytest.raises(ValueError, match="All 1 training prompts are longer"):
        prepare(*parse_args(train))
    assert any("All 1 training prompts are longer than 464 tokens" in e for e in dry_run_recipe(argv, 1).errors)
    # --max_prompt_tokens 64 leaves 1 of 9 prompts: too few for one rollout step of 8 (8 short ones fill it)
    rows = addition_rows(1) + [{"problem": "1+" * 100 + "1", "answer": "101"}] * 8
    argv[argv.index(long)] = write_jsonl(tmp_path / "few.jsonl", rows)
    with pytest.raises(ValueError, match=r"^1 prompt after filtering \(of 9; .*\); one rollout step needs 8 "):
        prepare(*parse_args([*argv, "--max_prompt_tokens", "64"]))
    argv[argv.index("--dataset_name") + 1] = write_jsonl(tmp_path / "enough.jsonl", addition_rows(8) + rows[1:])
    assert len(prepare(*parse_args([*argv, "--max_prompt_tokens", "64"])).train_dataset) == 8
