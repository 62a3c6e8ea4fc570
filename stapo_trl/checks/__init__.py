"""What is refused before a model is built: datasets without the columns a run needs (`dataset`), prompts longer than
the model takes (`prompt_length`), a Hub model or push without Hub access (`hub`). Config values are checked by the
configs themselves ([`stapo_trl.config.check_training_values`])."""
