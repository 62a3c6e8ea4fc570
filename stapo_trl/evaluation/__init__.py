"""Evaluation for `stapo-eval` and `stapo-train`: benchmarks, avg@N and pass@k, generation, results files."""
