"""Helpers shared by several test files (TRL's `tests/testing_utils.py` is the pattern): paths, rewards and prompts,
hand-built batches, files a run reads, and subprocess / multi-process runners. Fixtures live in `conftest.py`.

Nothing of the product is imported at module level: `tests/core/` uses these helpers too.
"""

import contextlib
import io
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback


REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
RECIPES_DIR = REPO / "recipes"
STAPO_RECIPE = str(RECIPES_DIR / "demo" / "stapo.yaml")
GRPO_RECIPE = str(RECIPES_DIR / "demo" / "grpo.yaml")  # STAPOTrainer with s2t_mode: off, the like-for-like baseline


# ---------------------------------------------------------------------------------------------------------------
# Rewards and prompts
# ---------------------------------------------------------------------------------------------------------------


def zero_reward(completions, **kwargs):
    return [0.0] * len(completions)


def length_reward(completions, **kwargs):
    """Varies within a group, so advantages are non-zero and the policy gets a gradient (plain-text or chat
    completions)."""
    return [float(len(c[0]["content"] if isinstance(c, list) else c) % 4) for c in completions]


def text_reward(completions, **kwargs):
    """Varies within a group (a random model's chat completions often all have the same length), so some advantages
    are positive and the policy gets a gradient."""
    return [float(sum(map(ord, c[0]["content"])) % 5) for c in completions]


# 64 chat prompts: a rollout batch of any test geometry finds enough of them.
PROMPTS = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}+{i % 7}"}]} for i in range(64)])


# ---------------------------------------------------------------------------------------------------------------
# Hand-built batches
# ---------------------------------------------------------------------------------------------------------------


def hand_s2t_batch():
    """Two completions of 5 tokens; completion 0 has A = +1, completion 1 has A = -1.

    Probabilities [0.001, 0.001, 0.5, 0.0005, 0.001] and entropies [0.1, 0.4, 0.2, 0.3, 2.0] in both rows; the last
    token is padding. With tau_p = 0.002 the candidates are row-0 tokens 0, 1, 3 (H = 0.1, 0.4, 0.3; token 2 has
    p = 0.5, token 4 is padding); row 1 has a negative advantage and no candidate.

    Returns (per_token_logps, entropies, advantages, loss_mask), the arguments of `s2t_mask` and `ablation_mask`.
    """
    probs = torch.tensor([[0.001, 0.001, 0.5, 0.0005, 0.001]] * 2)
    entropies = torch.tensor([[0.1, 0.4, 0.2, 0.3, 2.0]] * 2)
    loss_mask = torch.tensor([[1, 1, 1, 1, 0]] * 2)
    return probs.log(), entropies, torch.tensor([1.0, -1.0]), loss_mask


def hand_diagnostics_batch(prob_threshold=0.01):
    """Two completions, q = 0.5. Row 0 ("1+2=3", A = +1, 5 loss tokens): p = [0.5, 0.001, 0.002, 0.9, 0.005], H = [0.1,
    0.2, 0.9, 0.3, 0.5]: at tau_p = 0.01 the candidates are 1, 2, 4, tau_h = 0.5, position 1 ("+") silenced. Row 1
    (A = -1, 3 loss tokens + padding): never a candidate. Returns (s2t result, logps, H, advantages, loss mask, ids)."""
    from stapo_trl.core.s2t import s2t_mask

    logps = torch.log(torch.tensor([[0.5, 0.001, 0.002, 0.9, 0.005], [0.2, 0.0005, 0.3, 1e-9, 1e-9]]))
    entropies = torch.tensor([[0.1, 0.2, 0.9, 0.3, 0.5], [0.4, 0.05, 0.6, 99.0, 99.0]])
    loss_mask, advantages = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]), torch.tensor([1.0, -1.0])
    result = s2t_mask(logps, entropies, advantages, loss_mask, prob_threshold=prob_threshold, entropy_quantile=0.5)
    return result, logps, entropies, advantages, loss_mask, torch.tensor([[1, 2, 3, 4, 5], [5, 4, 3, 0, 0]])


def candidates_batch(entropies, logps=None):
    """One positive-advantage completion whose every token is a candidate (p = 0.001 < tau_p = 0.002)."""
    entropies = torch.as_tensor(entropies)
    per_token_logps = torch.full(entropies.shape, math.log(0.001)) if logps is None else torch.as_tensor(logps)
    return per_token_logps[None], entropies[None], torch.tensor([1.0]), torch.ones(1, entropies.numel())


def hand_scored_batch(vocab_size, seed=0, lengths=(5, 3, 4, 2), advantages=(1.0, -0.5, 2.0, 0.0)):
    """A scored micro-batch of 4 completions (3 prompt tokens, up to 5 completion tokens), as TRL hands it to the loss.

    With the defaults: advantages [+1, -0.5, +2, 0], completion lengths [5, 3, 4, 2] -> 14 loss tokens, 9 of them with
    A > 0.
    """
    generator = torch.Generator().manual_seed(seed)
    completion_mask = (torch.arange(5)[None] < torch.tensor(lengths)[:, None]).long()  # (4, 5)
    return {
        "prompt_ids": torch.randint(3, vocab_size, (4, 3), generator=generator),
        "prompt_mask": torch.ones(4, 3, dtype=torch.long),
        "completion_ids": torch.randint(3, vocab_size, (4, 5), generator=generator),
        "completion_mask": completion_mask,
        "advantages": torch.tensor(advantages),
        "num_items_in_batch": completion_mask.sum(),
    }


def policy_forward(trainer, batch):
    """(B, T) log-probs and entropies (nats) of the policy at the loss's temperature: TRL's own forward, run apart from
    the trainer under test."""
    from trl import GRPOTrainer

    with torch.no_grad():
        logps, entropies, _ = GRPOTrainer._get_per_token_logps_and_entropies(
            trainer,
            trainer.model,
            torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1),
            torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1),
            batch["completion_ids"].size(1),
            compute_entropy=True,
        )
    return logps, entropies


class KeepsLogpGrad:
    """Mixin for a trainer class: keeps the training forward's per-token log-probs (`probe_logps`), so that a test
    reads their gradient. Use as `class LogpProbe(KeepsLogpGrad, STAPOTrainer)`."""

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        forward = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if torch.is_grad_enabled():
            forward[0].retain_grad()
            self.probe_logps = forward[0]
        return forward


def is_scoring_forward(kwargs: dict) -> bool:
    """Whether a model forward with these keyword arguments is one of TRL's no-grad scoring forwards (log-probs of
    given completions), not a generation step: TRL >= 1.15 asks for its fused LM head (`fused_lm_head=True`), TRL
    1.9-1.14 for no cache (`use_cache=False`); generation steps use the cache."""
    return bool(kwargs.get("fused_lm_head") or kwargs.get("use_cache") is False) and not torch.is_grad_enabled()


class ForwardCounter:
    """Counts the no-grad scoring forwards ([`is_scoring_forward`]) of a model."""

    def __init__(self, model):
        self.count = 0
        model.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs):
        if is_scoring_forward(kwargs):
            self.count += 1


def no_activation_checkpointing() -> dict:
    """`{field: False}` for transformers' activation checkpointing under the name the installed release has
    (`activation_checkpointing` from 5.24; `gradient_checkpointing` before, and a deprecated alias after)."""
    from dataclasses import fields

    from transformers import TrainingArguments

    names = {f.name for f in fields(TrainingArguments)}
    return {"activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing": False}


def tiny_stapo_config(output_dir, **overrides):
    """The product's `STAPOConfig` for a few CPU steps of a tiny model: 4 completions per step (2 prompts x 2), no
    checkpoints, no trackers; `overrides` win. Built with warnings silenced (the tests check values, not TRL's
    notices)."""
    from stapo_trl import STAPOConfig

    settings = dict(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=False,  # bf16 on CPU is slow and not what the maths is checked in
        report_to=[],
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,  # why: a tiny model; short completions keep a step at ~0.1 s
        save_strategy="no",
    )
    settings.update(overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return STAPOConfig(**settings)


class SignalAtStep(TrainerCallback):
    """Send `signum` to this process once, at the end of `step` (what Ctrl-C in a terminal or a notebook does, or a
    scheduler's SIGTERM)."""

    def __init__(self, step: int, signum: int):
        self.step, self.signum, self.sent = step, signum, False

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)


# ---------------------------------------------------------------------------------------------------------------
# Files a run reads or writes, and what a command printed
# ---------------------------------------------------------------------------------------------------------------


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def addition_rows(n: int) -> list[dict]:
    """`n` rows in the demo recipe's columns (`problem` -> prompt, `answer` -> solution): 10+20=30, 11+21=32, ..."""
    return [{"problem": f"{10 + i}+{20 + i}", "answer": str(30 + 2 * i)} for i in range(n)]


def write_recipe(tmp_path: Path, text: str, base: str = STAPO_RECIPE) -> str:
    """`base` (the demo recipe) with `text` appended as `tmp_path/recipe.yaml`, the lines of `base` that set a key of
    `text` left out (a recipe that gives a key twice is refused)."""
    keys = {line.split(":")[0] for line in text.splitlines() if re.match(r"^\w+:", line)}
    kept = [line for line in Path(base).read_text().splitlines() if line.split(":")[0] not in keys]
    path = tmp_path / "recipe.yaml"
    path.write_text("\n".join(kept) + "\n" + text + "\n")
    return str(path)


class Hostile:
    """Unpickled, it runs `touch MARKER`: what a hostile `training_args.bin` or `optimizer.pt` holds."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def write_hostile_pickle(path: Path, marker: Path) -> None:
    """`path` replaced by a torch file (a whole zip archive) whose pickle would create `marker` if loaded unsafely."""
    torch.save({"state": Hostile(marker)}, path)


def write_metrics_run(folder: Path) -> str:
    """A run folder whose metrics.jsonl logged steps 1-3 (reward and entropy): enough for `stapo-plot`."""
    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl(folder / "metrics.jsonl", [{"step": s, "reward": 0.1 * s, "entropy": 0.5} for s in (1, 2, 3)])
    return str(folder)


def fake_eval_results(name: str, values: dict[str, float]) -> dict:
    """A `stapo-eval` results record of model `name`: avg@4 per benchmark at the paper's T 1.0 decoding."""
    tables = {b: {"avg@4": v, "n_samples": 4, "pass@k": {}} for b, v in values.items()}
    return {"model": {"name_or_path": name, "source": "hub"}, "results": {"t1.0-p1.0": tables}}


def error_line(capsys, prog: str) -> str:
    """The one `PROG: error: ...` line the command printed on stderr (and that it is the only error line)."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{prog}: error: "), err
    assert err.rstrip("\n").endswith(lines[0]), err  # the last thing printed: nothing after it
    return lines[0]


class LogRecords(list):
    """A logging handler's records, as a list of messages."""

    def handler(self):
        import logging

        records = self

        class Handler(logging.Handler):
            def emit(self, record):
                records.append(record.getMessage())

        return Handler(level=logging.DEBUG)


def readme_code_blocks(language: str, doc: Path = README) -> list[str]:
    """The fenced code blocks of `doc` (README.md by default) in `language`, each without its fences."""
    return re.findall(rf"^```{language}\n(.*?)^```$", doc.read_text(), flags=re.M | re.S)


def builtin_cache_root(model_path: str) -> Path:
    """The `STAPO_TRL_CACHE` under which `builtin:tiny-math` resolves to `model_path` (the session's built model), so
    that a subprocess naming `builtin:tiny-math` loads it instead of building it (~50 s)."""
    from stapo_trl.models import builtin_model_dir

    root = Path(model_path).parent
    if builtin_model_dir("tiny-math", root) != Path(model_path):
        pytest.skip(f"{model_path} is not a builtin:tiny-math cache entry (STAPO_TRL_TEST_MODEL names another folder)")
    return root


def run_card_quick_start(card_path: Path, expect: str) -> None:
    """Execute a model card's quick-start block as a reader would, and check it printed a completion."""
    card = card_path.read_text()
    code = card.split("## Quick start", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    assert expect in code and "device_map" not in code, code
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(card_path), "exec"), {})  # noqa: S102 (the card's own code, as a reader runs it)
    assert printed.getvalue().strip(), "the quick start printed nothing"


# ---------------------------------------------------------------------------------------------------------------
# Subprocesses and multi-process runs (each with a timeout: a hung collective fails the test, not the suite)
# ---------------------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        # why: two processes on two cores; more threads per process only oversubscribe
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


PORT_TAKEN = ("Address already in use", "EADDRINUSE")


def run_distributed(make_cmd, *, timeout: float, env: dict[str, str] | None = None, status: int = 0) -> str:
    """`run_subprocess(make_cmd(port))` on a free port; once more on a new port if another job took it meanwhile."""
    for attempt in range(2):
        retry_on = PORT_TAKEN * (attempt == 0)
        output = run_subprocess(make_cmd(free_port()), timeout=timeout, env=env, retry_on=retry_on, status=status)
        if output is not None:
            return output
    raise AssertionError("unreachable")


def run_subprocess(
    cmd: list[str],
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: Path = REPO,
    retry_on: tuple[str, ...] = (),
    status: int = 0,
) -> str | None:
    """Run `cmd` in its own process group; fail the test (printing the output) on another exit status or a timeout.

    Returns `None` instead of failing when the run failed and its output contains one of `retry_on`.
    """
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env or subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        print(output)
        pytest.fail(f"timed out after {timeout}s (a hung collective?): {' '.join(cmd)}\n{output[-5000:]}")
    if proc.returncode != status:
        if any(marker in output for marker in retry_on):
            return None
        print(output)
        pytest.fail(f"exit status {proc.returncode}: {' '.join(cmd)}\n{output[-5000:]}")
    return output


# Prepended to every torchrun worker: `report(*parts)` prints one result line with a single write(2). The ranks
# share one unbuffered pipe (PYTHONUNBUFFERED), where `print("label:", value)` is several writes that another rank's
# can split ("label:label: [] [] "); one write of under PIPE_BUF (4096) bytes arrives whole.
WORKER_REPORT = textwrap.dedent(
    r"""
    import os as _os

    def report(*parts):
        _os.write(1, (" ".join(map(str, parts)) + "\n").encode())
    """
)


def torchrun_launch(port: int, nproc: int = 2) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_addr", "127.0.0.1", "--master_port", str(port)]  # fmt: skip


def accelerate_launch(port: int, config: str = "cpu_2proc.yaml") -> list[str]:  # a free port: 29500 may be taken
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
            str(RECIPES_DIR / "accelerate_configs" / config), "--main_process_port", str(port)]  # fmt: skip


def run_torchrun(source: str, script: Path, *args: str, nproc: int, timeout: float = 600, launch=None, status=0):
    """Write `source` (with `WORKER_REPORT` before it: workers print their results with `report`) to `script` and
    run it on `nproc` local ranks under torchrun, or `launch(port)` (`run_distributed`: free port, timeout, output on
    another exit status than `status`)."""
    script.write_text(WORKER_REPORT + source)
    launch = launch or (lambda port: torchrun_launch(port, nproc))
    return run_distributed(lambda port: [*launch(port), str(script), *args], timeout=timeout, status=status)


# The demo recipe, shrunk for a 2-process CPU run.
SMALL_TWO_RANK_DEMO = [
    # why: 2 optimizer steps are enough to see a generation batch scored, masked and trained on by both ranks
    "--max_steps", "2",
    # why: 8 completions per rank x 2 ranks x steps_per_generation 4 = 64 completions, 8 prompt groups of 8
    "--per_device_train_batch_size", "8",
    # why: one log row for both steps, pooling the s2t/* counts of both updates' masks (one mask per optimizer
    # update)
    "--logging_steps", "2",
    "--eval_before_after", "false",
    "--save_strategy", "no",
    "--report_to", "none",
    "--disable_tqdm", "true",
    # why: the main process logs "Total train batch size (w. parallel, distributed & accumulation)" at info level
    "--log_level", "info",
]  # fmt: skip


def check_two_rank_demo_run(output: str, out: Path) -> None:
    # 8 completions per device x 2 processes x gradient_accumulation_steps 1: only two ranks make it 16.
    assert "Total train batch size (w. parallel, distributed & accumulation) = 16" in output, output[-3000:]
    rows = read_jsonl(out / "metrics.jsonl")
    assert rows, "no metrics.jsonl rows"
    for row in rows:
        for key in ("s2t/silenced_ratio", "s2t/candidate_ratio", "s2t/num_candidates", "loss", "reward"):
            assert key in row, (key, row)
        assert 0.0 <= row["s2t/silenced_ratio"] <= row["s2t/candidate_ratio"] <= 1.0
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    assert any("s2t/silenced_ratio" in entry for entry in state["log_history"])


# ---------------------------------------------------------------------------------------------------------------
# Stop signals: a reward that holds a training step while the test signals it
# ---------------------------------------------------------------------------------------------------------------

HELD_REWARD = textwrap.dedent(
    '''\
    """math_accuracy, held while the file HOLD (next to this module) exists: a call that finds it says so on stderr
    and waits until it is gone. The test's way to land signals inside a step: events, never timing."""
    import os, sys, time

    from stapo_trl.rewards import math_accuracy_reward

    HOLD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "HOLD")


    def held_accuracy(completions, solution, **kwargs):
        if os.path.exists(HOLD):
            sys.stderr.write(f"reward held on rank {os.environ.get('RANK', '0')}\\n")
            sys.stderr.flush()
            while os.path.exists(HOLD):
                time.sleep(0.05)
        return math_accuracy_reward(completions, solution, **kwargs)
    '''
)


def write_held_reward(folder: Path) -> Path:
    """`folder/held_reward.py` ([`HELD_REWARD`]; `--reward_funcs held_reward.held_accuracy` from `folder`); returns
    its HOLD file, which the test creates to hold the next scoring and removes to release it."""
    (folder / "held_reward.py").write_text(HELD_REWARD)
    return folder / "HOLD"


def read_until(proc: subprocess.Popen, prefix: str, count: int = 1, timeout: float = 300) -> list[str]:
    """`proc`'s output lines up to the `count`-th that starts with `prefix`. The process is killed and its lines shown
    when it ends first or no such line came within `timeout` seconds (checked at each line: a guard against a hang,
    not a bound on how fast the project is)."""
    import time

    lines, seen, deadline = [], 0, time.monotonic() + timeout
    for line in proc.stdout:
        lines.append(line)
        seen += line.startswith(prefix)
        if seen == count:
            return lines
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise AssertionError(f"no line starting with {prefix!r} (rc {proc.wait()}):\n{''.join(lines)[-3000:]}")
