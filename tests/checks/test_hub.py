"""`stapo_trl.preflight`: `push_to_hub` without a usable Hub (offline, no token, unreachable) stops with one line
naming `hub_model_id` and the fix, before any model is built; the dry run reports the same."""

import pytest
from testing_utils import STAPO_RECIPE, free_port


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

    from stapo_trl.preflight import check_hub_access

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
