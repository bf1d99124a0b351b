"""The dashboard's web app (Starlette): one server-rendered page and four POST actions.

``GET /`` shows the streams (groups, consumers, lag, pending and the oldest pending age,
delayed, dead, produced/s and acked/s sparklines) and each one's oldest dead letters, a
page of :data:`~streamwork._dashboard.paging.PAGE_SIZE` at a time (``?q=`` filters by
name, ``?sort=`` orders worst first, ``?page=``: :mod:`streamwork._dashboard.paging`), and
a job lookup by key (``?job_stream=S&job_key=K[&job_group=G]``). ``POST /dlq/replay``
and ``POST /dlq/purge`` act on one dead letter (``id`` and ``where``, the stream or
partition holding it) or all of a stream's; both need the page's CSRF token and redirect
back to the page (303). ``POST /group/pause`` (``stream``, ``group``, ``reason``) and
``POST /group/resume`` pause and resume a consumer group, with the same CSRF check.
A permission the dashboard's ACL user lacks (a read-only user's actions) is a 403 page
saying what Redis refused and what to grant; Redis out of reach is a 503.
Security (token, CSRF, headers) is :mod:`streamwork._dashboard.security`'s; figures are
:mod:`streamwork._dashboard.data`'s.

Templates are package data (``streamwork/_dashboard/templates``), rendered by Jinja2 with
autoescaping on: payloads, keys, error texts and stream names are shown as text.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlencode

import jinja2
import redis
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from streamwork._dashboard import data, paging
from streamwork._dashboard.rates import RateHistory, Sampler
from streamwork._dashboard.security import CSRF_FIELD, Guard, GuardMiddleware
from streamwork._dashboard.svg import sparkline
from streamwork._ops import summary
from streamwork._ops.format import fmt_age, fmt_count, fmt_rate, fmt_when
from streamwork._redis import acl, connection
from streamwork._wire.keys import StreamKeys
from streamwork.errors import ConfigError, PermissionDenied, StreamworkError

__all__ = ["DashboardSettings", "create_app"]

_ENTRY_ID: Final = re.compile(r"^\d{1,20}-\d{1,20}$")
_DONE: Final = ("replayed", "purged", "paused", "resumed", "was not paused")
_JOB_PARAMS: Final = ("job_stream", "job_key", "job_group")


@dataclass(frozen=True, slots=True)
class DashboardSettings:
    """How the dashboard runs: which Redis, the token, refresh and sampling periods."""

    url: str
    token: str | None = None
    refresh_s: float = 10.0  #: page auto-refresh period (0: off)
    sample_interval_s: float = 5.0  #: seconds between two rate samples
    window_s: float = 600.0  #: seconds of rates the sparklines show

    def __post_init__(self) -> None:
        if self.refresh_s < 0:
            raise ConfigError("refresh", f"must be >= 0 seconds (0: off), got {self.refresh_s}")
        if self.sample_interval_s <= 0:
            raise ConfigError("sample_interval",
                              f"must be > 0 seconds, got {self.sample_interval_s}")
        if self.window_s < 2 * self.sample_interval_s:
            raise ConfigError("window", f"must hold at least two samples (>= "
                                        f"{2 * self.sample_interval_s:g} s), got {self.window_s}")


def _last(series: Sequence[float | None]) -> float | None:
    """The newest known value of a series."""
    return next((v for v in reversed(series) if v is not None), None)


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("streamwork._dashboard", "templates"),
        autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
        lstrip_blocks=True)
    env.filters.update(n=fmt_count, rate=fmt_rate, age=fmt_age, when=fmt_when)
    env.globals.update(worst_lag=summary.worst_lag, oldest=summary.oldest,
                       preview=data.preview, clip=data.clip, last=_last, sparkline=sparkline,
                       csrf_field=CSRF_FIELD, total_pending=summary.total_pending,
                       sorts=paging.SORTS)
    return env


class _Dashboard:
    """The app's state: settings, the Redis client, templates, the rate history."""

    def __init__(self, settings: DashboardSettings, client: Any) -> None:
        self.settings = settings
        self.client = client
        self.templates = _templates()
        for name in ("index.html", "error.html"):  # compiled now, not on the first request
            self.templates.get_template(name)
        points = max(2, int(settings.window_s / settings.sample_interval_s))
        self.history = RateHistory(points)
        self.guard = Guard(settings.token)

    def render(self, request: Request, name: str, status_code: int = 200,
               **context: Any) -> HTMLResponse:
        page = self.templates.get_template(name).render(
            nonce=getattr(request.state, "nonce", ""), csrf=getattr(request.state, "csrf", ""),
            redis_url=data.redact_url(self.settings.url), **context)
        return HTMLResponse(page, status_code=status_code)

    # ------------------------------------------------------------ GET /

    def index(self, request: Request) -> Response:
        q = request.query_params
        streams = data.snapshot(self.client)
        self.history.add(streams, first=True)
        shown = paging.listing(streams, q)
        dead = data.dead_letters(self.client, shown.shown)
        job = None
        if q.get("job_key") is not None or q.get("job_stream"):
            job = data.lookup_job(self.client, streams, q.get("job_stream", ""),
                                  q.get("job_key", ""), q.get("job_group", ""))
        keep = shown.query() + [(k, v) for k, v in q.multi_items() if k in _JOB_PARAMS]
        return self.render(
            request, "index.html", streams=streams, listing=shown, dead=dead, job=job,
            flash=_flash(q), history=self.history,
            refresh_s=self.settings.refresh_s,
            refresh_url="/" + (f"?{urlencode(keep)}" if keep else ""),
            taken_at=time.strftime("%H:%M:%S"))

    # ------------------------------------------------------------ POST /dlq/*

    async def replay(self, request: Request) -> Response:
        stream, wheres, ids = await self._target(request)
        replayed, skipped = await run_in_threadpool(data.replay, self.client, wheres, ids)
        return _back(stream, "replayed", replayed, skipped)

    async def purge(self, request: Request) -> Response:
        stream, wheres, ids = await self._target(request, confirm_all=True)
        deleted = await run_in_threadpool(data.purge, self.client, wheres, ids)
        return _back(stream, "purged", deleted, 0)

    # ------------------------------------------------------------ POST /group/*

    async def pause(self, request: Request) -> Response:
        stream, group, form = await self._group(request)
        reason = _field(form, "reason", required=False)
        await run_in_threadpool(_refused_as_400, data.pause_group, self.client, stream,
                                group, reason)
        return _back(stream, "paused", 1, 0, group)

    async def resume(self, request: Request) -> Response:
        stream, group, _ = await self._group(request)
        was = await run_in_threadpool(_refused_as_400, data.resume_group, self.client,
                                      stream, group)
        return _back(stream, "resumed" if was else "was not paused", 1, 0, group)

    async def _group(self, request: Request) -> tuple[str, str, FormData]:
        """(stream, group, the form) of a group action, after the CSRF check and a check of
        both names (400 naming what is wrong)."""
        form = await request.form()
        self.guard.check_post(request, form.get(CSRF_FIELD))
        stream, group = _field(form, "stream"), _field(form, "group")
        try:
            StreamKeys.for_stream(stream).group(group)
        except ConfigError as exc:
            raise HTTPException(400, f"bad stream or group name: {exc}") from None
        return stream, group, form

    async def _target(self, request: Request, confirm_all: bool = False,
                      ) -> tuple[str, list[str], list[str] | None]:
        """(stream, the streams to act on, the ids or None for all), after the CSRF check
        and a check of every field (400 naming what is wrong)."""
        form = await request.form()
        self.guard.check_post(request, form.get(CSRF_FIELD))
        stream = _field(form, "stream")
        try:
            StreamKeys.for_stream(stream)
        except ConfigError as exc:
            raise HTTPException(400, f"bad stream name: {exc}") from None
        names = await run_in_threadpool(_partition_names, self.client, stream)
        entry_id = _field(form, "id", required=False)
        if not entry_id:
            if confirm_all and form.get("confirm") != "yes":
                raise HTTPException(400, f"not purged: tick the box to confirm deleting every "
                                         f"dead letter of {stream!r}")
            return stream, names, None
        if not _ENTRY_ID.match(entry_id):
            raise HTTPException(400, f"{entry_id!r} is not a dead-letter id (like 1700000000000-0)")
        where = _field(form, "where", required=False) or stream
        if where not in names:
            raise HTTPException(400, f"{where!r} is neither stream {stream!r} nor one of its "
                                     "partitions")
        return stream, [where], [entry_id]


def _partition_names(client: Any, stream: str) -> list[str]:
    """The streams holding ``stream``'s dead letters (itself, or its partitions)."""
    return [name for _, name in data.partition_streams_of(client, stream)]


def _field(form: FormData, name: str, required: bool = True) -> str:
    value = form.get(name)
    if value is None or not isinstance(value, str) or (required and not value):
        if required:
            raise HTTPException(400, f"the form lacks its {name!r} field")
        return ""
    return value


def _refused_as_400(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``; a ValueError (no such group, a bad reason) is a 400 saying why."""
    try:
        return fn(*args)
    except (ValueError, ConfigError) as exc:
        raise HTTPException(400, str(exc)) from None


def _back(stream: str, done: str, n: int, skipped: int, group: str = "") -> RedirectResponse:
    query = urlencode({"done": done, "n": n, "skipped": skipped, "stream": stream,
                       **({"group": group} if group else {})})
    return RedirectResponse(f"/?{query}", status_code=303)


@dataclass(frozen=True, slots=True)
class _Flash:
    done: str
    n: int
    skipped: int
    stream: str
    group: str = ""


def _flash(q: Any) -> _Flash | None:
    """The outcome of the action that redirected here, from the query (checked)."""
    done = q.get("done")
    if done not in _DONE:
        return None
    try:
        return _Flash(done, int(q.get("n", "0")), int(q.get("skipped", "0")),
                      q.get("stream", ""), q.get("group", ""))
    except ValueError:
        return None


def create_app(settings: DashboardSettings, *, client: Any = None) -> Starlette:
    """The dashboard app. It opens a sync client on ``settings.url`` (unless one is given)
    and runs the rate sampler for as long as the app's lifespan lasts."""
    dash = _Dashboard(settings, client if client is not None
                      else connection.sync_client(connection.resolve_url(settings.url)))
    owns_client = client is None

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        sampler = Sampler(lambda: data.snapshot(dash.client), dash.history,
                          settings.sample_interval_s).start()
        try:
            yield
        finally:
            await run_in_threadpool(sampler.stop)
            if owns_client:
                dash.client.close()

    def trouble(request: Request, exc: Exception) -> Response:
        # explained again from Redis's own error: an action's producer has no URL
        refusal = exc.__cause__ if isinstance(exc, PermissionDenied) and exc.__cause__ else exc
        denied = acl.explain(refusal, settings.url)
        if denied is not None:  # a missing ACL permission: 403 saying what to grant
            return dash.render(request, "error.html", 403, status=403, message=(
                f"Redis at {data.redact_url(settings.url)} refused this: {denied}"))
        return dash.render(request, "error.html", 503, status=503, message=(
            f"cannot read Redis at {data.redact_url(settings.url)}: {type(exc).__name__}: "
            f"{exc}"))

    def refused(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return dash.render(request, "error.html", exc.status_code, status=exc.status_code,
                           message=exc.detail)

    handlers: dict[Any, Callable[[Request, Exception], Response]] = {
        redis.RedisError: trouble, StreamworkError: trouble, HTTPException: refused}
    routes: Sequence[Route] = [
        Route("/", dash.index, methods=["GET"]),
        Route("/dlq/replay", dash.replay, methods=["POST"]),
        Route("/dlq/purge", dash.purge, methods=["POST"]),
        Route("/group/pause", dash.pause, methods=["POST"]),
        Route("/group/resume", dash.resume, methods=["POST"]),
    ]
    return Starlette(routes=list(routes), lifespan=lifespan, exception_handlers=handlers,
                     middleware=[Middleware(GuardMiddleware, guard=dash.guard)])
