"""The shipped docs: bash blocks paste, links stay inside the repository, the Python examples run as printed."""

import ast
import re
import shlex
import subprocess
import sys

import pytest
from testing_utils import REPO, builtin_cache_root, readme_code_blocks, run_subprocess, subprocess_env

from stapo_trl import STAPOConfig
from stapo_trl.data import INSTRUCTION
from stapo_trl.run_folder.logs import read_metrics, read_token_records
from stapo_trl.trainer.config import has_accelerator


DOCS = [REPO / "README.md", REPO / "recipes" / "README.md", *sorted(REPO.glob("docs/*.md"))]
BLOCKS = [(doc, block) for doc in DOCS for block in readme_code_blocks("bash", doc)]
SHIPPED_DOCS = [str(p.relative_to(REPO)) for p in [*DOCS, *sorted(REPO.glob("recipes/**/*.yaml"))]]
OUTSIDE = re.compile(r"(?<![\w.])/(?:work|home|tmp|root|Users)/|\bshared/|\bSTAPO\.md\b|\bENVIRONMENT\.md\b")
BACKTICKED = re.compile(r"`((?:benchmarks|docs|recipes|scripts|slurm|stapo_trl|tests|notebooks)/[\w./-]+)`")
EXAMPLE = REPO / "examples" / "python_api.py"


@pytest.mark.parametrize("doc, block", BLOCKS, ids=[f"{d.relative_to(REPO)}:{i}" for i, (d, _) in enumerate(BLOCKS)])
def test_every_bash_block_pastes(doc, block):
    # It parses; no `\` is followed by spaces or a comment; `stapo-train` on other data names its own --output_dir.
    checked = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True)
    assert checked.returncode == 0, f"{doc.name}: {checked.stderr}\n{block}"
    for line in block.splitlines():
        assert not re.search(r"\\[ \t]+(#.*)?$", line), f"{doc.name}: a continuation followed by something: {line}"
    for command in re.sub(r"\\\n", " ", block).splitlines():
        command = command.split(" #")[0]
        if re.search(r"\bstapo-train (?!compare)", command) and "--dataset_name" in command:
            assert "--output_dir" in command, f"{doc.name}: trains on other data in the recipe's folder: {command}"


def test_every_stapo_eval_command_on_a_tiny_model_fits_its_positions(tiny_math_model_path):
    # `stapo-eval --model outputs/demo-stapo` and `make evaluate` within the tiny model's 512 positions
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


@pytest.mark.parametrize("doc", SHIPPED_DOCS)
def test_shipped_docs_point_only_inside_the_repository(doc):
    text = (REPO / doc).read_text()
    outside = [m.group(0) for m in OUTSIDE.finditer(text)]
    assert not outside, f"{doc} points outside the repository: {outside}"
    folder = (REPO / doc).parent
    for target in re.findall(r"\]\(([^)\s#]+)", text):
        if not target.startswith(("http://", "https://", "mailto:")):
            resolved = (folder / target).resolve()
            assert resolved.is_relative_to(REPO) and resolved.exists(), f"{doc} links to a missing file: {target}"
    for target in BACKTICKED.findall(text):
        assert (REPO / target).exists(), f"{doc} names a missing file: {target}"


def test_readme_python_snippet_is_the_example_file():
    source = EXAMPLE.read_text()
    assert source in readme_code_blocks("python"), "README.md must show examples/python_api.py verbatim"
    assert any("--dataset_name" in block for doc, block in BLOCKS if doc.name == "README.md")  # the own-data example
    # The one-import switch, and the instruction the built-in model was trained with (or every reward is 0).
    assert "from stapo_trl import STAPOTrainer as GRPOTrainer" in source
    assigned = {node.targets[0].id: node.value for node in ast.parse(source).body if isinstance(node, ast.Assign)}
    assert ast.literal_eval(assigned["INSTRUCTION"]) == INSTRUCTION
    assert "# paper defaults (τ_p 0.002, q 0.75, DAPO loss); sets use_cpu=True, bf16=False without a GPU" in source
    calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call) and ast.unparse(n.func) == "GRPOConfig"]
    assert len(calls) == 1 and not {"use_cpu", "bf16"} & {keyword.arg for keyword in calls[0].keywords}
    config = STAPOConfig(output_dir="unused", report_to="none")  # on this machine (no accelerator), as in the example
    assert not has_accelerator() and (config.use_cpu, config.bf16) == (True, False)


@pytest.mark.slow  # a fresh process (imports ~7 s) and 20 STAPO steps
def test_python_api_example_runs_as_printed_and_stapo_plot_reads_its_folder(tiny_math_model_path, tmp_path):
    from stapo_trl.cli.plot import main as plot_main

    cache = str(builtin_cache_root(tiny_math_model_path))  # the file as printed, in a fresh folder
    env = subprocess_env(STAPO_TRL_CACHE=cache, PYTHONPATH=str(REPO), MPLBACKEND="Agg")
    output = run_subprocess([sys.executable, str(EXAMPLE)], timeout=300, env=env, cwd=tmp_path)
    # STAPOConfig sets `activation_checkpointing` itself: no deprecation of `gradient_checkpointing` at config time
    assert "`gradient_checkpointing` is deprecated" not in output.split("Loading weights")[0], output[-3000:]
    out = tmp_path / "outputs" / "python-api"
    rows = [row for row in read_metrics(str(out)) if "reward" in row]
    assert [row["step"] for row in rows] == list(range(2, 21, 2)) and all("s2t/silenced_ratio" in row for row in rows)
    assert max(row["reward"] for row in rows) > 0.0  # the prompts carry the model's instruction
    assert read_token_records(str(out)), "spurious_tokens.jsonl is empty"
    plot_main([str(out)])  # stapo-plot outputs/python-api
    assert (out / "training_curves.png").stat().st_size > 10_000


@pytest.mark.slow  # a fresh process (imports ~7 s) and 20 GRPO steps
def test_readme_grpo_baseline_on_a_builtin_model_runs_as_printed(tiny_math_model_path, tmp_path):
    # plain `GRPOTrainer` on a `builtin:` model (`resolve_model_path` gives the folder TRL loads), as printed
    (snippet,) = [
        b for b in readme_code_blocks("python", REPO / "docs" / "development.md") if "resolve_model_path(" in b
    ]
    assert "from trl import GRPOConfig, GRPOTrainer" in snippet and "torch.set_num_threads(1)" in snippet
    (tmp_path / "baseline.py").write_text(snippet)
    env = subprocess_env(STAPO_TRL_CACHE=str(builtin_cache_root(tiny_math_model_path)), PYTHONPATH=str(REPO))
    output = run_subprocess([sys.executable, "baseline.py"], timeout=600, env=env, cwd=tmp_path)
    assert "train_runtime" in output, output[-3000:]
    assert (tmp_path / "outputs" / "grpo-baseline" / "checkpoint-20" / "model.safetensors").is_file()
