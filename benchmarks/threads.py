r"""How many torch threads train the built-in tiny models fastest, on 1 and 2 cores, idle and under load.

    python benchmarks/threads.py                        # every configuration below, then the table
    python benchmarks/threads.py --busy-cpu 0           # the same with a busy process on CPU 0 (made load)
    python benchmarks/threads.py --cores 0,1 --threads 1 2 4 --steps 6 --repeats 3

Each configuration is one child process pinned with `taskset -c CORES` (the parent's own affinity is not used), that
trains the `examples/python_api.py` run (`builtin:tiny-math`, 16 completions of up to 48 tokens per step, 2 prompts x
8 generations, the paper's STAPO defaults) for `--steps` optimizer steps at each thread count, `--repeats` times,
thread counts interleaved, after one warm-up step per thread count. A step's time is the wall time of `train()`
divided by its steps (the trainer is built outside the timing). The load average is read before and after each
child; `--busy-cpu` starts a pure-Python busy loop pinned to that CPU for the whole measurement (to make load when
the machine is idle).

Prints a Markdown table (median seconds per step, and each thread count's ratio to the fastest) and, with `--json`,
writes every measurement.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent


def _child(threads: list[int], steps: int, repeats: int) -> dict:
    """Train the python_api example at each thread count (in this process, pinned by the parent's taskset)."""
    import tempfile

    import torch
    from datasets import Dataset

    from stapo_trl import STAPOConfig, STAPOTrainer
    from stapo_trl.rewards import math_accuracy_reward

    instruction = "Please reason step by step, and put your final answer within \\boxed{}."
    pairs = [(a, b) for a in range(10, 100, 9) for b in range(11, 100, 8)]
    dataset = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": f"{a}+{b}\n{instruction}"}], "solution": str(a + b)}
            for a, b in pairs
        ]
    )
    out = tempfile.mkdtemp(prefix="stapo-threads-")

    def seconds_per_step(num_threads: int, num_steps: int) -> float:
        torch.set_num_threads(num_threads)
        config = STAPOConfig(
            output_dir=out,
            max_steps=num_steps,
            logging_steps=num_steps,
            per_device_train_batch_size=16,
            num_generations=8,
            max_completion_length=48,
            learning_rate=1e-4,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            s2t_write_run_files=False,
            use_cpu=True,
            bf16=False,
            activation_checkpointing=False,
        )
        trainer = STAPOTrainer("builtin:tiny-math", math_accuracy_reward, args=config, train_dataset=dataset)
        start = time.perf_counter()
        trainer.train()
        return (time.perf_counter() - start) / num_steps

    for n in threads:  # warm-up: first-call costs (allocator, kernels) out of the timings
        seconds_per_step(n, 1)
    runs: dict[str, list[float]] = {str(n): [] for n in threads}
    for _ in range(repeats):
        for n in threads:
            runs[str(n)].append(seconds_per_step(n, steps))
    return {"affinity": sorted(os.sched_getaffinity(0)), "seconds_per_step": runs}


def _busy_loop() -> None:  # a pure-Python spin: one fully busy core
    while True:
        pass


def _measure(cores: str, threads: list[int], steps: int, repeats: int) -> dict:
    command = ["taskset", "-c", cores, sys.executable, __file__, "--child", "--threads", *map(str, threads)]
    command += ["--steps", str(steps), "--repeats", str(repeats)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("OMP_NUM_THREADS", None)  # the thread count is set per run with torch.set_num_threads
    load_before = os.getloadavg()
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result.update(cores=cores, load_before=load_before, load_after=os.getloadavg())
    result["wall_seconds"] = round(time.perf_counter() - start, 1)
    return result


def _table(results: list[dict], label: str) -> str:
    lines = [
        "| cores | load avg (1 min) before -> after | torch threads | s/step (median) | runs | vs fastest |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        medians = {n: statistics.median(v) for n, v in r["seconds_per_step"].items()}
        fastest = min(medians.values())
        for n, values in r["seconds_per_step"].items():
            load = f"{r['load_before'][0]:.2f} -> {r['load_after'][0]:.2f}"
            runs = ", ".join(f"{v:.3f}" for v in values)
            lines.append(f"| {r['cores']} | {load} | {n} | {medians[n]:.3f} | {runs} | {medians[n] / fastest:.2f}x |")
    return f"### {label}\n\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cores", nargs="+", default=["0", "0,1"], help="taskset CPU lists, one child each.")
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2], help="torch thread counts to time.")
    parser.add_argument("--steps", type=int, default=4, help="Optimizer steps per timed run.")
    parser.add_argument("--repeats", type=int, default=2, help="Timed runs per thread count (interleaved).")
    parser.add_argument("--busy-cpu", type=int, default=None, help="Pin a busy loop to this CPU while measuring.")
    parser.add_argument("--label", default=None, help="Title of the table (default: idle or loaded, from the load).")
    parser.add_argument("--json", default=None, help="Also write every measurement to this JSON file.")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.threads, args.steps, args.repeats)))
        return
    busy = None
    if args.busy_cpu is not None:
        import multiprocessing

        busy = multiprocessing.Process(target=_busy_loop, daemon=True)
        busy.start()
        os.sched_setaffinity(busy.pid, {args.busy_cpu})
        time.sleep(5)  # let the load average see it
    try:
        results = [_measure(cores, args.threads, args.steps, args.repeats) for cores in args.cores]
    finally:
        if busy is not None:
            busy.terminate()
            busy.join()
    record = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "command": " ".join([Path(sys.executable).name, "benchmarks/threads.py", *(argv or sys.argv[1:])]),
        "busy_cpu": args.busy_cpu,
        "results": results,
    }
    label = args.label or (f"busy loop on CPU {args.busy_cpu}" if args.busy_cpu is not None else "as found")
    print(_table(results, label))
    print(f"\n{record['date']}, {record['machine']}, command: `{record['command']}`")
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
