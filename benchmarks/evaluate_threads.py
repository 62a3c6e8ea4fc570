r"""`trainer.evaluate()` after `trainer.train()` on the built-in model, the thread count left to the library.

    python benchmarks/evaluate_threads.py                 # one fresh process: train, then evaluate; prints JSON
    python benchmarks/evaluate_threads.py --repeats 3     # evaluate() 3 times after the training

Trains the `examples/python_api.py` run (`builtin:tiny-math`, 20 steps of 16 completions) with 64 held-out tiny-math
problems as `eval_dataset` (open-r1's `do_eval`: 8 generations each, 16 completions per evaluation batch), then times
`evaluate()` after it. Nothing sets a thread count (no `OMP_NUM_THREADS`, no `torch.set_num_threads`): what each entry point
chose is printed beside its time. Run it on two checkouts to compare them (`PYTHONPATH=<checkout>`).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1, help="evaluate() calls after the training.")
    args = parser.parse_args()
    os.environ.pop("OMP_NUM_THREADS", None)
    from datasets import Dataset
    from transformers import TrainerCallback

    import stapo_trl
    from stapo_trl import STAPOConfig, STAPOTrainer
    from stapo_trl.data import format_prompt, make_tiny_math_dataset
    from stapo_trl.rewards import math_accuracy_reward

    class Threads(TrainerCallback):
        seen: dict[str, int] = {}

        def on_step_end(self, args, state, control, **kwargs):
            self.seen["train"] = torch.get_num_threads()

        def on_prediction_step(self, args, state, control, **kwargs):
            self.seen["evaluate"] = torch.get_num_threads()

    eval_dataset = make_tiny_math_dataset(num_train=8, num_test=64)["test"].select_columns(["prompt", "solution"])
    pairs = [(a, b) for a in range(10, 100, 9) for b in range(11, 100, 8)]  # examples/python_api.py's dataset
    train = Dataset.from_list([{"prompt": format_prompt(f"{a}+{b}"), "solution": str(a + b)} for a, b in pairs])
    config = STAPOConfig(
        output_dir=tempfile.mkdtemp(prefix="stapo-evaluate-"), max_steps=20, logging_steps=10,
        per_device_train_batch_size=16, per_device_eval_batch_size=16, num_generations=8, max_completion_length=48,
        learning_rate=1e-4, save_strategy="no", report_to="none", disable_tqdm=True,
    )  # fmt: skip
    threads = Threads()
    trainer = STAPOTrainer(
        "builtin:tiny-math", math_accuracy_reward, args=config, callbacks=[threads],
        train_dataset=train, eval_dataset=eval_dataset,
    )  # fmt: skip
    start = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - start
    evaluate_seconds = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        trainer.evaluate()
        evaluate_seconds.append(round(time.perf_counter() - start, 2))
    print(json.dumps({
        "stapo_trl": os.path.dirname(stapo_trl.__file__), "cores": len(os.sched_getaffinity(0)),
        "load_average": os.getloadavg()[0], "train_seconds": round(train_seconds, 2), "threads": threads.seen,
        "evaluate_seconds": evaluate_seconds, "threads_after": torch.get_num_threads(),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
