"""The command-line tools of `stapo_trl`: `stapo-train` (`train`, with `compare` and `--dry-run`), `stapo-eval`
(`eval`) and `stapo-plot` (`plot`), with the recipe arguments (`args`), the batch geometry (`geometry`) and the dry
run's checks (`recipe_checks`). The library (`stapo_trl.*`) never imports this package.
"""
