"""The run folder: checkpoints, run record, rollout state, run files and card; one writer, no write through a link."""
