"""What a run writes and reads back: the callbacks that write `metrics.jsonl` and `spurious_tokens.jsonl`
(`callbacks`), the readers of those files (`metrics_log`; the figures are `stapo_trl.plots`) and
the model card (`model_card`); and what it prints while training: a compact line per logging step and the files
at the end (`console`), a warning when there is nothing to learn from (`learning_signal`), the checkpoint and resume
hint on Ctrl-C (`interrupt`); the folder's one writer and files never written through a link (`run_folder`), the
checkpoint a resume takes, whole (`checkpoints`), and what the run optimizes, compared on resume (`run_record`)."""
