"""Evaluation of math reasoning models for `stapo-eval` and `stapo-train`: `tasks` (the benchmarks), `metrics` (avg@N,
pass@k), `generation` (prompts, sampling with transformers or vLLM, grading), `results` (the results file, the tables).
Nothing is re-exported, so that importing one module does not import the others."""
