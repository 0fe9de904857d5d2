"""Scraping a model server's Prometheus ``/metrics`` while a load run goes on
(``convsim load --server-metrics``).

The endpoint is read at the start and the end of each point and every ``interval_s``
in between, so even a short point has a change to measure. The text is parsed with
``prometheus_client``'s parser (the ``prometheus`` extra) in a worker thread, off the
event loop that times the requests. Scraping never fails a run: an endpoint that
answers 404 or something other than the Prometheus text format is reported once and
not asked again; a scrape that fails otherwise (refused, timed out) is counted and the
next one is tried.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx

from convsim._extras import needs_extra

from ._server_figures import (
    Sample,
    Scrape,
    ServerFigures,
    ServerSample,
    server_figures,
    server_sample,
)

__all__ = ["ServerScraper", "metrics_url", "check_prometheus_extra", "NotPrometheus"]

FEATURE = "convsim load --server-metrics"


class NotPrometheus(ValueError):
    """The text is not in the Prometheus text format."""


def check_prometheus_extra() -> None:
    """Fail before a run that asks for server metrics without the parser.

    Raises:
        MissingExtra: ``prometheus_client`` is not installed (the ``prometheus`` extra).
    """
    with needs_extra("prometheus", FEATURE):
        import prometheus_client.parser  # noqa: F401


def metrics_url(given: str, base_url: str | None) -> str | None:
    """The URL to scrape: ``given``, or for ``auto`` the origin of ``base_url`` with
    ``/metrics`` (``http://host:8000/v1`` gives ``http://host:8000/metrics``); None when
    ``auto`` has no base URL to go by."""
    if given != "auto":
        return given
    if not base_url:
        return None
    parts = urlsplit(base_url)
    if not parts.scheme or not parts.netloc:
        return None
    return f"{parts.scheme}://{parts.netloc}/metrics"


def parse_exposition(text: str) -> tuple[Sample, ...]:
    """Every sample of a Prometheus text page.

    Raises:
        NotPrometheus: the text is not in the format, or holds no sample.
    """
    with needs_extra("prometheus", FEATURE):
        from prometheus_client.parser import text_string_to_metric_families
    try:
        samples = tuple(
            Sample(s.name, tuple(sorted(s.labels.items())), float(s.value))
            for family in text_string_to_metric_families(text)
            for s in family.samples
        )
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise NotPrometheus(f"not the Prometheus text format ({exc})") from None
    if not samples:
        raise NotPrometheus("no metric in it")
    return samples


Sleep = Callable[[float], Awaitable[Any]]


class ServerScraper:
    """Reads ``url`` during a run and keeps each point's scrapes.

    ``async with ServerScraper(url, ...) as scraper:`` holds one HTTP client for the
    run; ``async with scraper.watching(point):`` scrapes at its start, every
    ``interval_s`` while it lasts, and at its end.

    Args:
        url: the ``/metrics`` endpoint.
        interval_s: seconds between scrapes within a point.
        report: told once, in words, when the endpoint is given up on or first fails.
        clock: seconds, monotonic (the run's time line starts at construction).
        sleep: awaited between scrapes (injectable: tests do not wait).
        transport: the HTTP transport (tests pass ``httpx.MockTransport``).
        timeout_s: for one scrape.
    """

    def __init__(
        self,
        url: str,
        *,
        interval_s: float = 5.0,
        report: Callable[[str], None] = lambda _line: None,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Sleep = anyio.sleep,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be above 0, got {interval_s}")
        self.url = url
        self.interval_s = interval_s
        self._report = report
        self._clock = clock
        self._sleep = sleep
        self._transport = transport
        self._timeout_s = timeout_s
        self._t0 = clock()
        self._client: httpx.AsyncClient | None = None
        self._scrapes: dict[int, list[Scrape]] = defaultdict(list)
        self._failed: dict[int, int] = defaultdict(int)
        self._failure_told = False
        self.given_up: str | None = None
        """Why the endpoint was given up on; None while it is read."""

    async def __aenter__(self) -> ServerScraper:
        self._client = httpx.AsyncClient(
            transport=self._transport, timeout=self._timeout_s, follow_redirects=True
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        client, self._client = self._client, None
        if client is not None:
            with anyio.CancelScope(shield=True):
                await client.aclose()

    def _give_up(self, why: str) -> None:
        self.given_up = why
        self._report(f"server metrics: {self.url} {why}; going on without them")

    async def scrape(self, point: int) -> Scrape | None:
        """Read the endpoint once for ``point``; None when it was not read."""
        if self.given_up is not None or self._client is None:
            return None
        at = self._clock() - self._t0
        try:
            response = await self._client.get(self.url, headers={"Accept": "text/plain"})
        except httpx.HTTPError as exc:
            self._failed[point] += 1
            if not self._failure_told:
                self._failure_told = True
                self._report(
                    f"server metrics: a scrape of {self.url} failed ({type(exc).__name__}: "
                    f"{exc}); the next ones are tried"
                )
            return None
        if response.status_code != 200:
            self._give_up(f"answered HTTP {response.status_code}")
            return None
        try:
            samples = await anyio.to_thread.run_sync(parse_exposition, response.text)
        except NotPrometheus as exc:
            self._give_up(f"answered with something else than Prometheus metrics: {exc}")
            return None
        scrape = Scrape(round(at, 3), point, samples)
        self._scrapes[point].append(scrape)
        return scrape

    async def _every_interval(self, point: int) -> None:
        while self.given_up is None:
            await self._sleep(self.interval_s)
            await self.scrape(point)

    @asynccontextmanager
    async def watching(self, point: int) -> AsyncIterator[None]:
        """Scrape for ``point`` at the start and end of the block and every interval
        within it."""
        await self.scrape(point)
        error: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._every_interval, point)
            try:
                yield
            except Exception as exc:  # raised outside the group: not as an ExceptionGroup
                error = exc
            finally:
                tg.cancel_scope.cancel()
        if error is not None:
            raise error
        await self.scrape(point)

    def figures(self, point: int) -> ServerFigures | None:
        """``point``'s figures; None when no scrape of it succeeded."""
        return server_figures(self.url, self._scrapes.get(point, []), self._failed.get(point, 0))

    def timeline(self) -> list[ServerSample]:
        """Every scrape of the run, in time order."""
        samples = []
        for point in sorted(self._scrapes):
            before: Scrape | None = None
            for scrape in self._scrapes[point]:
                samples.append(server_sample(scrape, before))
                before = scrape
        return sorted(samples, key=lambda s: s.t_s)
