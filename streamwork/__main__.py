"""``python -m streamwork`` runs the CLI."""

from .cli import main

main()
