"""A `dataset_name` that is a Hub id, neither cached nor reachable, is refused in seconds before any download, in one
line that names `dataset_name` and what to pass instead (`datasets` retried for ~35 s, then named neither). A cached
id, a local path and a `datasets` builder name pass without asking the Hub."""

import time
from pathlib import Path

import pytest
from datasets import config
from huggingface_hub import constants


DATASET_ID = "some-org/some-dataset"
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused at once
RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "demo" / "stapo.yaml"


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """An online Hub client (the suite runs offline) whose endpoint is unreachable, with empty Hub and datasets caches;
    returns the two cache folders."""
    hub_cache, datasets_cache = tmp_path / "hub-cache", tmp_path / "datasets-cache"
    hub_cache.mkdir()
    datasets_cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(config, "HF_DATASETS_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", UNREACHABLE)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(config, "HF_DATASETS_CACHE", str(datasets_cache))
    monkeypatch.delenv("HF_HUB_ETAG_TIMEOUT", raising=False)
    return hub_cache, datasets_cache


def check_hub_dataset(name):
    from stapo_trl.preflight import check_hub_dataset

    return check_hub_dataset(name)


def _one_line_refusal(message: str) -> None:
    assert "\n" not in message, message
    assert f"dataset_name={DATASET_ID!r}" in message and "builtin:tiny-math" in message, message


def test_an_unreachable_hub_is_refused_in_seconds(hub):
    start = time.perf_counter()
    with pytest.raises(ConnectionError) as excinfo:
        check_hub_dataset(DATASET_ID)
    assert time.perf_counter() - start < 5
    _one_line_refusal(str(excinfo.value))
    assert UNREACHABLE in str(excinfo.value) and "hf download --repo-type dataset" in str(excinfo.value)


@pytest.mark.parametrize("flag", ["hub", "datasets"])
def test_offline_an_uncached_id_is_refused_without_asking_the_hub(hub, monkeypatch, flag):
    monkeypatch.setattr(constants if flag == "hub" else config, f"HF_{flag.upper()}_OFFLINE", True)
    with pytest.raises(FileNotFoundError) as excinfo:
        check_hub_dataset(DATASET_ID)
    _one_line_refusal(str(excinfo.value))
    assert "offline" in str(excinfo.value)


@pytest.mark.parametrize("cache", ["hub", "datasets"])
def test_a_cached_id_a_local_path_and_a_builder_name_pass(hub, tmp_path, cache):
    hub_cache, datasets_cache = hub
    if cache == "hub":
        (hub_cache / f"datasets--{DATASET_ID.replace('/', '--')}").mkdir()
    else:
        (datasets_cache / DATASET_ID.replace("/", "___")).mkdir()
    check_hub_dataset(DATASET_ID)  # no request: the unreachable endpoint is never asked
    check_hub_dataset(str(tmp_path))  # a local folder
    check_hub_dataset("json")  # a packaged builder, with data_files
    with pytest.raises(ConnectionError):
        check_hub_dataset("some-org/another-dataset")  # another id is not cached


@pytest.mark.parametrize("offline", [False, True], ids=["unreachable", "offline"])
def test_stapo_train_refuses_the_hub_dataset_before_loading_it(hub, monkeypatch, capsys, tmp_path, offline):
    from stapo_trl.cli import prepare
    from stapo_trl.cli.train import main

    def guard(*args, **kwargs):
        raise AssertionError("the dataset was loaded before its Hub id was checked")

    monkeypatch.setattr(prepare, "load_prompt_dataset", guard)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    start = time.perf_counter()
    with pytest.raises(SystemExit) as excinfo:
        main(["--config", str(RECIPE), "--output_dir", str(tmp_path / "out"), "--dataset_name", DATASET_ID])
    assert excinfo.value.code == 2
    assert time.perf_counter() - start < 10
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"stapo-train: error: dataset_name={DATASET_ID!r} is not a local path"), line
    _one_line_refusal(line)
