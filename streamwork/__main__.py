"""``python -m streamwork`` runs the CLI."""

from streamwork._cli.main import main

main()
