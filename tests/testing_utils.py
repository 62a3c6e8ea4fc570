"""Helpers shared by test files (fixtures: `conftest.py`); nothing of the product is imported at module level."""

import contextlib
import io
import json
import logging
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import warnings
from dataclasses import fields
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback, TrainingArguments


REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
RECIPES_DIR = REPO / "recipes"
STAPO_RECIPE = str(RECIPES_DIR / "demo" / "stapo.yaml")
GRPO_RECIPE = str(RECIPES_DIR / "demo" / "grpo.yaml")  # STAPOTrainer with s2t_mode: off, the like-for-like baseline
PROMPTS = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}+{i % 7}"}]} for i in range(64)])
PORT_TAKEN = ("Address already in use", "EADDRINUSE")
# 2 CPU ranks: 2 steps of one rollout batch (8 x 2 x 4), one log row; info logs "Total train batch size"
SMALL_TWO_RANK_DEMO = ["--max_steps", "2", "--per_device_train_batch_size", "8", "--logging_steps", "2",
                       "--eval_before_after", "false", "--save_strategy", "no", "--report_to", "none",
                       "--disable_tqdm", "true", "--log_level", "info"]  # fmt: skip


def zero_reward(completions, **kwargs):
    return [0.0] * len(completions)


def length_reward(completions, **kwargs):  # varies within a group: non-zero advantages (plain text or chat)
    return [float(len(c[0]["content"] if isinstance(c, list) else c) % 4) for c in completions]


def text_reward(completions, **kwargs):  # varies even where a random model's chat completions have one length
    return [float(sum(map(ord, c[0]["content"])) % 5) for c in completions]


def hand_s2t_batch():
    """(logps, H, A = +1/-1, mask) of 2 rows, last token padding: tau_p 0.002 picks row 0's 0, 1, 3 (H .1 .4 .3)."""
    probs = torch.tensor([[0.001, 0.001, 0.5, 0.0005, 0.001]] * 2)
    entropies = torch.tensor([[0.1, 0.4, 0.2, 0.3, 2.0]] * 2)
    loss_mask = torch.tensor([[1, 1, 1, 1, 0]] * 2)
    return probs.log(), entropies, torch.tensor([1.0, -1.0]), loss_mask


def hand_diagnostics_batch(prob_threshold=0.01):
    """(s2t result, logps, H, A, mask, ids); q .5, tau_p .01: row 0's 1, 2, 4 candidates, tau_h .5, 1 silenced."""
    from stapo_trl.core.s2t import s2t_mask

    logps = torch.log(torch.tensor([[0.5, 0.001, 0.002, 0.9, 0.005], [0.2, 0.0005, 0.3, 1e-9, 1e-9]]))
    entropies = torch.tensor([[0.1, 0.2, 0.9, 0.3, 0.5], [0.4, 0.05, 0.6, 99.0, 99.0]])
    loss_mask, advantages = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]), torch.tensor([1.0, -1.0])
    result = s2t_mask(logps, entropies, advantages, loss_mask, prob_threshold=prob_threshold, entropy_quantile=0.5)
    return result, logps, entropies, advantages, loss_mask, torch.tensor([[1, 2, 3, 4, 5], [5, 4, 3, 0, 0]])


def candidates_batch(entropies, logps=None):  # one A > 0 completion, every token a candidate (p 0.001 < 0.002)
    entropies = torch.as_tensor(entropies)
    per_token_logps = torch.full(entropies.shape, math.log(0.001)) if logps is None else torch.as_tensor(logps)
    return per_token_logps[None], entropies[None], torch.tensor([1.0]), torch.ones(1, entropies.numel())


def hand_scored_batch(vocab_size, seed=0, lengths=(5, 3, 4, 2), advantages=(1.0, -0.5, 2.0, 0.0)):
    """A scored micro-batch as TRL hands it to the loss: 4 completions, 3 prompt tokens; 14 loss tokens, 9 A > 0."""
    generator = torch.Generator().manual_seed(seed)
    mask = (torch.arange(5)[None] < torch.tensor(lengths)[:, None]).long()  # (4, 5)
    prompt_ids, completion_ids = (torch.randint(3, vocab_size, (4, n), generator=generator) for n in (3, 5))
    return dict(prompt_ids=prompt_ids, prompt_mask=torch.ones(4, 3, dtype=torch.long), completion_ids=completion_ids,
                completion_mask=mask, advantages=torch.tensor(advantages), num_items_in_batch=mask.sum())  # fmt: skip


def policy_forward(trainer, batch):  # (B, T) log-probs and entropies by TRL's own forward, not the trainer's
    from trl import GRPOTrainer

    ids, mask = (torch.cat([batch[f"prompt_{k}"], batch[f"completion_{k}"]], dim=1) for k in ("ids", "mask"))
    with torch.no_grad():
        return GRPOTrainer._get_per_token_logps_and_entropies(
            trainer, trainer.model, ids, mask, batch["completion_ids"].size(1), compute_entropy=True
        )[:2]


class KeepsLogpGrad:  # trainer mixin: the training forward's per-token log-probs (and grad) as `probe_logps`
    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        forward = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if torch.is_grad_enabled():
            forward[0].retain_grad()
            self.probe_logps = forward[0]
        return forward


class ForwardCounter:  # a model's no-grad scoring forwards (`fused_lm_head=True` from TRL 1.15, else no cache)
    def __init__(self, model):
        self.count = 0
        model.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs):
        scoring = kwargs.get("fused_lm_head") or kwargs.get("use_cache") is False
        self.count += bool(scoring) and not torch.is_grad_enabled()


def no_activation_checkpointing() -> dict:  # under the installed transformers' name (`activation_...` from 5.24)
    names = {f.name for f in fields(TrainingArguments)}
    return {"activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing": False}


def tiny_stapo_config(output_dir, **overrides):  # a few CPU steps of 4 completions, no checkpoints, warnings off
    from stapo_trl import STAPOConfig

    settings = dict(output_dir=str(output_dir), use_cpu=True, bf16=False, report_to=[], per_device_train_batch_size=4,
                    num_generations=2, max_completion_length=8, save_strategy="no")  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return STAPOConfig(**settings | overrides)


class SignalAtStep(TrainerCallback):  # sends `signum` to this process once, at the end of `step`
    def __init__(self, step: int, signum: int):
        self.step, self.signum, self.sent = step, signum, False

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def addition_rows(n: int) -> list[dict]:  # in the demo recipe's columns: 10+20=30, 11+21=32, ...
    return [{"problem": f"{10 + i}+{20 + i}", "answer": str(30 + 2 * i)} for i in range(n)]


def write_recipe(tmp_path: Path, text: str, base: str = STAPO_RECIPE) -> str:  # `base` with `text`'s keys replaced
    keys = {line.split(":")[0] for line in text.splitlines() if re.match(r"^\w+:", line)}
    kept = [line for line in Path(base).read_text().splitlines() if line.split(":")[0] not in keys]
    path = tmp_path / "recipe.yaml"
    path.write_text("\n".join(kept) + "\n" + text + "\n")
    return str(path)


def write_hostile_pickle(path: Path, marker: Path) -> None:  # a torch file that touches `marker` if unpickled
    class Hostile:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    torch.save({"state": Hostile()}, path)


def write_metrics_run(folder: Path) -> str:  # metrics.jsonl of steps 1-3: enough for `stapo-plot`
    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl(folder / "metrics.jsonl", [{"step": s, "reward": 0.1 * s, "entropy": 0.5} for s in (1, 2, 3)])
    return str(folder)


def fake_eval_results(name: str, values: dict[str, float]) -> dict:  # `stapo-eval`'s record: avg@4 per benchmark
    tables = {b: {"avg@4": v, "n_samples": 4, "pass@k": {}} for b, v in values.items()}
    return {"model": {"name_or_path": name, "source": "hub"}, "results": {"t1.0-p1.0": tables}}


def error_line(capsys, prog: str) -> str:  # the one `PROG: error: ...` line on stderr, the last thing printed
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: ") and err.rstrip("\n").endswith(lines[0]), err
    return lines[0]


class LogRecords(list):  # a logging handler's records, as a list of messages
    def handler(self):
        handler = logging.Handler(level=logging.DEBUG)
        handler.emit = lambda record: self.append(record.getMessage())
        return handler


def readme_code_blocks(language: str, doc: Path = README) -> list[str]:  # fenced blocks, without their fences
    return re.findall(rf"^```{language}\n(.*?)^```$", doc.read_text(), flags=re.M | re.S)


def builtin_cache_root(model_path: str) -> Path:  # the STAPO_TRL_CACHE where builtin:tiny-math is `model_path`
    from stapo_trl.models import builtin_model_dir

    root = Path(model_path).parent
    if builtin_model_dir("tiny-math", root) != Path(model_path):
        pytest.skip(f"{model_path} is not a builtin:tiny-math cache entry (STAPO_TRL_TEST_MODEL names another folder)")
    return root


def run_card_quick_start(card_path: Path, expect: str) -> None:  # as a reader would; it must print a completion
    code = card_path.read_text().split("## Quick start", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    assert expect in code and "device_map" not in code, code
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(card_path), "exec"), {})  # noqa: S102 (the card's own code, as a reader runs it)
    assert printed.getvalue().strip(), "the quick start printed nothing"


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def subprocess_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1", **extra}  # fmt: skip


def run_subprocess(cmd, *, timeout: float, env: dict[str, str] | None = None, cwd: Path = REPO, status: int = 0):
    """`cmd`'s (or `cmd(port)`'s, retried once if the port was taken) output; fails on another status or a hang."""
    for attempt in range(2):
        args = cmd(free_port()) if callable(cmd) else cmd
        proc = subprocess.Popen(args, cwd=cwd, env=env or subprocess_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
        try:
            output = proc.communicate(timeout=timeout)[0]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"timed out after {timeout}s (a hung collective?): {args}\n{proc.communicate()[0][-5000:]}")
        if proc.returncode == status:
            return output
        if not (callable(cmd) and attempt == 0 and any(marker in output for marker in PORT_TAKEN)):
            pytest.fail(f"exit status {proc.returncode}: {' '.join(args)}\n{output[-5000:]}")


def torchrun_launch(port: int, nproc: int = 2) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_addr", "127.0.0.1", "--master_port", str(port)]  # fmt: skip


def accelerate_launch(port: int, config: str = "cpu_2proc.yaml") -> list[str]:  # a free port: 29500 may be taken
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
            str(RECIPES_DIR / "accelerate_configs" / config), "--main_process_port", str(port)]  # fmt: skip


def run_torchrun(source: str, script: Path, *args: str, nproc: int, timeout: float = 600, launch=None, status=0):
    """`source` on `nproc` ranks; its `report(*parts)` writes a line in one write(2): other ranks cannot split it."""
    report = (
        'import os as _os\n\n\ndef report(*parts):\n    _os.write(1, (" ".join(map(str, parts)) + "\\n").encode())\n'
    )
    script.write_text(report + source)
    launch = launch or (lambda port: torchrun_launch(port, nproc))
    return run_subprocess(lambda port: [*launch(port), str(script), *args], timeout=timeout, status=status)


def check_two_rank_demo_run(output: str, out: Path) -> None:
    assert "Total train batch size (w. parallel, distributed & accumulation) = 16" in output, output[-3000:]  # 2 ranks
    rows = read_jsonl(out / "metrics.jsonl")
    assert rows, "no metrics.jsonl rows"
    for row in rows:
        assert {"s2t/silenced_ratio", "s2t/candidate_ratio", "s2t/num_candidates", "loss", "reward"} <= set(row), row
        assert 0.0 <= row["s2t/silenced_ratio"] <= row["s2t/candidate_ratio"] <= 1.0
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and any("s2t/silenced_ratio" in entry for entry in state["log_history"])


def write_held_reward(folder: Path) -> Path:
    """`held_reward.held_accuracy` says "reward held on rank N" and waits while the returned HOLD file exists."""
    (folder / "held_reward.py").write_text("""import os, sys, time
from stapo_trl.rewards import math_accuracy_reward
HOLD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "HOLD")
def held_accuracy(completions, solution, **kwargs):
    if os.path.exists(HOLD):
        sys.stderr.write(f"reward held on rank {os.environ.get('RANK', '0')}\\n")  # one write: whole lines
        sys.stderr.flush()
        while os.path.exists(HOLD):
            time.sleep(0.05)
    return math_accuracy_reward(completions, solution, **kwargs)
""")
    return folder / "HOLD"


def read_until(proc: subprocess.Popen, prefix: str, count: int = 1, timeout: float = 300) -> list[str]:
    """`proc`'s lines up to the `count`-th starting with `prefix`; kills it if it ends first or hangs."""
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
