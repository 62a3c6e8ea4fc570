"""`python -m stapo_trl.models NAME --output-dir DIR`: build one built-in model (the child process of a launched job)."""

from .build import main


main()
