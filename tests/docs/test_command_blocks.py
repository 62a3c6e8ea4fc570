"""Every `bash` block of the shipped docs pastes into a shell as written: it parses (`bash -n`), no line continuation
is followed by anything (a `\\` then spaces and a `# comment` passes one argument `' '` and ends the command there),
and a `stapo-train` command that trains on other data names its own `output_dir` (else it resumes the run of the
recipe's folder)."""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest
from testing_utils import REPO, readme_code_blocks


DOCS = [REPO / "README.md", REPO / "recipes" / "README.md", *sorted(REPO.glob("docs/*.md"))]
BLOCKS = [(doc, block) for doc in DOCS for block in readme_code_blocks("bash", doc)]


@pytest.mark.parametrize(
    "doc, block", BLOCKS, ids=[f"{doc.relative_to(REPO)}:{i}" for i, (doc, _) in enumerate(BLOCKS)]
)
def test_every_bash_block_pastes(doc, block):
    # Reported: the README's own-data command ended a line with `\` then spaces and a `# comment`; pasted, it failed
    # ("Some specified arguments are not used by the HfArgumentParser: [' ']"), and joined, it had no --output_dir,
    # so after `make demo` it resumed the finished demo run and trained nothing on the user's data.
    checked = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True)
    assert checked.returncode == 0, f"{doc.name}: {checked.stderr}\n{block}"
    for line in block.splitlines():
        assert not re.search(r"\\[ \t]+(#.*)?$", line), f"{doc.name}: a continuation followed by something: {line}"
    for command in re.sub(r"\\\n", " ", block).splitlines():
        command = command.split(" #")[0]
        if re.search(r"\bstapo-train (?!compare)", command) and "--dataset_name" in command:
            assert "--output_dir" in command, f"{doc.name}: trains on other data in the recipe's folder: {command}"


def test_the_own_data_example_is_in_the_readme():
    assert any("--dataset_name" in block for doc, block in BLOCKS if doc.name == "README.md")


def test_every_stapo_eval_command_on_a_tiny_model_fits_its_positions(tiny_math_model_path):
    # Reported: the README's `stapo-eval --model outputs/demo-stapo --benchmarks tiny-math --backend hf` stopped with
    # "--max-new-tokens 20480: ... the model has 512 positions" (the default budget is the paper's); so did the
    # docs' `make evaluate MODEL=outputs/demo-stapo EVAL_ARGS=...`. The demo's folder has the tiny model's shape.
    from stapo_trl.cli.eval import check_generation_budget, make_parser

    checked = []
    for doc, block in BLOCKS:
        for command in re.sub(r"\\\n", " ", block).splitlines():
            if "stapo-eval --model" not in command and "make evaluate" not in command:
                continue
            words = shlex.split(command.split(" #")[0])
            if "make" in words and "evaluate" in words:  # the Makefile's target: --model $(MODEL) $(EVAL_ARGS)
                options = dict(word.split("=", 1) for word in words if "=" in word)
                words = ["stapo-eval", "--model", options["MODEL"], *shlex.split(options.get("EVAL_ARGS", ""))]
            model = words[words.index("--model") + 1] if "--model" in words else ""
            if words and words[0].endswith("stapo-eval") and model.startswith(("builtin:tiny-", "outputs/demo-")):
                check_generation_budget(make_parser().parse_args(words[1:]), tiny_math_model_path)
                checked.append(f"{doc.name}: {command}")
    assert len(checked) >= 5, checked  # README, evaluation.md (3), vllm_cpu.md
