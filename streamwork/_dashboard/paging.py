"""Which streams the dashboard page shows: a name filter, an order and a page of them.

A server with thousands of streams cannot show every stream's card on one page (megabytes
of HTML, seconds to render and to draw), so the page lists :data:`PAGE_SIZE` streams at a
time, the overview and the cards alike. ``?q=`` keeps the streams whose name holds the
text; ``?sort=`` orders them by name (the default) or worst first: lag, pending, oldest
pending, dead letters; ``?page=`` picks the page (1-based). With no ``page`` the page
holding the stream an action just acted on (``?stream=``) is shown, else the first. Every
stream is still read (the totals and the orders need all of them); only what is drawn is
paged. Pure: the streams are given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlencode

from streamwork._ops.stats import StreamStats
from streamwork._ops.summary import oldest, total_pending, worst_lag

__all__ = ["PAGE_SIZE", "SORTS", "Listing", "listing"]

PAGE_SIZE: Final = 100  #: streams per page (overview rows and cards)


#: ``sort`` value -> (label, key; a larger key comes first, the name breaks ties)
SORTS: Final[Mapping[str, tuple[str, Callable[[StreamStats], float]]]] = {
    "name": ("name", lambda s: 0.0),
    "lag": ("lag", lambda s: float(worst_lag(s) or 0)),
    "pending": ("pending", lambda s: float(total_pending(s))),
    "oldest": ("oldest pending", lambda s: oldest(s) or 0.0),
    "dead": ("dead", lambda s: float(s.dead)),
}


@dataclass(frozen=True, slots=True)
class Listing:
    """The streams one page shows, and how to reach the others."""

    shown: list[StreamStats]  #: this page's streams, in order
    matching: int  #: streams that pass the filter (all pages)
    total: int  #: streams on the server
    q: str
    sort: str
    page: int  #: 1-based
    pages: int

    @property
    def first(self) -> int:
        """1-based position of the first stream shown (0 when none is)."""
        return (self.page - 1) * PAGE_SIZE + 1 if self.shown else 0

    @property
    def last(self) -> int:
        return self.first + len(self.shown) - 1 if self.shown else 0

    def url(self, page: int | None = None, sort: str | None = None) -> str:
        """The page's URL with this filter and order (or another page or order)."""
        params = _kept(self.q, sort or self.sort, page if page is not None else self.page)
        return "/" + (f"?{urlencode(params)}" if params else "")

    def query(self) -> list[tuple[str, str]]:
        """This listing's query parameters (for the refresh URL), defaults left out."""
        return _kept(self.q, self.sort, self.page)


def _kept(q: str, sort: str, page: int) -> list[tuple[str, str]]:
    return [(k, v) for k, v in (("q", q), ("sort", sort), ("page", str(page)))
            if v and (k, v) not in (("sort", "name"), ("page", "1"))]


def _page_number(raw: str | None) -> int | None:
    try:
        return max(1, int(raw)) if raw else None
    except ValueError:
        return None


def listing(streams: Sequence[StreamStats], params: Mapping[str, Any]) -> Listing:
    """The page of ``streams`` (sorted by name) that the query ``params`` asks for; an
    unknown ``sort`` is by name, a page past the last is the last."""
    q = str(params.get("q") or "").strip()
    sort = str(params.get("sort") or "name")
    if sort not in SORTS:
        sort = "name"
    matching = [s for s in streams if q.lower() in s.stream.lower()] if q else list(streams)
    if sort != "name":
        key = SORTS[sort][1]
        matching.sort(key=lambda s: -key(s))  # stable: ties stay in name order
    pages = max(1, -(-len(matching) // PAGE_SIZE))
    page = _page_number(params.get("page"))
    if page is None:
        target = str(params.get("stream") or "")
        at = next((i for i, s in enumerate(matching) if s.stream == target), 0)
        page = at // PAGE_SIZE + 1
    page = min(page, pages)
    shown = matching[(page - 1) * PAGE_SIZE: page * PAGE_SIZE]
    return Listing(shown, len(matching), len(streams), q, sort, page, pages)
