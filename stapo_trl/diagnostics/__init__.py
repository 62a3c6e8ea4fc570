"""What stapo_trl measures around the S2T mask: the paper's ablation rules, diagnostics and per-token records."""
