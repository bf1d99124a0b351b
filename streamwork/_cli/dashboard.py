"""``streamwork dashboard``: serve the web UI (:mod:`streamwork._dashboard.app`) with uvicorn.

It binds to 127.0.0.1 by default. Bound to any other address it refuses to start without
a token (``--token`` or ``$STREAMWORK_DASHBOARD_TOKEN``, at least 16 characters), which
every request must then show. Starlette, uvicorn, Jinja2 and python-multipart come with
the ``dashboard`` extra and are imported only when the command runs.
"""

from __future__ import annotations

import importlib.util
from typing import Final

import click

from streamwork._cli.common import fail, url_option
from streamwork._redis import connection
from streamwork.errors import ConfigError

__all__ = ["MIN_TOKEN_CHARS", "TOKEN_ENV", "check_token", "register"]

TOKEN_ENV: Final = "STREAMWORK_DASHBOARD_TOKEN"
MIN_TOKEN_CHARS: Final = 16
#: distribution -> its import names (any one will do), of what the ``dashboard`` extra installs
_NEEDS: Final = {"starlette": ("starlette",), "uvicorn": ("uvicorn",), "jinja2": ("jinja2",),
                 "python-multipart": ("python_multipart", "multipart")}
_MAKE_TOKEN: Final = "python -c 'import secrets; print(secrets.token_urlsafe(24))'"


def check_token(host: str, token: str | None) -> None:
    """Refuse (exit 1) a dashboard bound beyond loopback without a token, or a short one."""
    from streamwork._dashboard.security import is_loopback

    if token is not None and len(token) < MIN_TOKEN_CHARS:
        fail(f"the dashboard token is {len(token)} characters long; give one of at least "
             f"{MIN_TOKEN_CHARS} (make one with: {_MAKE_TOKEN})")
    if token is None and not is_loopback(host):
        fail(f"--host {host} is not a loopback address: anyone who reaches it could replay and "
             f"purge dead letters, so a token is required. Give --token or set ${TOKEN_ENV} "
             f"(make one with: {_MAKE_TOKEN}), or bind to 127.0.0.1.")


def _require_extra() -> None:
    """Exit 1 naming the extra when one of its packages is not installed (looked up, not
    imported: the command imports them only once it is sure to serve)."""
    missing = [dist for dist, names in _NEEDS.items()
               if all(importlib.util.find_spec(name) is None for name in names)]
    if missing:
        fail(f"streamwork dashboard needs the 'dashboard' extra (missing: {', '.join(missing)}):"
             " pip install 'streamwork[dashboard]'")


def register(main: click.Group) -> None:
    """Add the ``dashboard`` command to ``main``."""

    @main.command("dashboard")
    @click.option("--host", default="127.0.0.1", show_default=True,
                  help="address to bind; anything but loopback needs --token")
    @click.option("--port", type=click.IntRange(1, 65535), default=8321, show_default=True,
                  help="TCP port to serve the dashboard on")
    @click.option("--token", envvar=TOKEN_ENV, show_envvar=True, default=None,
                  help=f"secret every request must show (>= {MIN_TOKEN_CHARS} characters): "
                       "open the page once with ?token=..., or send 'Authorization: Bearer "
                       "...'; required unless bound to loopback")
    @click.option("--refresh", type=click.FloatRange(min=0), default=10.0, show_default=True,
                  help="seconds between automatic page reloads (0: off)")
    @click.option("--sample-interval", type=click.FloatRange(min=0.1), default=5.0,
                  show_default=True, help="seconds between two samples of the rates")
    @click.option("--window", type=click.FloatRange(min=1), default=10.0, show_default=True,
                  help="minutes of rates the sparklines show (kept in memory)")
    @url_option
    def dashboard(host: str, port: int, token: str | None, refresh: float,
                  sample_interval: float, window: float, url: str | None) -> None:
        """Serve a web UI of every stream: groups, consumers, lag, pending, delayed, dead
        letters (replay, purge), rates and a job lookup. Ctrl-C stops it."""
        token = token or None
        _require_extra()
        check_token(host, token)
        import uvicorn

        from streamwork._dashboard.app import DashboardSettings, create_app
        from streamwork._dashboard.data import redact_url

        try:
            resolved = connection.resolve_url(url)
            settings = DashboardSettings(resolved, token, refresh, sample_interval,
                                         window * 60)
        except ConfigError as exc:
            fail(str(exc))
        shown = f"[{host}]" if ":" in host else host
        click.echo(f"streamwork dashboard on http://{shown}:{port}/ (Redis {redact_url(resolved)})"
                   + ("; open it once with ?token=<your token>" if token else ""))
        uvicorn.run(create_app(settings), host=host, port=port, log_level="warning",
                    ws="none", lifespan="on")
