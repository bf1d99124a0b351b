"""A delivery's arrival: a stream entry read by the worker, decoded and vetted into the
`Delivery` it holds, or into the reason it can never run. Pure: no Redis, no state."""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import Any

from streamwork._wire.codec import (
    ATTEMPTS_FIELD,
    BODY_FIELD,
    InvalidExt,
    decode_fields,
    parse_attempts,
)
from streamwork._wire.extensions import Codec
from streamwork._wire.message import Message, Sender
from streamwork._wire.payloads import InvalidPayload
from streamwork._worker.core.delivery import Delivery, State, ref
from streamwork._worker.core.options import CoreConfig
from streamwork.errors import DecodeError


@dataclass(frozen=True, slots=True)
class Unfit:
    """Why an entry can never run: it goes straight to the dead letters (and, when
    ``counter`` is set, bumps that counter)."""

    attempts: int
    reason: str
    error_type: str
    detail: str
    job_key: str = ""
    body: bytes = b""
    counter: str = ""


class Arrival:
    """Vets the entries one consumer reads (its settings, codec, payload converter and
    done-cache, fixed at start)."""

    def __init__(self, cfg: CoreConfig, consumer: str, initial: State,
                 codec: Codec | None = None, convert: Callable[[Any], Any] | None = None,
                 known: Container[str] | None = None, sender: Sender | None = None) -> None:
        self.cfg = cfg
        self.consumer = consumer
        self.initial = initial  # WAITING when a lease must be taken first, else QUEUED
        self.codec = codec
        self.convert = convert
        self.known = known  # job keys done here recently: acknowledged, never run
        self.sender = sender  # stages the jobs handlers send (msg.send)

    def vet(self, entry_id: bytes, values: list[bytes] | None, src: int,
            deliveries: int) -> Delivery | Unfit | None:
        """The `Delivery` of the entry ``entry_id`` (its flat fields ``values``, None when
        it was deleted while pending) delivered ``deliveries`` times, the reason it is
        `Unfit` to run, or None when its job is known to be done already."""
        cfg = self.cfg
        if values is None:
            return Unfit(deliveries, "deleted_while_pending", "",
                         "the entry was deleted from the stream while pending")
        body: bytes | None
        used: bytes | None
        if len(values) == 2 and values[0] == BODY_FIELD:  # what producers write
            body, used = values[1], None
        else:
            found = dict(zip(values[::2], values[1::2], strict=False))
            body, used = found.get(BODY_FIELD), found.get(ATTEMPTS_FIELD)
        try:
            job_key, enqueued_ms, headers, payload, options = decode_fields(
                body, cfg.max_payload_bytes, self.codec)
        except InvalidExt as exc:  # an ext value (a codec's type) did not decode
            assert body is not None
            return Unfit(parse_attempts(used) + deliveries, "payload:invalid",
                         "InvalidPayload", exc.detail, exc.key, body, "invalid_payload")
        except DecodeError as exc:  # logged once dead-lettered (see Outcomes)
            return Unfit(deliveries, exc.reason, "DecodeError", exc.detail,
                         counter="undecodable")
        assert body is not None
        attempt = parse_attempts(used) + deliveries if used else deliveries
        if attempt > cfg.max_deliveries:
            return Unfit(attempt - 1, "max_deliveries", "DeliveryLimit",
                         f"delivered {attempt} times, over max_deliveries="
                         f"{cfg.max_deliveries}; the process handling it died or stalled "
                         "each time", job_key, body)
        if self.known is not None and job_key in self.known:
            return None
        if self.convert is not None:
            try:
                payload = self.convert(payload)
            except InvalidPayload as exc:  # logged once dead-lettered (see Outcomes)
                return Unfit(attempt, "payload:invalid", "InvalidPayload", str(exc), job_key,
                             body, "invalid_payload")
        msg = Message(entry_id.decode(), cfg.stream, job_key, payload, attempt,
                      enqueued_ms / 1000, headers, None, cfg.group, self.consumer, options,
                      _sender=self.sender)
        return Delivery(entry_id, src, msg, body, options.get("timeout", cfg.timeout),
                        ref(src, entry_id), "", 0.0, self.initial, count=deliveries)
