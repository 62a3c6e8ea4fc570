"""Before a run that pushes to the Hub builds anything: can it reach the Hub, with a token, for `hub_model_id`?

`push_to_hub: true` without network used to fail only while the trainer was built (a 60-line traceback, after the
data and the model were loaded), or at the very end. [`check_hub_access`] answers first, in one line that names
`hub_model_id`, the cause and the way out (`--push_to_hub false`).
"""

from __future__ import annotations

import os


def default_hub_model_id(output_dir: str) -> str:
    """The repository `Trainer` pushes to when `hub_model_id` is not set: the name of `output_dir`."""
    return os.path.basename(os.path.abspath(output_dir))


def check_hub_access(
    hub_model_id: str | None,
    output_dir: str,
    token: str | None = None,
    *,
    endpoint: str | None = None,
    network: bool = True,
) -> None:
    """Raise one `ConnectionError` line when a push to the Hub cannot work: offline mode, no token, the Hub not
    reachable, or a token it refuses. Nothing is created or uploaded.

    Args:
        hub_model_id (`str` or `None`): the repository (`None`: the name of `output_dir`, as `Trainer` does).
        output_dir (`str`): the run's folder.
        token (`str`, *optional*): `hub_token`; `None` uses the stored login or `HF_TOKEN`.
        endpoint (`str`, *optional*): the Hub's URL; `None` uses `HF_ENDPOINT` (default https://huggingface.co).
        network (`bool`, *optional*, defaults to `True`): also ask the Hub who the token belongs to (`whoami`, one
            request); `False` checks only offline mode and the token's presence (the dry run).

    Raises:
        ConnectionError: "push_to_hub: cannot push to hub_model_id='...': <cause>. ... or pass --push_to_hub false".
    """
    from huggingface_hub import HfApi, constants, get_token

    repo = hub_model_id or default_hub_model_id(output_dir)

    def fail(cause: str) -> ConnectionError:
        return ConnectionError(
            f"push_to_hub: cannot push to hub_model_id={repo!r}: {cause}. Fix that, or pass --push_to_hub false to "
            "train without pushing (the model, card and results stay in output_dir; upload them later with "
            f"`hf upload {repo} {output_dir}`)."
        )

    if constants.HF_HUB_OFFLINE:
        raise fail("offline mode is on (HF_HUB_OFFLINE=1)")
    token = token or get_token()
    if not token:
        raise fail("no Hub token (run `hf auth login`, or set HF_TOKEN or hub_token)")
    if not network:
        return
    endpoint = endpoint or constants.ENDPOINT
    try:
        HfApi(endpoint=endpoint).whoami(token=token)
    except Exception as e:  # noqa: BLE001 (httpx / requests / huggingface_hub errors: the cause is what matters)
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status in (401, 403):
            raise fail(f"the Hub at {endpoint} refuses the token (HTTP {status})") from e
        raise fail(f"the Hub at {endpoint} cannot be reached ({type(e).__name__}: {e})") from e


__all__ = ["check_hub_access", "default_hub_model_id"]
