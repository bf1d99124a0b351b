"""Worker options (config.py): every option is checked at build time, naming the option.

No Redis is touched: workers are built against a URL nothing listens on.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

import streamwork as sw
from streamwork._config import WorkerConfig
from streamwork.errors import ConfigError

DEAD_URL = "redis://127.0.0.1:1/0"  # never contacted: building a worker must not connect


class Plain(sw.StreamWorker):
    stream = "orders"
    group = "billing"

    async def handle(self, msg: sw.Message) -> None:
        pass


BAD_VALUES: list[tuple[str, Any]] = [
    ("concurrency", 0), ("concurrency", -1), ("concurrency", 10_001), ("concurrency", 1.5),
    ("concurrency", "4"), ("concurrency", True), ("concurrency", None),
    ("max_deliveries", 0), ("max_deliveries", 2.0), ("max_deliveries", False),
    ("batch_size", 0), ("batch_size", 10_001), ("batch_size", "100"),
    ("max_payload_bytes", 10), ("max_payload_bytes", 1.0e6),
    ("local_cache_size", -1), ("local_cache_size", 1.5),
    ("visibility_timeout", 0), ("visibility_timeout", -1.0), ("visibility_timeout", "30"),
    ("visibility_timeout", math.nan), ("visibility_timeout", True),
    ("dedup_window", 0), ("dedup_window", -5.0), ("dedup_window", "1h"),
    ("retry_delay", -0.1), ("retry_delay", math.nan), ("retry_delay", "1"),
    ("retry_max_delay", -1.0), ("retry_max_delay", "300"),
    ("read_block", 0), ("read_block", 6.0), ("read_block", -1),
    ("drain_timeout", -1.0), ("drain_timeout", "x"),
    ("consumer_idle_timeout", 0.5), ("consumer_idle_timeout", None),
    ("local_cache_ttl", -1.0),
    ("lock_urls", ("http://127.0.0.1:1",)),
    ("lock_urls", "redis://127.0.0.1:1"),
    ("reclaim_interval", 0.0), ("reclaim_interval", -1.0), ("reclaim_interval", "5"),
    ("retention", -1.0), ("retention", "1d"),
    ("timeout", 0), ("timeout", -1.0), ("timeout", "5m"), ("timeout", math.inf),
    ("dedup", 1), ("dedup", "yes"), ("dedup", None),
    ("heartbeat", 0), ("heartbeat", "no"),
    ("stream", ""), ("stream", "a b"), ("stream", "a{b"), ("stream", 5),
    ("group", "has space"), ("group", "{g}"), ("group", "x" * 201), ("group", 7),
]


def test_every_option_has_a_bad_value_case() -> None:
    """The table above covers every option WorkerConfig knows (a new option needs a row)."""
    covered = {name for name, _ in BAD_VALUES}
    assert set(WorkerConfig.option_names()) <= covered


@pytest.mark.parametrize(("option", "value"), BAD_VALUES,
                         ids=[f"{o}={v!r}"[:40] for o, v in BAD_VALUES])
def test_bad_value_raises_config_error_naming_the_option(option: str, value: Any) -> None:
    """A bad option value raises ConfigError (a ValueError) whose option and text name it."""
    overrides = {option: value}
    if option == "dedup_window":
        overrides["dedup"] = False  # so only the value itself is at fault
    with pytest.raises(ConfigError) as info:
        Plain.from_url(DEAD_URL, **overrides)
    assert info.value.option == option
    assert str(info.value).startswith(f"{option}:")
    assert isinstance(info.value, ValueError) and isinstance(info.value, sw.StreamworkError)


@pytest.mark.parametrize("option", ["visibility_timeout", "dedup_window", "retry_delay",
                                    "retry_max_delay", "consumer_idle_timeout", "retention",
                                    "timeout"])
def test_infinite_durations_are_rejected(option: str) -> None:
    """inf is refused where the value is turned into milliseconds (it cannot be)."""
    overrides: dict[str, Any] = {option: math.inf, "dedup": False}
    if option == "retry_delay":
        overrides["retry_max_delay"] = math.inf
    with pytest.raises(ConfigError) as info:
        Plain.from_url(DEAD_URL, **overrides)
    assert info.value.option == option


def test_bad_class_attribute_is_checked_like_an_override() -> None:
    """A bad value set as a class attribute raises when the worker is built."""
    class Bad(Plain):
        concurrency = 0

    with pytest.raises(ConfigError) as info:
        Bad.from_url(DEAD_URL)
    assert info.value.option == "concurrency"


def test_unknown_option_is_rejected_with_the_known_ones() -> None:
    """An unknown keyword raises ConfigError naming it and listing the known options."""
    with pytest.raises(ConfigError) as info:
        Plain.from_url(DEAD_URL, concurency=4)
    assert info.value.option == "concurency"
    assert "concurrency" in str(info.value)


@pytest.mark.parametrize("missing", ["stream", "group"])
def test_stream_and_group_are_required(missing: str) -> None:
    """A worker without stream or group raises ConfigError naming the missing one."""
    class NoName(sw.StreamWorker):
        stream = "orders"
        group = "billing"

    setattr(NoName, missing, "")
    with pytest.raises(ConfigError) as info:
        NoName.from_url(DEAD_URL)
    assert info.value.option == missing


def test_bad_consumer_name_is_rejected() -> None:
    """An explicit consumer name is checked like a group name."""
    with pytest.raises(ConfigError) as info:
        Plain(DEAD_URL, consumer="a b")
    assert info.value.option == "consumer"


@pytest.mark.parametrize("url", ["http://localhost:6379", "localhost:6379", "mysql://x"])
def test_bad_url_scheme_is_rejected(url: str) -> None:
    """A URL without a known scheme raises ConfigError naming 'url'."""
    with pytest.raises(ConfigError) as info:
        Plain.from_url(url)
    assert info.value.option == "url"


def test_overrides_replace_class_attributes_and_defaults_match_design() -> None:
    """from_url options override class attributes; the defaults are DESIGN.md's."""
    w = Plain.from_url(DEAD_URL, concurrency=3, visibility_timeout=12.5, dedup=False)
    assert (w.config.concurrency, w.config.visibility_timeout, w.config.dedup) == (3, 12.5, False)
    d = Plain.from_url(DEAD_URL).config
    assert (d.concurrency, d.visibility_timeout, d.max_deliveries, d.dedup, d.dedup_window,
            d.retry_delay, d.retry_max_delay) == (16, 30.0, 5, True, 3600.0, 1.0, 300.0)
    assert (d.stream, d.group) == ("orders", "billing")


def test_config_is_frozen() -> None:
    """A built config cannot be changed afterwards."""
    cfg = Plain.from_url(DEAD_URL).config
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.concurrency = 99  # type: ignore[misc]


def test_retry_max_delay_must_not_be_below_retry_delay() -> None:
    """retry_max_delay below retry_delay is refused, naming retry_max_delay."""
    with pytest.raises(ConfigError) as info:
        Plain.from_url(DEAD_URL, retry_delay=5.0, retry_max_delay=1.0)
    assert info.value.option == "retry_max_delay"


def test_dedup_window_must_cover_the_redelivery_horizon() -> None:
    """With dedup on, dedup_window < max_deliveries x (visibility_timeout + retry_max_delay)
    raises ConfigError naming dedup_window; at the horizon it is accepted."""
    opts = {"max_deliveries": 4, "visibility_timeout": 10.0, "retry_max_delay": 15.0}
    horizon = 4 * (10.0 + 15.0)
    with pytest.raises(ConfigError) as info:
        Plain.from_url(DEAD_URL, dedup=True, dedup_window=horizon - 0.5, **opts)
    assert info.value.option == "dedup_window"
    assert "100" in str(info.value)  # the horizon it has to reach is in the message
    assert Plain.from_url(DEAD_URL, dedup=True, dedup_window=horizon, **opts)
    # the class defaults themselves must pass: 5 x (30 + 300) = 1650 <= 3600
    assert Plain.from_url(DEAD_URL).config.dedup_window == 3600.0


def test_dedup_window_horizon_not_checked_with_dedup_off() -> None:
    """With dedup off a short dedup_window is irrelevant and accepted."""
    assert Plain.from_url(DEAD_URL, dedup=False, dedup_window=1.0).config.dedup is False


def test_default_windows_fail_horizon_when_retry_cap_is_large() -> None:
    """Raising only retry_max_delay past the default window is caught at build time."""
    with pytest.raises(ConfigError) as info:
        Plain.from_url(DEAD_URL, retry_max_delay=1000.0)
    assert info.value.option == "dedup_window"
