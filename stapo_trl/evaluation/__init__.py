"""Evaluation of math reasoning models, shared by `stapo-eval` and the evaluations during training.

- `tasks`: the benchmark registry and the one loader that normalises every file layout to `BenchmarkProblem`.
- `metrics`: pass@k (unbiased) and avg@N.
- `generation`: prompts, the one sampling loop (transformers or vLLM) and grading.
- `results`: the results file, the paper-style table and `--compare`.

Nothing is re-exported here, so that importing one module does not import the others (transformers, datasets).
"""
