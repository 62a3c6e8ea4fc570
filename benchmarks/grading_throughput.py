"""Grading throughput of `stapo_trl.grading`: completions graded per second, in-process and with worker processes.

Writes `benchmarks/results/<YYYY-MM-DD>-grading.md` (and the raw numbers in a `.json` next to it).

What is graded: the golds of the real benchmark files (`../shared/data` from the repository root, or `--data-dir`;
MATH-500, Minerva, OlympiadBench, AIME24, AMC23), each against two completions: its own gold boxed (correct; mostly
the string fast path) and the next problem's gold boxed (wrong; goes through SymPy). Without the data files a small
built-in set of golds is used, and the table says so.

Sections:

1. completions graded per second, in one process (one thread), and with `--processes` worker processes
   (`stapo_trl.grading.configure_grader(processes=N)`) driven by N caller threads; plus the start-up time of the
   workers.
2. the wall time of one `math_accuracy_reward` call on 512 completions of which 1 % (5) are pathological
   (`10^{10^{10}}`, `2003^{2002^{2001}}`, ...), in-process and with the workers.

Run: `python benchmarks/grading_throughput.py [--data-dir DIR] [--limit N] [--processes N]`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stapo_trl import grading  # noqa: E402
from stapo_trl.evaluation.tasks import normalize_records, read_rows  # noqa: E402
from stapo_trl.rewards import math_accuracy_reward  # noqa: E402


FILES = [
    "math500/test.jsonl",
    "minerva/test.jsonl",
    "olympiadbench/test.jsonl",
    "aime24/test.jsonl",
    "amc23/test.jsonl",
]
BUILTIN_GOLDS = [r"\frac{1}{3}", r"2\sqrt{2}", "17", r"\frac{\pi}{4}", r"(1, 2)", r"x^2+1", "0.5", r"\{1,3\}"]
PATHOLOGICAL = [r"10^{10^{10}}", r"2003^{2002^{2001}}", r"(10^{7})!", r"9^{9^{9^{9}}}", r"\binom{10^{9}}{10^{5}}"]


def load_golds(data_dir: Path | None, limit: int) -> tuple[list, str]:
    if data_dir is not None and data_dir.is_dir():
        golds, used = [], []
        for rel in FILES:
            path = data_dir / rel
            if path.exists():
                problems = normalize_records(read_rows(path))[:limit]
                golds += [p.gold for p in problems]
                used.append(f"{rel} ({len(problems)})")
        if golds:
            return golds, f"real benchmark golds from `{data_dir}`: " + ", ".join(used)
    return BUILTIN_GOLDS * 10, "built-in golds (no benchmark data directory found): " + ", ".join(BUILTIN_GOLDS)


def boxed(gold) -> str:
    text = gold if isinstance(gold, str) else ", ".join(gold)
    return f"Working... so the final answer is \\boxed{{{text}}}."


def make_pairs(golds: list) -> list[tuple[str, object]]:
    pairs = []
    for i, gold in enumerate(golds):
        pairs.append((boxed(gold), gold))  # correct
        pairs.append((boxed(golds[(i + 1) % len(golds)]), gold))  # wrong (another problem's gold)
    return pairs


def grade_all(pairs, threads: int) -> tuple[float, dict]:
    grading.GRADER_STATS.clear()
    start = time.perf_counter()
    if threads <= 1:
        results = [grading.grade(c, g) for c, g in pairs]
    else:
        with ThreadPoolExecutor(threads) as pool:
            results = list(pool.map(lambda cg: grading.grade(*cg), pairs))
    elapsed = time.perf_counter() - start
    return elapsed, {
        "correct": sum(r.correct for r in results),
        "timeouts": sum(bool(r.error and r.error.startswith("timeout")) for r in results),
        "errors": sum(bool(r.error) for r in results),
    }


def reward_call(golds: list) -> dict:
    pairs = make_pairs(golds)
    completions = [pairs[i % len(pairs)][0] for i in range(512)]
    solution = [pairs[i % len(pairs)][1] for i in range(512)]
    for k, text in enumerate(PATHOLOGICAL):
        completions[k * 100 + 7] = f"\\boxed{{{text}}}"
    logged: dict = {}
    start = time.perf_counter()
    rewards = math_accuracy_reward(completions, solution, log_metric=lambda k, v: logged.__setitem__(k, v))
    elapsed = time.perf_counter() - start
    return {
        "wall_s": elapsed,
        "pathological_rewards": [rewards[k * 100 + 7] for k in range(len(PATHOLOGICAL))],
        "timeout_ratio": logged.get("grading/timeout_ratio"),
        "reward_sum": sum(r for r in rewards if r is not None),
    }


def wait_ready(timeout: float = 120.0) -> float:
    start = time.perf_counter()
    pool = grading.workers._POOL
    while pool is not None and pool._idle.qsize() < pool.size:
        if time.perf_counter() - start > timeout:
            break
        time.sleep(0.02)
    return time.perf_counter() - start


def git_rev() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True)
        return rev.stdout.strip() + ("+uncommitted changes" if dirty.stdout.strip() else "")
    except OSError:
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--limit", type=int, default=200, help="problems per benchmark file (default 200)")
    parser.add_argument("--processes", type=int, default=2, help="worker processes for the pool runs (default 2)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()

    load_start = os.getloadavg()
    golds, source = load_golds(args.data_dir, args.limit)
    pairs = make_pairs(golds)
    t0 = time.perf_counter()
    grading.grade(r"\boxed{1/2}", "0.5")  # one-time import of SymPy / math-verify (outside every bound)
    import_s = time.perf_counter() - t0

    rows = []
    # In-process: cold gold cache, then warm.
    for label in ("in-process, 1 thread, cold gold cache", "in-process, 1 thread, warm gold cache"):
        elapsed, counts = grade_all(pairs, 1)
        rows.append({"setting": label, "n": len(pairs), "s": elapsed, "per_s": len(pairs) / elapsed, **counts})
    reward_inproc = reward_call(golds)

    t0 = time.perf_counter()
    grading.configure_grader(processes=args.processes)
    wait_ready()
    startup_s = time.perf_counter() - t0
    for label, threads in (
        (f"{args.processes} worker processes, 1 caller thread", 1),
        (f"{args.processes} worker processes, {args.processes} caller threads", args.processes),
    ):
        elapsed, counts = grade_all(pairs, threads)
        rows.append({"setting": label, "n": len(pairs), "s": elapsed, "per_s": len(pairs) / elapsed, **counts})
    reward_pool = reward_call(golds)
    killed, started = grading.workers._POOL.killed, grading.workers._POOL.started
    grading.configure_grader(processes=0)
    load_end = os.getloadavg()

    date = datetime.date.today().isoformat()
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/grading_throughput.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    import math_verify
    import sympy

    lines = [
        f"# Grading throughput, {date}",
        "",
        f"- Command: `{command.strip()}`",
        f"- Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores online, "
        f"Python {platform.python_version()}; sympy {sympy.__version__}, math-verify "
        f"{getattr(math_verify, '__version__', '0.9.0')}; stapo_trl {git_rev()}",
        f"- Load average (1, 5, 15 min) at start: {', '.join(f'{x:.2f}' for x in load_start)}; at end: "
        f"{', '.join(f'{x:.2f}' for x in load_end)} (shared machine: absolute numbers are noisy)",
        f"- Golds: {source}; {len(pairs)} completions (each gold boxed: correct, and the next problem's gold "
        "boxed: wrong)",
        f"- Bound per grade call: `GRADE_TIMEOUT_S` = {grading.bound.GRADE_TIMEOUT_S} s. One-time import of SymPy / "
        f"math-verify in this process: {import_s:.2f} s (outside the bound).",
        "",
        "## 1. Completions graded per second",
        "",
        "| setting | completions | seconds | completions / s | correct | timeouts | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['setting']} | {r['n']} | {r['s']:.2f} | {r['per_s']:.0f} | {r['correct']} | {r['timeouts']} | "
        f"{r['errors']} |"
        for r in rows
    ]
    lines += [
        "",
        f"Worker start-up: {startup_s:.2f} s until all {args.processes} workers were ready (a fresh interpreter "
        "each, importing SymPy / latex2sympy / math-verify, not torch; in the background: calls made before the "
        "first worker is ready run in-process).",
        "",
        "## 2. One 512-completion reward call with 1 % pathological answers",
        "",
        "`math_accuracy_reward` on 512 completions cycling over the completions above (half correct), 5 of them "
        "replaced by " + ", ".join(f"`{p}`" for p in PATHOLOGICAL) + ".",
        "",
        "| setting | wall (s) | rewards of the 5 pathological | grading/timeout_ratio | reward sum |",
        "|---|---|---|---|---|",
        f"| in-process | {reward_inproc['wall_s']:.2f} | {reward_inproc['pathological_rewards']} | "
        f"{reward_inproc['timeout_ratio']:.4f} | {reward_inproc['reward_sum']:.0f} |",
        f"| {args.processes} worker processes | {reward_pool['wall_s']:.2f} | {reward_pool['pathological_rewards']} | "
        f"{reward_pool['timeout_ratio']:.4f} | {reward_pool['reward_sum']:.0f} |",
        "",
        "Pathological forms are refused before evaluation (counted as timeouts, scored 0.0). Worker processes "
        f"killed for overrunning the bound during the pool runs: {killed} (worker processes started in all, "
        f"replacements included: {started}).",
    ]
    path = args.out / f"{date}-grading.md"
    path.write_text("\n".join(lines) + "\n")
    (args.out / f"{date}-grading.json").write_text(
        json.dumps(
            {
                "source": source,
                "import_s": import_s,
                "rows": rows,
                "worker_startup_s": startup_s,
                "reward_in_process": reward_inproc,
                "reward_pool": reward_pool,
                "workers_killed": killed,
                "workers_started": started,
                "load_start": load_start,
                "load_end": load_end,
            },
            indent=2,
        )
        + "\n"
    )
    print("\n".join(lines))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
