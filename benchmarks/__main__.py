"""``python -m benchmarks [--json] [--plot FILE.png] [--repeats N] [--jobs N] [--quick]
[--no-batch-handlers] [--no-recovery] [--peers] [--scaling]``."""

from benchmarks.cli import main

if __name__ == "__main__":
    main()
