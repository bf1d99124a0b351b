"""``python -m streamwork`` runs the CLI."""

from ._cli import main

main()
