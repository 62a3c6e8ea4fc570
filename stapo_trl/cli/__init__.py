"""The command-line tools of `stapo_trl`: `stapo-train` (`train`, the entry point; `run`, one training; `compare`;
`dry_run` with its `recipe_checks`), `stapo-eval` (`eval`) and `stapo-plot` (`plot`), with the recipe arguments
(`args`) and the batch geometry (`geometry`). The library (`stapo_trl.*`) never imports this package.
"""
