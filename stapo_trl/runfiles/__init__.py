"""What a run writes and reads back: the callbacks that write `metrics.jsonl` and `spurious_tokens.jsonl`
(`callbacks`), the readers of those files (`metrics_log`), the figures (`plots`, `diagnostic_plots`, `token_labels`)
and the model card (`model_card`)."""
