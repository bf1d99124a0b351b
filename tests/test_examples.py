"""The examples run as documented (each starts its own private redis-server)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["quickstart", "billing_dedup", "embed_asyncio",
                                  "typed_payloads", "cancel_and_limits", "periodic",
                                  "function_worker"])
def test_example_script_runs(name: str) -> None:
    """Each example script exits 0 on its own private server."""
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / f"{name}.py")],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_billing_example_charges_each_order_once() -> None:
    """The fenced-billing example charges o-1 once although it was enqueued twice."""
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "billing_dedup.py")],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if "charged" in ln]
    assert len(lines) == 3 and all("once" in ln for ln in lines), proc.stdout


def test_fastapi_app_enqueues_and_its_worker_handles(redis_url: str, monkeypatch: Any) -> None:
    """The FastAPI example enqueues from a route and its lifespan worker mails it once."""
    from fastapi.testclient import TestClient

    import examples.fastapi_app as app_module
    from streamwork.testing import wait_for

    monkeypatch.setattr(app_module, "REDIS_URL", redis_url)
    app_module.Receipts.sent = []
    with TestClient(app_module.app) as client:
        for _ in range(2):  # a double click
            assert client.post("/orders/7/receipt").status_code == 200
        wait_for(lambda: client.get("/receipts/sent").json() == ["receipt-7"], 20,
                 message="the receipt to be sent")
    assert app_module.Receipts.sent == ["receipt-7"]
