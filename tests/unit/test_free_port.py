"""`free_port`: a port nothing holds, never the same twice in one process, within
``STREAMWORK_FREE_PORTS`` when it is set (each pytest-xdist worker gets a band of its own)."""

from __future__ import annotations

import socket

import pytest

from streamwork._redis import server
from streamwork._redis.server import PORT_RANGE_ENV, free_port
from streamwork.errors import StreamworkError


def _band(monkeypatch: pytest.MonkeyPatch, width: int) -> range:
    """A band of ``width`` ports, none held now, set as the range (and none handed out
    yet: the process's memory of given ports starts afresh)."""
    monkeypatch.setattr(server, "_given", set())
    for start in range(40000, 41000, width):
        ports = range(start, start + width)
        if all(_free(p) for p in ports):
            monkeypatch.setenv(PORT_RANGE_ENV, f"{ports[0]}-{ports[-1]}")
            return ports
    pytest.fail("no band of free ports between 40000 and 41000")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_ports_stay_in_the_band_and_are_not_given_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    band = _band(monkeypatch, 4)
    got = [free_port() for _ in band]
    assert sorted(got) == list(band)
    with pytest.raises(StreamworkError, match="no free port left in STREAMWORK_FREE_PORTS"):
        free_port()


def test_a_held_port_is_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    band = _band(monkeypatch, 3)
    with socket.socket() as held:
        held.bind(("127.0.0.1", band[1]))
        held.listen()
        got = {free_port(), free_port()}
    assert got == {band[0], band[2]}


@pytest.mark.parametrize("raw", ["20000", "a-b", "30000-20000", "0-10", "20000-70000"])
def test_a_bad_range_says_what_to_give(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, raw)
    with pytest.raises(StreamworkError, match="STREAMWORK_FREE_PORTS"):
        free_port()
