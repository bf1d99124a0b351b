"""The public surface: DESIGN.md's names are exported from ``streamwork`` and importable."""

from __future__ import annotations

import importlib
import inspect

import pytest

import streamwork as sw
import streamwork.errors

DESIGN_NAMES = ["Producer", "AsyncProducer", "StreamWorker", "Message", "Redlock", "Retry",
                "DeadLetter", "StreamworkError", "LockNotAcquired"]


def test_all_holds_the_design_names() -> None:
    """streamwork.__all__ lists every public name of DESIGN.md, without duplicates."""
    missing = set(DESIGN_NAMES) - set(sw.__all__)
    assert not missing, f"missing from streamwork.__all__: {sorted(missing)}"
    assert len(sw.__all__) == len(set(sw.__all__))


@pytest.mark.parametrize("name", sorted(set(sw.__all__) - {"__version__"}))
def test_each_export_exists_and_its_module_imports(name: str) -> None:
    """Every name in __all__ is an attribute of streamwork whose defining module imports
    and holds the very same object."""
    obj = getattr(sw, name)
    module_name = getattr(obj, "__module__", None)
    assert module_name and module_name.startswith("streamwork"), (name, module_name)
    module = importlib.import_module(module_name)
    assert getattr(module, obj.__name__) is obj


def test_version_is_a_string() -> None:
    """streamwork.__version__ is a non-empty version string."""
    assert isinstance(sw.__version__, str) and sw.__version__


def test_errors_are_one_tree_and_exported_from_errors_too() -> None:
    """Every exception derives from StreamworkError; handler control flow is also in
    streamwork.errors (DESIGN.md: 'from streamwork.errors (also exported at the top level)')."""
    for name in sw.__all__:
        obj = getattr(sw, name)
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            assert issubclass(obj, sw.StreamworkError), name
    for name in ("Retry", "DeadLetter", "StreamworkError", "LockNotAcquired"):
        assert getattr(streamwork.errors, name) is getattr(sw, name)
    assert not issubclass(sw.Retry, (sw.errors.ConfigError, sw.errors.RedisUnavailable))


def test_retry_and_dead_letter_carry_their_arguments() -> None:
    """Retry(delay) and DeadLetter(reason) keep what the handler gave them."""
    assert sw.Retry().delay is None
    assert sw.Retry(delay=2.5).delay == 2.5
    assert sw.DeadLetter("card declined").reason == "card declined"
    with pytest.raises(sw.errors.ConfigError):
        sw.Retry(delay=-1)


def test_message_has_the_design_fields() -> None:
    """sw.Message carries id, stream, key, payload, attempt, enqueued_at, headers and
    fencing_token (None by default)."""
    msg = sw.Message(id="1-0", stream="s", key="k", payload={"a": 1}, attempt=1,
                     enqueued_at=1.0, headers={})
    for field in ("id", "stream", "key", "payload", "attempt", "enqueued_at", "headers",
                  "fencing_token"):
        assert hasattr(msg, field), field
    assert msg.fencing_token is None


def test_worker_class_attributes_are_the_design_defaults() -> None:
    """StreamWorker exposes DESIGN.md's class attributes with its defaults."""
    expected = {"stream": "", "group": "", "concurrency": 16, "visibility_timeout": 30.0,
                "max_deliveries": 5, "dedup": True, "dedup_window": 3600.0,
                "retry_delay": 1.0, "retry_max_delay": 300.0}
    for name, value in expected.items():
        assert getattr(sw.StreamWorker, name) == value, name
    for method in ("from_url", "run", "serve", "stop", "handle"):
        assert callable(getattr(sw.StreamWorker, method)), method
    assert inspect.iscoroutinefunction(sw.StreamWorker.serve)


def test_producers_have_twin_methods() -> None:
    """Producer and AsyncProducer both offer from_url, send and send_many (async on the
    async one)."""
    for method in ("from_url", "send", "send_many"):
        assert hasattr(sw.Producer, method) and hasattr(sw.AsyncProducer, method)
    assert inspect.iscoroutinefunction(sw.AsyncProducer.send)
    assert inspect.iscoroutinefunction(sw.AsyncProducer.send_many)
    assert not inspect.iscoroutinefunction(sw.Producer.send)
