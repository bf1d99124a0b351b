"""``python -m benchmarks [--json] [--plot FILE.png] [--repeats N] [--jobs N] [--quick]``."""

from streamwork.bench import cli_main

if __name__ == "__main__":
    cli_main()
