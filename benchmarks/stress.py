#!/usr/bin/env python
r"""A controlled spurious-token stress experiment for the S2T mask of STAPO.

    python benchmarks/stress.py                                   # design 1, 4 arms x 8 seeds x 400 steps
    python benchmarks/stress.py --design everywhere --arms low_entropy off --seeds 0 1 2 --steps 300
    python benchmarks/stress.py --seeds 0 --arms low_entropy off --attribution   # + token-level evidence

Natural spurious tokens are too rare on the demo model (~1e-4) for a mask to change anything, so this experiment puts
them in on purpose, where they are known. During rollouts only (never in evaluation), a position samples from
(1 - eps) pi + eps uniform over the vocabulary:
- design `post_answer` (eps 0.2): only once the generated text holds a closed `\boxed{...}`. The reward reads the last
  box, so this junk never changes the reward: every junk token inherits the advantage of the answer before it.
- design `everywhere` (eps 0.02): at every position.
The mixture is drawn as "with probability eps the position samples uniformly", so every position drawn from the
uniform part is known (the ground truth the mask is checked against).

Arms: `s2t_mode` low_entropy (STAPO), off, high_entropy, all_low_prob, all on [`~stapo_trl.STAPOTrainer`] with the
demo recipe (`recipes/demo/stapo.yaml`), so all arms share one trainer and one normaliser.

Held-out measurement, without noise: `--eval-problems` test problems x `--eval-samples`, T = 1, 48 new tokens:
accuracy, post-answer junk rate (completions with any text after their last closed box), the entropy of the policy
at the first position after the box, and the run's mean silenced ratio. Per arm: mean, standard deviation, and an
exact paired test against the `off` arm over seeds (sign test and sign-flip permutation test of the mean difference).

Token-level evidence (`--attribution`, and always the cheap part):
- every generation batch, the mask is recomputed from its inputs (p < tau_p in float64, the realised tau_h) and
  compared with the trainer's mask, separately at injected and at policy-sampled positions;
- every rollout batch, a probe: p(`}`), p(EOS) and the entropy right after `\boxed{<gold>}` on held-out problems;
- with `--attribution`, every optimizer step: the first-order change of the probe's mean log p(`}`) that each kind of
  token in the batch causes through Adam's update (answer tokens, injected junk, policy-sampled post-box tokens, EOS;
  split by advantage sign), summed over training.

Writes `benchmarks/results/<date>-stress[-<design>].md` and `.json` (raw per-seed values; rewritten after every run,
so an interrupted sweep keeps its finished runs). The exact command is in the file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import script_env  # noqa: I001 (first: the environment and sys.path, also when a test loads this file by path)
import torch  # noqa: E402
from stress_report import fill_brace_rate, write_report  # noqa: E402
from stress_trainer import (  # noqa: E402
    ARMS,
    DEFAULT_STEPS,
    DESIGNS,
    RECIPE,
    BracketProbe,
    StressTrainer,
    evaluate_junk,
)


RESULTS_DIR = script_env.REPO / "benchmarks" / "results"


# ---------------------------------------------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------------------------------------------

_PREPARED: dict[str, Any] = {}


def build_stress_trainer(arm: str, seed: int, steps: int, workdir: str) -> tuple:
    """A [`StressTrainer`] of the demo recipe with `s2t_mode=arm`, `seed` and `steps` (no checkpoints, no printing)."""
    from harness import build_trainer  # the benchmarks' one recipe-to-trainer path

    overrides = ["--max_steps", str(steps), "--seed", str(seed), "--s2t_mode", arm, "--eval_before_after", "false"]
    return build_trainer(RECIPE, overrides, workdir=workdir, trainer_class=StressTrainer)


def test_split():
    from stapo_trl.data import load_prompt_dataset

    if "test" not in _PREPARED:
        _PREPARED["test"] = load_prompt_dataset("builtin:tiny-math", split="test")
    return _PREPARED["test"]


def make_probe(tokenizer, num: int = 32, offset: int = 200) -> BracketProbe:
    """A [`BracketProbe`] on held-out problems `offset` ... `offset + num` (outside the evaluated ones)."""
    from stapo_trl.data import tiny_math_completion

    test = test_split()
    rows = test.select(range(offset, min(offset + num, len(test))))
    completions = []
    for prompt in rows["prompt"]:
        a, b = (int(x) for x in prompt[-1]["content"].split("\n")[0].strip().split("+")[:2])
        completions.append(tiny_math_completion(a, b))
    return BracketProbe(tokenizer, rows["prompt"], completions)


def evaluate_start(args) -> dict[str, Any]:
    """The held-out measurement of the SFT start (`builtin:tiny-math` before RL), with the seed of run 0."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stapo_trl.models import resolve_model_path

    path = resolve_model_path("builtin:tiny-math")
    test = test_split().select(range(args.eval_problems))
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    return evaluate_junk(
        model, tokenizer, test["prompt"], test["solution"], k=args.eval_samples, max_new_tokens=48, seed=1000
    )


def run_one(args, design: str, arm: str, seed: int, workdir: str) -> dict[str, Any]:
    trainer, _ = build_stress_trainer(arm, seed, args.steps, workdir)
    probe = make_probe(trainer.processing_class)
    attribution = args.attribution or seed in args.attribution_seeds
    trainer.setup_stress(args.eps, design, seed, attribution=attribution, probe=probe)
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    probe.record(trainer, trainer.state.global_step)
    test = test_split().select(range(args.eval_problems))
    measured = evaluate_junk(
        trainer.model,
        trainer.processing_class,
        test["prompt"],
        test["solution"],
        k=args.eval_samples,
        max_new_tokens=48,
        seed=1000 + seed,
    )
    logs = [h for h in trainer.state.log_history if "s2t/silenced_ratio" in h]
    silenced = [h["s2t/silenced_ratio"] for h in logs]
    return dict(
        design=design,
        arm=arm,
        seed=seed,
        steps=args.steps,
        eps=args.eps,
        train_seconds=wall,
        silenced_ratio_mean=statistics.mean(silenced) if silenced else float("nan"),
        reward_mean=statistics.mean(h["reward"] for h in trainer.state.log_history if "reward" in h),
        mask_stats=dict(trainer.mask_stats),
        bracket_counts=dict(trainer.bracket_counts),
        probe=probe.history,
        attribution_sums=dict(trainer.attribution_sums),
        attribution_steps=trainer.attribution_steps,
        **measured,
    )


# ---------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--design", choices=list(DESIGNS), default="post_answer")
    parser.add_argument("--eps", type=float, default=None, help="uniform mixing weight (default 0.2 / 0.02)")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=list(range(8)))
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (default 400 / 300)")
    parser.add_argument("--eval-problems", type=int, default=200)
    parser.add_argument("--eval-samples", type=int, default=4)
    parser.add_argument("--attribution", action="store_true", help="per-step attribution of the `}` probe (~2x time)")
    parser.add_argument(
        "--attribution-seeds", nargs="*", type=int, default=[], help="attribution for these seeds only"
    )
    parser.add_argument(
        "--merge", nargs="+", default=None, help="only write the report from these .json files of earlier runs"
    )
    parser.add_argument("--out", default=None, help="report path (default benchmarks/results/<date>-stress...md)")
    args = parser.parse_args(argv)
    args.eps = DESIGNS[args.design] if args.eps is None else args.eps
    args.steps = DEFAULT_STEPS[args.design] if args.steps is None else args.steps
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    command = "python benchmarks/stress.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    suffix = "" if args.design == "post_answer" else f"-{args.design}"
    out = Path(args.out) if args.out else RESULTS_DIR / f"{datetime.date.today().isoformat()}-stress{suffix}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.merge:
        runs, commands, start = [], [], None
        for name in args.merge:
            data = json.loads(Path(name).read_text())
            runs += data["runs"]
            commands += data["command"].split("\n")
            start = data.get("start") or start
        command = "\n".join(dict.fromkeys(commands + [command]))
        args.steps = runs[0]["steps"]
        start = start or evaluate_start(args)
        for run in runs:
            fill_brace_rate(run)
        out.with_suffix(".json").write_text(json.dumps(dict(command=command, start=start, runs=runs), indent=1))
        write_report(out, args, runs, command, start)
        print(out.read_text())
        return
    torch.set_num_threads(1)
    runs: list[dict] = []
    start = evaluate_start(args)
    with tempfile.TemporaryDirectory(prefix="stress-") as workdir:
        for seed in args.seeds:  # seed-major: every finished seed is a complete paired set
            for arm in args.arms:
                r = run_one(args, args.design, arm, seed, workdir)
                runs.append(r)
                print(
                    f"{args.design} {arm:<12} seed {seed}: acc {100 * r['accuracy']:.1f} % junk "
                    f"{100 * r['junk_rate']:.2f} % H_post {r['post_box_entropy']:.3f} silenced "
                    f"{100 * r['silenced_ratio_mean']:.3f} % p(}}) {r['probe'][-1]['p_close']:.2e} "
                    f"({r['train_seconds']:.0f} s, load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
                out.with_suffix(".json").write_text(
                    json.dumps(dict(command=command, start=start, runs=runs), indent=1)
                )
                write_report(out, args, runs, command, start)
    print(out.read_text())


if __name__ == "__main__":
    main()
