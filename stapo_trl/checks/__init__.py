"""What is refused before a model is built: datasets without the columns a run needs (`dataset`), prompts longer than
the model takes (`prompt_length`), a Hub model or push without Hub access (`hub`), config values TRL checks late or
never (`training_values`, shared by `STAPOConfig` and `stapo-train`)."""
