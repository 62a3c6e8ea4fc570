"""The run folder: what a run writes (checkpoints with their run record and rollout, `metrics.jsonl`,
`spurious_tokens.jsonl`, the card) and what a resume trusts, with one writer at a time and no write through a link."""
