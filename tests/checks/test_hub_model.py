"""A Hub model id that is neither cached nor reachable is refused in seconds, before the dataset is touched, in one line
that names HF_HUB_OFFLINE and local paths: by `stapo-train`, `stapo-eval` and `STAPOTrainer(model="org/name")`. A
cached id passes, offline or not; offline, an uncached id is refused without asking the Hub."""

import socket
import threading
import time
from pathlib import Path

import pytest
from huggingface_hub import constants


HUB_ID = "Qwen/Qwen3-0.6B"
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused at once


def point_hub_at(endpoint: str, monkeypatch) -> None:
    """Make huggingface_hub ask `endpoint`: its endpoint and the file URL template, which is built from the endpoint
    when huggingface_hub is imported (with the endpoint alone the probe asked the real Hub's name, which fails at once
    without a network, and never reached the endpoint under test)."""
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    template = constants.HUGGINGFACE_CO_URL_TEMPLATE
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template.replace(template.split("/{")[0], endpoint))


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """An online Hub client (the suite runs with HF_HUB_OFFLINE=1) whose endpoint is unreachable, with an empty cache;
    `hub.cache(repo)` puts a repository's `config.json` into that cache, as `hf download` does."""
    cache = tmp_path / "hub-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    point_hub_at(UNREACHABLE, monkeypatch)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HUB_ETAG_TIMEOUT", raising=False)

    class Hub:
        @staticmethod
        def cache(repo: str, filename: str = "config.json") -> None:
            folder = cache / f"models--{repo.replace('/', '--')}"
            commit = "0" * 40
            (folder / "refs").mkdir(parents=True)
            (folder / "refs" / "main").write_text(commit)
            (folder / "snapshots" / commit).mkdir(parents=True)
            (folder / "snapshots" / commit / filename).write_text('{"model_type": "qwen3"}')

    return Hub()


def check_hub_model(*args, **kwargs):
    from stapo_trl.preflight import check_hub_model

    return check_hub_model(*args, **kwargs)


def _one_line_refusal(message: str, offline: bool) -> None:
    assert "\n" not in message, message
    assert HUB_ID in message and "HF_HUB_OFFLINE" in message and "outputs/demo-stapo" in message, message
    assert ("HF_HUB_OFFLINE=1 (no download)" in message) == offline, message


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


def test_an_unreachable_hub_is_refused_after_one_request(hub, monkeypatch):
    # In seconds, not after huggingface_hub's retries: one HEAD request to the endpoint, refused, and the refusal.
    sent = requests_sent(monkeypatch)
    with pytest.raises(ConnectionError) as excinfo:
        check_hub_model(HUB_ID)
    asked = [(r.method, str(r.url)) for r in sent if HUB_ID in str(r.url)]  # huggingface_hub asks other things
    assert asked == [("HEAD", f"{UNREACHABLE}/{HUB_ID}/resolve/main/config.json")]
    _one_line_refusal(str(excinfo.value), offline=False)
    assert UNREACHABLE in str(excinfo.value)


def test_a_hub_that_does_not_answer_is_refused_by_the_timeout_after_one_request(hub, monkeypatch):
    # A server that accepts connections and never answers: the probe gives up by itself (its timeout), while the server
    # still holds the connection open, and it asked once (no retries).
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    point_hub_at(f"http://127.0.0.1:{server.getsockname()[1]}", monkeypatch)
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
        assert [r.method for r in sent if HUB_ID in str(r.url)] == ["HEAD"]  # one request about the model
        assert accepted and all(c.fileno() != -1 for c in accepted)  # the server closed nothing: the probe gave up
    finally:
        server.close()
        for connection in accepted:
            connection.close()
        thread.join(10)
    assert "Timeout" in str(excinfo.value)
    _one_line_refusal(str(excinfo.value), offline=False)


def test_offline_an_uncached_id_is_refused_without_asking_the_hub(hub, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError) as excinfo:
        check_hub_model(HUB_ID)
    _one_line_refusal(str(excinfo.value), offline=True)


@pytest.mark.parametrize("offline", [False, True], ids=["online-unreachable", "offline"])
@pytest.mark.parametrize("filename", ["config.json", "adapter_config.json"], ids=["model", "adapter"])
def test_a_cached_id_passes(hub, monkeypatch, offline, filename):
    hub.cache(HUB_ID, filename)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    check_hub_model(HUB_ID)  # no request: the unreachable endpoint is never asked
    with pytest.raises((ConnectionError, FileNotFoundError)):
        check_hub_model("Qwen/Qwen3-1.7B")  # another id is not cached


def test_local_folders_and_builtin_names_are_never_sent_to_the_hub(hub, tmp_path):
    check_hub_model(str(tmp_path))
    check_hub_model("builtin:tiny-math")


# The commands and the Python API, end to end: refused before the dataset is touched, in seconds.


@pytest.fixture
def no_dataset_loaded(monkeypatch):
    from stapo_trl.cli import prepare

    def guard(*args, **kwargs):
        raise AssertionError("the dataset was loaded before the model argument was checked")

    monkeypatch.setattr(prepare, "load_prompt_dataset", guard)


@pytest.mark.parametrize("offline", [False, True], ids=["unreachable", "offline"])
def test_stapo_train_refuses_the_hub_id_before_the_dataset(hub, monkeypatch, capsys, tmp_path, no_dataset_loaded,
                                                           no_model_built, offline):  # fmt: skip
    from stapo_trl.cli.train import main

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    argv = [
        "--config",
        str(Path(__file__).resolve().parents[2] / "recipes" / "demo" / "stapo.yaml"),
        "--output_dir",
        str(tmp_path / "out"),
    ]
    start = time.perf_counter()
    with pytest.raises(SystemExit) as excinfo:
        main(argv + ["--model_name_or_path", HUB_ID])
    assert excinfo.value.code == 2
    assert time.perf_counter() - start < 10
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"stapo-train: error: Model {HUB_ID!r} is not a local directory"), line
    _one_line_refusal(line, offline)


def test_stapo_eval_refuses_the_hub_id_before_loading_anything(hub, capsys, tmp_path):
    from stapo_trl.cli.eval import main

    start = time.perf_counter()
    with pytest.raises(SystemExit) as excinfo:
        main(["--model", HUB_ID, "--benchmarks", "tiny-math", "--backend", "hf", "--output", str(tmp_path / "r.json")])
    assert excinfo.value.code == 2
    assert time.perf_counter() - start < 10
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("stapo-eval: error: ") and "does not answer" in line, line
    _one_line_refusal(line, offline=False)


@pytest.mark.parametrize("where", ["model", "reward-model"])
def test_the_python_api_refuses_a_string_hub_id_in_seconds(
    hub, no_model_built, tmp_path, tiny_random_model_path, where
):
    from datasets import Dataset

    from stapo_trl import STAPOConfig, STAPOTrainer

    args = STAPOConfig(output_dir=str(tmp_path), report_to=[], per_device_train_batch_size=8)
    model, reward = (HUB_ID, "math_accuracy") if where == "model" else (tiny_random_model_path, HUB_ID)
    dataset = Dataset.from_dict({"prompt": ["1+1"] * 8, "solution": ["2"] * 8})
    start = time.perf_counter()
    with pytest.raises(ConnectionError) as excinfo:
        STAPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=dataset)
    assert time.perf_counter() - start < 10
    _one_line_refusal(str(excinfo.value), offline=False)
    assert str(excinfo.value).startswith("Model" if where == "model" else "Reward model")
