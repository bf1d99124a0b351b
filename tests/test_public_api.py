"""The public surface: ``streamwork.__all__`` and ``streamwork.errors.__all__`` are pinned,
every name imports from where it should, and ``import streamwork`` stays cheap."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import streamwork as sw
import streamwork.errors

#: streamwork.__all__, pinned: a name added to or dropped from the public API fails here
PUBLIC = [
    "AsyncHeldLock",
    "AsyncProducer",
    "AsyncRedlock",
    "Codec",
    "ConfigError",
    "Cron",
    "DeadLetter",
    "DecodeError",
    "Every",
    "Health",
    "HeldLock",
    "Job",
    "JobFailed",
    "JobStatus",
    "JoinChild",
    "JoinStatus",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "Message",
    "Middleware",
    "Outcome",
    "PauseState",
    "PayloadTooLarge",
    "PermissionDenied",
    "Producer",
    "RedisUnavailable",
    "Redlock",
    "Retry",
    "SendFailed",
    "StreamWorker",
    "StreamworkError",
    "WorkerFailed",
    "__version__",
    "async_fenced_set",
    "batch_worker",
    "fenced_set",
    "worker",
]

#: streamwork.errors.__all__, pinned the same way
ERRORS = [
    "BenchError",
    "ConfigError",
    "DeadLetter",
    "DecodeError",
    "GroupNotFound",
    "HandlerControl",
    "JobFailed",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "PayloadTooLarge",
    "PermissionDenied",
    "RedisUnavailable",
    "Retry",
    "SendFailed",
    "StreamNotFound",
    "StreamworkError",
    "WorkerFailed",
]

CORE_NAMES = ["Producer", "AsyncProducer", "StreamWorker", "Message", "Redlock", "Retry",
                "DeadLetter", "StreamworkError", "LockNotAcquired"]


def test_all_is_exactly_the_pinned_public_names() -> None:
    """streamwork.__all__ equals the pinned, sorted list: nothing missing, nothing extra,
    and the core names (producers, worker, message, lock, retry control, errors) among them."""
    assert sorted(PUBLIC) == PUBLIC
    assert sw.__all__ == PUBLIC
    assert set(CORE_NAMES) <= set(PUBLIC)


def test_errors_all_is_exactly_the_pinned_error_names() -> None:
    """streamwork.errors.__all__ equals the pinned, sorted list of error names."""
    assert sorted(ERRORS) == ERRORS
    assert streamwork.errors.__all__ == ERRORS


@pytest.mark.parametrize("name", [n for n in PUBLIC if n != "__version__"])
def test_each_export_imports_and_comes_from_streamwork(name: str) -> None:
    """``from streamwork import <name>`` works for every public name, and the object is
    defined in a streamwork module that holds the very same object."""
    namespace: dict[str, Any] = {}
    exec(f"from streamwork import {name}", namespace)
    obj = namespace[name]
    assert obj is getattr(sw, name)
    module_name = obj.__module__
    assert module_name.startswith("streamwork"), (name, module_name)
    assert getattr(importlib.import_module(module_name), obj.__name__) is obj


@pytest.mark.parametrize("name", ERRORS)
def test_each_error_imports_and_is_defined_in_errors(name: str) -> None:
    """``from streamwork.errors import <name>`` works for every error name; each is a
    StreamworkError defined in streamwork.errors, and the top-level name, where there is
    one, is the same object."""
    namespace: dict[str, Any] = {}
    exec(f"from streamwork.errors import {name}", namespace)
    obj = namespace[name]
    assert obj.__module__ == "streamwork.errors"
    assert issubclass(obj, sw.StreamworkError)
    if name in PUBLIC:
        assert getattr(sw, name) is obj


def test_import_streamwork_does_not_import_redis() -> None:
    """``import streamwork`` is lazy: a fresh interpreter that imports it (and the errors)
    has not imported redis-py."""
    code = ("import sys, streamwork, streamwork.errors; "
            "print(sorted(m for m in sys.modules if m == 'redis' or m.startswith('redis.')))")
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60, cwd=root)
    assert out.stdout.strip() == "[]", out.stdout


def test_version_is_a_string() -> None:
    """``from streamwork import __version__`` gives a non-empty version string."""
    from streamwork import __version__

    assert isinstance(__version__, str) and __version__


def test_errors_are_one_tree_and_exported_from_errors_too() -> None:
    """Every exception derives from StreamworkError; handler control flow is also in
    streamwork.errors (and exported at the top level too)."""
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
    fields = {f.name for f in dataclasses.fields(sw.Message)}
    assert {"id", "stream", "key", "payload", "attempt", "enqueued_at", "headers",
            "fencing_token"} <= fields
    msg = sw.Message(id="1-0", stream="s", key="k", payload={"a": 1}, attempt=1,
                     enqueued_at=1.0, headers={})
    assert msg.fencing_token is None


def test_worker_class_attributes_are_the_design_defaults() -> None:
    """StreamWorker exposes its documented class attributes, with their defaults."""
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
        assert callable(getattr(sw.Producer, method)), method
        assert callable(getattr(sw.AsyncProducer, method)), method
    assert inspect.iscoroutinefunction(sw.AsyncProducer.send)
    assert inspect.iscoroutinefunction(sw.AsyncProducer.send_many)
    assert not inspect.iscoroutinefunction(sw.Producer.send)
