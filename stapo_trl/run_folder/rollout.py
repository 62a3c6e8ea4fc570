from .logs import RolloutStateCallback, load_rollout_state, save_rollout_state  # noqa: F401 (moved to logs)
