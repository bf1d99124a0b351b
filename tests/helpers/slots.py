"""Redis Cluster hash slots, for tests that check where keys land (pure, no I/O).

Only tests need this (the library never computes a slot: it keeps every key of a stream
under the stream's hash tag and lets the server or redis-py route).
"""

from __future__ import annotations

CLUSTER_SLOTS = 16384  #: hash slots in a Redis Cluster


def key_slot(key: str | bytes) -> int:
    """Redis Cluster hash slot of ``key`` (CRC16/XMODEM of its hash tag, mod 16384).

    The hash tag is the text between the first ``{`` and the first ``}`` after it, when that
    text is not empty; otherwise the whole key is hashed (Redis Cluster spec)."""
    raw = key.encode() if isinstance(key, str) else key
    start = raw.find(b"{")
    if start != -1:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1 : end]
    crc = 0
    for byte in raw:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc % CLUSTER_SLOTS
