r"""Dry run of a recipe: parse it as `stapo-train` does, check it for a process count, print the plan; build nothing.

    stapo-train --config recipes/Qwen3-1.7B/stapo.yaml --dry-run                  # process count from the recipe
    stapo-train --config recipes/Qwen3-8B/stapo.yaml --dry-run --num-processes 16 # what if: 2 training nodes

Processes: `--num-processes`, else the recipe's `# launch: ... num_processes=N` line, else 1; Hub ids are not fetched.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass

from .args import recipe_parser
from .errors import EXIT_INPUT_ERROR, EXIT_STATUS_HELP, InputError, OneLineErrorParser, print_line
from .prepare import PreparedRun, benchmark_eval_error  # noqa: F401 (a name of this module too)


S2T_PATHS = {  # the core's `s2t_path`, in words, with its cost
    "loss": "the loss's own forward, detached (no extra forward)", "extra_forward": "one extra no-grad forward per "
    "rollout batch", "old_logps": "TRL's no-grad old-log-prob forward of the rollout batch (no extra forward)",
}  # fmt: skip


def read_launch_settings(recipe: str) -> dict[str, str]:
    """The recipe's `# launch: key=value ...` line as a dict (`{}` without one)."""
    with open(recipe, encoding="utf-8") as f:
        line = next((m.group(1) for text in f if (m := re.match(r"^#\s*launch:\s*(.*)$", text.strip()))), "")
    return dict(item.split("=", 1) for item in line.split() if "=" in item)


def fmt(n: float) -> str:
    return f"{int(n):,}" if float(n).is_integer() else f"{n:,.2f}"


@dataclass
class DryRunReport:
    """A recipe's steps in completions on `num_processes`, the plan's `lines`, `errors`, `warnings` and `notes`."""

    per_device_train_batch_size: int
    num_processes: int
    gradient_accumulation_steps: int
    num_generations: int
    steps_per_generation: int | None = None
    generation_batch_size: int | None = None
    recipe: str | None = None

    def __post_init__(self):
        self.lines, self.errors, self.warnings, self.notes = [], [], [], []
        self.global_micro_batch = micro = self.per_device_train_batch_size * self.num_processes
        if self.generation_batch_size is None:
            self.steps_per_generation = self.steps_per_generation or self.gradient_accumulation_steps
            self.generation_batch_size = micro * self.steps_per_generation
        else:
            self.steps_per_generation = self.generation_batch_size // micro
        self.completions_per_optimizer_step = micro * self.gradient_accumulation_steps
        self.prompts_per_rollout_step = self.generation_batch_size / self.num_generations
        self.prompts_per_optimizer_step = self.completions_per_optimizer_step / self.num_generations
        self.optimizer_steps_per_rollout_step = self.steps_per_generation / self.gradient_accumulation_steps

    ok = property(lambda self: not self.errors)

    def summary(self) -> str:
        where = self.recipe or "the command-line arguments (no --config)"
        status = "OK" if self.ok else f"FAILED ({len(self.errors)} error{'s' * (len(self.errors) != 1)})"
        width = max((len(label) for label, _ in self.lines), default=0)
        out = [f"Dry run of {where} for {self.num_processes} training process(es): {status}"]
        out += [f"  {label.ljust(width)}  {value}" for label, value in self.lines]
        for title, items in (("Errors", self.errors), ("Warnings", self.warnings), ("Notes", self.notes)):
            out += [f"{title}:", *(f"  - {item}" for item in items)] if items else []
        return "\n".join(out)


def dry_run_recipe(argv: list[str], num_processes: int | None = None, *, force_cpu: bool | None = None):
    """The [`DryRunReport`] of `argv` for `num_processes` (`None`: the recipe's `# launch:` value, else 1)."""
    parser, rest = recipe_parser(argv)  # the recipe is read and checked before torch is imported
    launch = read_launch_settings(parser.path) if parser.path else {}
    source = "the recipe's launch: line" if "num_processes" in launch else "default (no launch: line in the recipe)"
    source, n = ("--num-processes", num_processes) if num_processes else (source, int(launch.get("num_processes", 1)))
    import torch  # after the recipe's checks

    force_cpu = not torch.cuda.is_available() if force_cpu is None else force_cpu
    s, a, m = parser.parse(rest + ["--use_cpu", "true"] * force_cpu)
    given = set(parser.recipe) | parser.flags
    fixed = "generation_batch_size" in given and parser.recipe.get("generation_batch_size", 0) is not None
    r = DryRunReport(a.per_device_train_batch_size, n, a.gradient_accumulation_steps, a.num_generations,
                     a.steps_per_generation, a.generation_batch_size if fixed else None, parser.path)  # fmt: skip
    r.notes.append(f"process count {n} from {source}.")
    if force_cpu:  # bf16 is refused without a GPU; no batch arithmetic depends on use_cpu
        unset = "; bf16 is not set: False here, True on a GPU" if "bf16" not in given and a.bf16 is False else ""
        r.notes.append(f"parsed with use_cpu=True: this machine has no GPU{unset}.")
    _plan(r, PreparedRun(s, a, m, plan=r).run(), force_cpu)
    if "gradient_checkpointing" in given and "activation_checkpointing" in parser._option_string_actions:
        r.warnings.append("gradient_checkpointing is the deprecated transformers 5 alias (removed in v6): write "
                          "activation_checkpointing.")  # fmt: skip
    return r


def _plan(r: DryRunReport, p: PreparedRun, cpu_forced: bool) -> None:
    from ..core.stapo_config import s2t_path, s2t_settings, s2t_warnings

    s, a, m, n = p.s, p.a, p.m, r.num_processes
    batch, micro, per_device = r.generation_batch_size, r.global_micro_batch, r.per_device_train_batch_size
    completions, updates = r.completions_per_optimizer_step, r.optimizer_steps_per_rollout_step
    length, new_tokens = s.max_prompt_tokens or p.budget, a.max_completion_length  # longer prompts are dropped
    if is_stapo := s.trainer == "stapo":  # the parser's STAPOConfig
        s2t = s2t_settings(a, a._s2t_modes)
        mask = f"tau_p={s2t.prob_threshold}, q={s2t.entropy_quantile}, mode={s2t.mode}, tau_h per optimizer update"
        r.warnings += s2t_warnings(a, s2t, r.steps_per_generation, num_processes=n)  # the trainer's own warnings
    elif r.steps_per_generation % r.gradient_accumulation_steps:
        r.warnings.append(f"steps_per_generation={r.steps_per_generation} is not a multiple of "
                          f"gradient_accumulation_steps={r.gradient_accumulation_steps}: an optimizer update spans "
                          "two rollout batches.")  # fmt: skip
    epsilon = f"epsilon={a.epsilon}/{a.epsilon if a.epsilon_high is None else a.epsilon_high}"
    peft = f"LoRA r={m.lora_r}, alpha={m.lora_alpha}, targets={m.lora_target_modules}" if m.use_peft else "off"
    opened = "not opened: a Hub dataset" if p.total is None else f"checked: {p.total} rows"
    opened = "failed" if p.total is None and any(e.startswith("dataset_name=") for e in p.errors) else opened
    data = f"{s.dataset_name}{f' [{s.dataset_config}]' if s.dataset_config else ''} split {s.dataset_train_split}, "
    data += f"columns {s.prompt_column!r} -> {s.solution_column!r} ({opened})"
    data += "; DAPO 'Answer:' instruction stripped" * s.strip_dapo_instruction
    data += f"; prompts > {s.max_prompt_tokens} tokens dropped" if s.max_prompt_tokens else ""
    prompts = "not counted: the model is not here (a Hub id, or a builtin: model not built)"
    prompts = prompts if p.total is not None and p.model_path is None else None
    if p.kept is not None:
        prompts = f"{p.total - p.kept} of {p.total} training prompts exceed {p.budget} tokens and will be dropped"
        prompts = "unbounded (no max_prompt_tokens, no position limit)" if p.budget is None else prompts
    tokens = completions * (length + new_tokens) if length else None
    horizon = f"max_steps {a.max_steps}" if a.max_steps > 0 else f"num_train_epochs {a.num_train_epochs}"
    r.lines += [row for row in [
        ("trainer", f"stapo: STAPOTrainer, S2T mask {mask}" if is_stapo else f"{s.trainer}: GRPOTrainer, no S2T "
         f"mask{f', top_entropy_quantile={a.top_entropy_quantile}' * (a.top_entropy_quantile < 1)}"),
        ("objective", ", ".join([f"loss_type={a.loss_type}", epsilon,
                                 *(f"{k}={getattr(a, k)}" for k in ("beta", "entropy_coef", "scale_rewards"))])),
        ("model", f"{m.model_name_or_path} (dtype {m.dtype}, PEFT {peft})"),
        ("data", data),
        ("instruction", {None: "(default) the paper's step-by-step / \\boxed{} suffix", "": "(none)"}.get(
            s.instruction, f'"{s.instruction}"')),
        ("rewards", ", ".join(s.reward_funcs or []) + (f", weights {a.reward_weights}" if a.reward_weights else "")),
        ("prompt length", prompts),
        ("micro-step", f"per_device_train_batch_size {per_device} x {n} processes = {micro} completions"),
        ("rollout step", f"{fmt(batch)} completions = {fmt(r.prompts_per_rollout_step)} prompts x "
         f"{r.num_generations} generations (steps_per_generation {r.steps_per_generation})"),
        ("optimizer update", f"{fmt(completions)} completions = {fmt(r.prompts_per_optimizer_step)} prompts "
         f"(gradient_accumulation_steps {r.gradient_accumulation_steps})"),
        ("updates / rollout", f"{fmt(updates)} (steps_per_generation / gradient_accumulation_steps)"),
        ("max tokens", f"{fmt(tokens)} per optimizer update = {completions} x ({length} prompt + {new_tokens} "
         f"completion); {fmt(tokens * updates)} per rollout step" if length else
         f"unbounded prompts; completions alone up to {fmt(completions * new_tokens)} per update"),
        ("S2T p and H", S2T_PATHS[s2t_path(a, r.steps_per_generation)] if is_stapo else None),
        ("optimizer", f"{a.optim.value} lr {a.learning_rate:g} {a.lr_scheduler_type.value} (warmup_steps "
         f"{a.warmup_steps}), weight_decay {a.weight_decay}, max_grad_norm {a.max_grad_norm}, {horizon}"),
        ("precision", f"bf16={a.bf16}, activation_checkpointing="  # transformers < 5.24: the old name
         f"{getattr(a, 'activation_checkpointing', a.gradient_checkpointing)}"),
    ] if row[1] is not None]  # fmt: skip
    if batch % micro:  # a fixed generation_batch_size (the parse checked that it holds whole prompt groups)
        r.errors.append(f"generation_batch_size={batch} is not a multiple of the global micro-batch "
                        f"(per_device_train_batch_size {per_device} x {n} processes = {micro}). Valid process counts "
                        f"for this batch: {[k for k in range(1, batch + 1) if batch % (per_device * k) == 0]}; valid "
                        f"per_device_train_batch_size on {n} processes: "
                        f"{[d for d in range(1, batch + 1) if batch % (d * n) == 0]}. Or set steps_per_generation "
                        "instead of generation_batch_size.")  # fmt: skip
    _execution(r, s, a, length, cpu_forced)


def _execution(r: DryRunReport, s, a, length: int | None, cpu_forced: bool) -> None:
    n, new_tokens, warn, error = r.num_processes, a.max_completion_length, r.warnings.append, r.errors.append
    sampling = f"T={a.temperature}, top_p={a.top_p}, top_k={a.top_k}, max_completion_length {new_tokens}"
    tp, max_len, server = a.vllm_tensor_parallel_size, a.vllm_max_model_length, a.use_vllm and a.vllm_mode == "server"
    where = a.vllm_server_base_url or f"{a.vllm_server_host}:{a.vllm_server_port}"
    colocated = f"tensor parallel {tp}, gpu_memory_utilization {a.vllm_gpu_memory_utilization}"
    generation = f"vLLM colocated in every training process ({colocated})" if a.use_vllm else "transformers generate"
    generation = f"vLLM server at {where} (weight sync port {a.vllm_group_port})" if server else generation
    r.lines.append(("generation", f"{generation}{'' if a.use_vllm else ' (no vLLM)'}; {sampling}"))
    if server and a.vllm_server_base_url is None and a.vllm_server_host not in ("127.0.0.1", "localhost", "::1"):
        warn(f"vllm_server_host={a.vllm_server_host!r} is not a loopback address: the trainer expects a vLLM "
             "server there (scripts/launch.sh serves on 127.0.0.1; slurm/train.slurm sets the vLLM node's "
             "address).")  # fmt: skip
    if a.use_vllm and not server and n % tp:
        error(f"vllm_tensor_parallel_size={tp} does not divide the {n} training processes (colocate mode groups them "
              f"into tensor-parallel blocks). Valid values: {[d for d in range(1, n + 1) if not n % d]}.")  # fmt: skip
    if a.use_vllm and not server and max_len is not None and length and max_len < length + new_tokens:
        error(f"vllm_max_model_length={max_len} < max_prompt_tokens {length} + max_completion_length {new_tokens}: "
              "long rollouts would be cut by vLLM.")  # fmt: skip
    if server and cpu_forced:
        warn("vllm_mode='server': the weight sync to the server is CUDA-only (NCCL); this recipe needs GPUs.")
    elif not cpu_forced:
        from ..integrations.vllm_support import check_vllm_args  # torch: after the recipe's checks

        try:
            check_vllm_args(a)  # the trainer's own refusal: a vLLM server on a CPU-only run
        except ValueError as e:
            error(str(e))
    trackers = ("wandb", "tensorboard", "trackio", "comet_ml", "mlflow", "clearml", "dvclive", "swanlab")
    missing = ["vllm"] * a.use_vllm + [t for t in a.report_to or [] if t in trackers]
    if missing := [name for name in missing if importlib.util.find_spec(name) is None]:
        warn(f"{missing} named by use_vllm or report_to but not installed here: install where the job runs.")
    save = f"every {a.save_steps} optimizer steps (keep {a.save_total_limit or 'all'})"
    save = save if a.save_strategy == "steps" else a.save_strategy.value
    output = f"{a.output_dir}; checkpoints {save}; report_to {a.report_to}; push_to_hub={a.push_to_hub}"
    r.lines.append(("output", output))
    if a.use_cpu and a.bf16 and not cpu_forced:
        warn("bf16=True on CPU is about 2.3x slower than float32: set bf16: false for CPU runs.")
    geometry = (r.prompts_per_rollout_step, r.prompts_per_optimizer_step, r.num_generations)
    if "dapo-math" in str(s.dataset_name).lower() and geometry != (256, 64, 8):  # STAPO Sec. 4.1
        warn(f"the paper's data (DAPO-Math) with another batch geometry: {r.prompts_per_rollout_step:g} prompts x "
             f"{r.num_generations} rollouts per rollout step and {r.prompts_per_optimizer_step:g}-prompt updates for "
             f"{n} process(es), vs the paper's 256 x 8 and 64. recipes/README.md gives per_device_train_batch_size / "
             "gradient_accumulation_steps / steps_per_generation that keep the paper's for 4, 8, 16 and 32 "
             "processes.")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Print the plan; 0 when the recipe passes, else 2 with one `stapo-train --dry-run: error: ...` line."""
    pre = OneLineErrorParser(prog=(prog := "stapo-train --dry-run"), add_help=False, allow_abbrev=False)
    pre.add_argument("--num-processes", "--num_processes", dest="num_processes", type=int, default=None)
    pre.add_argument("-h", "--help", action="store_true")
    pre.add_argument("--dry-run", "--dry_run", action="store_true")  # stapo-train's flag, harmless here
    try:
        known, rest = pre.parse_known_args(list(sys.argv[1:] if argv is None else argv))
        if known.help:
            print(__doc__ + "\n" + EXIT_STATUS_HELP)
            return 0
        if known.num_processes is not None and known.num_processes < 1:
            raise ValueError(f"--num-processes: {known.num_processes} is not a number of training processes: give a "
                             "positive integer (one per GPU, vLLM server GPUs excluded).")  # fmt: skip
        report = dry_run_recipe(rest, known.num_processes)
    except (InputError, ValueError, OSError) as e:
        return print_line(getattr(e, "message", f"{prog}: error: {e}")) or EXIT_INPUT_ERROR
    print(report.summary())
    if errors := report.errors:
        first = f"; the first: {errors[0]}" if len(errors) > 1 else f": {errors[0]}"
        print_line(f"{prog}: error: {len(errors)} check(s) failed (the plan above lists them){first}")
    return EXIT_INPUT_ERROR if errors else 0


if __name__ == "__main__":
    sys.exit(main())
