"""Worker options (_config.py): every option is checked at build time, naming the option;
WorkerConfig is built from a class plus overrides, frozen, comparable.

No Redis is touched: workers are built against a URL nothing listens on, and WorkerConfig
is also built directly.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

import streamwork as sw
from streamwork._worker.config import HELP, WorkerConfig, WorkerOptions, option_types
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
    ("batch_max", 0), ("batch_max", 10_001), ("batch_max", "10"), ("batch_max", True),
    ("batch_wait", -0.1), ("batch_wait", "0.1"), ("batch_wait", math.nan), ("batch_wait", 61.0),
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
    ("max_result_bytes", -1), ("max_result_bytes", 1.5), ("max_result_bytes", 2**40),
    ("partitions", 0), ("partitions", 1025), ("partitions", "6"), ("partitions", True),
    ("ordered", "yes"), ("ordered", 1), ("cancel_running", "yes"),
    ("rate_limit", "50"), ("rate_limit", "0/s"), ("rate_limit", 50),
    ("concurrency_per_key", 0), ("concurrency_per_key", "2"),
    ("catch_up", "sometimes"), ("catch_up", None), ("catch_up", "ALL"),
    ("priority_order", "fifo"), ("priority_order", None), ("priority_order", "Strict"),
    ("priority_weights", "8:2"), ("priority_weights", "8:0:1"), ("priority_weights", 8),
    ("priority_weights", "a:b:c"), ("priority_weights", "1:1:1001"),
    ("only_partitions", [1]), ("only_partitions", []), ("only_partitions", "0"),
    ("only_partitions", 0),
    ("stream", "{orders}:dead"),
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
    """from_url options override class attributes; the defaults are the documented ones."""
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


# ---- WorkerConfig itself (pure: no worker, no URL) ---------------------------------------


def test_options_are_declared_once_and_stream_worker_inherits_them() -> None:
    """Every option is declared in WorkerOptions only: StreamWorker inherits it (its class
    attribute is the default) and does not declare it again."""
    names = WorkerConfig.option_names()
    assert issubclass(sw.StreamWorker, WorkerOptions)
    assert names == tuple(option_types())
    assert "stream" in names and "concurrency" in names
    redeclared = [n for n in names if n in vars(sw.StreamWorker)]
    assert not redeclared, f"StreamWorker declares options again: {redeclared}"
    assert set(HELP) == set(names), "every option has one line of help, and only options do"


def test_defaults_equal_the_stream_worker_class_attributes() -> None:
    """A WorkerConfig given only stream and group holds StreamWorker's class attributes
    for every other option."""
    cfg = WorkerConfig(stream="orders", group="billing")
    for name in WorkerConfig.option_names():
        if name in ("stream", "group"):
            continue
        assert getattr(cfg, name) == getattr(sw.StreamWorker, name), name
    assert (cfg.stream, cfg.group) == ("orders", "billing")


def test_build_takes_a_class_attributes_and_overrides_win() -> None:
    """build(source, overrides) reads options from any object's attributes, lets the
    overrides replace them, fills the rest with defaults, and leaves the source alone."""
    class Source:
        stream = "orders"
        group = "billing"
        concurrency = 3
        dedup = False
        unrelated = "not an option"

    cfg = WorkerConfig.build(Source, {"concurrency": 7, "batch_size": 10})
    assert (cfg.stream, cfg.group, cfg.concurrency, cfg.batch_size, cfg.dedup) == (
        "orders", "billing", 7, 10, False)
    assert cfg.visibility_timeout == WorkerOptions.visibility_timeout
    assert not hasattr(cfg, "unrelated")
    assert Source.concurrency == 3
    assert WorkerConfig.build(Source(), {}) == WorkerConfig.build(Source, {})


@pytest.mark.parametrize("make", [
    lambda: WorkerConfig(stream="s", group="g", concurency=4),
    lambda: WorkerConfig.build(Plain, {"concurency": 4}),
], ids=["keywords", "build"])
def test_unknown_option_names_raise_naming_the_known_ones(make: Any) -> None:
    """An unknown option raises ConfigError naming it, and the message lists every known
    option, whether given as a keyword or as a build() override."""
    with pytest.raises(ConfigError) as info:
        make()
    assert info.value.option == "concurency"
    for name in WorkerConfig.option_names():
        assert name in str(info.value), name


@pytest.mark.parametrize("missing", ["stream", "group"])
def test_build_requires_stream_and_group(missing: str) -> None:
    """build() from a source without stream or group raises ConfigError naming the one
    missing and how to set it; so does a config built from keywords without it."""
    class Source:
        stream = "orders"
        group = "billing"

    setattr(Source, missing, "")
    with pytest.raises(ConfigError) as info:
        WorkerConfig.build(Source, {})
    assert info.value.option == missing
    assert f"{missing}=" in str(info.value)
    given = {"stream": "orders", "group": "billing"}
    del given[missing]
    with pytest.raises(ConfigError) as info:
        WorkerConfig(**given)
    assert info.value.option == missing


def test_dedup_horizon_is_checked_on_the_config_itself() -> None:
    """With dedup on, dedup_window must reach max_deliveries x (visibility_timeout +
    retry_max_delay): just below raises ConfigError naming dedup_window and the horizon,
    exactly at it is accepted, and with dedup off it is not checked."""
    opts: dict[str, Any] = {"stream": "s", "group": "g", "max_deliveries": 2,
                            "visibility_timeout": 1.5, "retry_max_delay": 2.5}
    horizon = 2 * (1.5 + 2.5)
    with pytest.raises(ConfigError) as info:
        WorkerConfig(**opts, dedup_window=horizon - 0.001)
    assert info.value.option == "dedup_window"
    assert f"{horizon:g}s" in str(info.value)
    assert WorkerConfig(**opts, dedup_window=horizon).dedup_window == horizon
    assert WorkerConfig(**opts, dedup=False, dedup_window=0.5).dedup is False


def test_config_is_frozen_after_build() -> None:
    """No option of a built config can be set, and a failed attempt changes nothing."""
    cfg = WorkerConfig(stream="s", group="g")
    for name in ("concurrency", "stream", "not_an_option"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(cfg, name, 1)
    assert cfg == WorkerConfig(stream="s", group="g")


def test_equal_configs_compare_and_hash_equal() -> None:
    """Configs with the same options are equal and hash alike; one differing option makes
    them unequal; a config never equals a plain mapping of its options."""
    a = WorkerConfig(stream="s", group="g", concurrency=4)
    b = WorkerConfig.build(Plain, {"stream": "s", "group": "g", "concurrency": 4})
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1
    assert a != WorkerConfig(stream="s", group="g", concurrency=5)
    assert a != a.as_dict()


def test_repr_lists_every_option_in_order_and_round_trips() -> None:
    """repr() names every option in declaration order, and evaluates back to an equal
    config."""
    cfg = WorkerConfig(stream="s", group="g", lock_urls=["redis://127.0.0.1:1/0"],
                       timeout=None)
    text = repr(cfg)
    assert text.startswith("WorkerConfig(stream='s', group='g', concurrency=16, ")
    positions = [text.index(f" {name}=") if i else text.index(f"({name}=")
                 for i, name in enumerate(WorkerConfig.option_names())]
    assert positions == sorted(positions)
    assert eval(text, {"WorkerConfig": WorkerConfig}) == cfg


def test_lock_urls_are_kept_as_a_tuple() -> None:
    """lock_urls given as a list are stored as a tuple, so the config stays hashable."""
    cfg = WorkerConfig(stream="s", group="g", lock_urls=["redis://a:1", "redis://b:1"])
    assert cfg.lock_urls == ("redis://a:1", "redis://b:1")
    assert isinstance(hash(cfg), int)


def test_derived_timings() -> None:
    """visibility_ms is the visibility timeout in whole ms (at least 1), the heartbeat comes
    every third of it, and reclaim sweeps every half of it up to 5 s unless set."""
    cfg = WorkerConfig(stream="s", group="g", visibility_timeout=3.0)
    assert cfg.visibility_ms == 3000
    assert cfg.heartbeat_interval == pytest.approx(1.0)
    assert cfg.reclaim_every == 1.5
    assert WorkerConfig(stream="s", group="g").reclaim_every == 5.0
    assert WorkerConfig(stream="s", group="g", reclaim_interval=0.25).reclaim_every == 0.25
    assert WorkerConfig(stream="s", group="g", visibility_timeout=0.05).visibility_ms == 50
