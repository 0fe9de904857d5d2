"""The service's client on httpx: typed errors, retries on 5xx and connection errors."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from convsim._sse import SSEDecoder

__all__ = [
    "EvaluationClient",
    "AsyncEvaluationClient",
    "Evaluation",
    "ServiceError",
    "Unauthorized",
    "NotFound",
    "Invalid",
    "LimitReached",
]

FINISHED = ("done", "failed", "cancelled")


class ServiceError(Exception):
    """The service answered with an error (or could not be reached)."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class Unauthorized(ServiceError):
    """401: no key, or a key that is unknown or revoked."""


class NotFound(ServiceError):
    """404: no such evaluation for this key."""


class Invalid(ServiceError):
    """422: the request was refused; ``problems`` says why (each with its ``loc``, the
    field refused, and ``msg``)."""

    def __init__(self, message: str, problems: Any) -> None:
        super().__init__(message, 422)
        self.problems = problems


class LimitReached(ServiceError):
    """429: a limit of the key (jobs at once, uploads) stops the request."""


@dataclass(frozen=True)
class Evaluation:
    """An evaluation as the service shows it: every model on every task."""

    id: str
    status: str
    pack: str
    model: str
    progress: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    models: list[dict[str, Any]] = field(default_factory=list)
    """Each model: ``model_id``, ``model`` (spec or ``endpoint:NAME``), ``config`` as shown."""
    tasks: list[str] = field(default_factory=list)
    pairs: list[dict[str, Any]] = field(default_factory=list)
    """Each (model, task) pair: ``index``, ``model_id``, ``task``, ``status``,
    ``progress``, ``cost_usd``, ``error``."""

    @classmethod
    def of(cls, data: dict[str, Any]) -> Evaluation:
        return cls(
            id=data["id"],
            status=data["status"],
            pack=data["pack"],
            model=data["model"],
            progress=data.get("progress", {}),
            error=data.get("error"),
            raw=data,
            models=list(data.get("models") or []),
            tasks=list(data.get("tasks") or []),
            pairs=list(data.get("pairs") or []),
        )

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        detail = response.json().get("detail")
    except ValueError:
        detail = response.text[:200]
    if isinstance(detail, list):  # refused fields: "model_args.base_url: why; ..."
        shown = "; ".join(
            f"{'.'.join(str(p) for p in d.get('loc', ())[1:]) or 'body'}: {d.get('msg')}"
            for d in detail
            if isinstance(d, dict)
        )
    else:
        shown = str(detail)
    message = f"{response.status_code}: {shown}"
    if response.status_code == 401:
        raise Unauthorized(message, 401)
    if response.status_code == 404:
        raise NotFound(message, 404)
    if response.status_code == 422:
        raise Invalid(message, detail)
    if response.status_code == 429:
        raise LimitReached(message, 429)
    raise ServiceError(message, response.status_code)


def _summary_path(evaluation_id: str, pair: int | None) -> str:
    if pair is None:
        return f"/v1/evaluations/{evaluation_id}/summary"
    return f"/v1/evaluations/{evaluation_id}/pairs/{pair}/summary"


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, ServiceError) and (exc.status_code or 0) >= 500


def _body(
    pack: str | None,
    model: str | None,
    model_args: dict[str, Any] | None,
    metrics: Any,
    models: Sequence[Mapping[str, Any]] | None = None,
    tasks: Sequence[str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if models is not None:
        body["models"] = [dict(m) for m in models]
    else:
        body["model_args"] = {k: str(v) for k, v in (model_args or {}).items()}
        if model is not None and extra.get("endpoint") is None:
            body["model"] = model
    if tasks is not None:
        body["tasks"] = list(tasks)
    if pack is not None:
        body["pack"] = pack
    if metrics is not None:
        body["metrics"] = list(metrics)
    body.update({k: v for k, v in extra.items() if v is not None})
    return body


class EvaluationClient:
    """The evaluation service from synchronous code."""

    def __init__(
        self, base_url: str, api_key: str, *, timeout: float = 30.0, retries: int = 3
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout,
        )
        self._retries = retries

    def __enter__(self) -> EvaluationClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        for attempt in Retrying(
            stop=stop_after_attempt(self._retries + 1),
            wait=wait_exponential(multiplier=0.2, max=5),
            retry=retry_if_exception(_retryable),
            reraise=True,
        ):
            with attempt:
                response = self._http.request(method, path, **kwargs)
                _raise_for(response)
        return response

    def create_evaluation(
        self,
        pack: str | None = None,
        model: str = "scripted",
        model_args: dict[str, Any] | None = None,
        metrics: list[str] | None = None,
        *,
        limit: int | None = None,
        concurrency: int | None = None,
        pack_files: dict[str, str] | None = None,
        endpoint: str | None = None,
        trials: int | None = None,
        models: Sequence[Mapping[str, Any]] | None = None,
        tasks: Sequence[str] | None = None,
    ) -> Evaluation:
        """Start an evaluation: every model on every task, as one job.

        convsim's form: ``pack`` (a bundled pack's name, a registered task's name,
        ``task:NAME``, ``lm-eval:TASK``), or a pack of your own given as ``pack_files``
        (its files' text by name), against ``model`` (your own, with its ``base_url`` and
        ``api_key`` in ``model_args``) or ``endpoint`` (a model the operator declared, by
        name).

        The developer guide's form: ``models=[{"model_id", "model_type", "config"}, ...]``
        (a ``model_id`` naming an operator's endpoint uses it; else ``model_type`` and
        ``config`` are your own model's type and arguments) and ``tasks=[...]`` (each
        named as ``pack`` is). The forms mix: ``models`` with ``pack``, ``tasks`` with
        ``model``. The first model is the base the others are compared with
        (:meth:`get_comparison`)."""
        body = _body(
            pack, model, model_args, metrics, models, tasks, limit=limit,
            concurrency=concurrency, pack_files=pack_files, endpoint=endpoint, trials=trials,
        )  # fmt: skip
        return Evaluation.of(self._call("POST", "/v1/evaluations", json=body).json())

    def get_evaluation(self, evaluation_id: str) -> Evaluation:
        return Evaluation.of(self._call("GET", f"/v1/evaluations/{evaluation_id}").json())

    def list_evaluations(self) -> list[Evaluation]:
        return [Evaluation.of(d) for d in self._call("GET", "/v1/evaluations").json()]

    def cancel(self, evaluation_id: str) -> Evaluation:
        return Evaluation.of(self._call("POST", f"/v1/evaluations/{evaluation_id}/cancel").json())

    def get_summary(self, evaluation_id: str, pair: int | None = None) -> dict[str, Any]:
        """The evaluation's summary: of one pair (a job of one pair needs none), or of
        every pair with the models compared (``{"pairs": [...], "comparisons": [...]}``)."""
        data: dict[str, Any] = self._call("GET", _summary_path(evaluation_id, pair)).json()
        return data

    def get_comparison(self, evaluation_id: str) -> list[dict[str, Any]]:
        """Each model after the first against the first, task by task, paired by
        conversation (``task``, ``base``, ``candidate``, ``comparison``, ``note``)."""
        data: list[dict[str, Any]] = self._call(
            "GET", f"/v1/evaluations/{evaluation_id}/comparison"
        ).json()
        return data

    def wait(self, evaluation_id: str, timeout: float = 600.0, poll: float = 0.5) -> Evaluation:
        deadline = time.monotonic() + timeout
        while True:
            evaluation = self.get_evaluation(evaluation_id)
            if evaluation.finished:
                return evaluation
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"evaluation {evaluation_id} still {evaluation.status} after {timeout} s"
                )
            time.sleep(poll)

    def iter_results(self, evaluation_id: str) -> Iterator[dict[str, Any]]:
        """Each conversation's result as it finishes; reconnects where it left off."""
        last: str | None = None
        while True:
            headers = {"Last-Event-ID": last} if last else {}
            try:
                with self._http.stream("GET", f"/v1/evaluations/{evaluation_id}/results",
                                       headers=headers, timeout=None) as response:  # fmt: skip
                    if response.status_code >= 400:
                        response.read()
                        _raise_for(response)
                    decoder = SSEDecoder()
                    for chunk in response.iter_bytes():
                        for event in decoder.feed(chunk):
                            if event.event == "end":
                                return
                            last = event.id or last
                            yield json.loads(event.data)
                return
            except httpx.TransportError:
                time.sleep(0.5)  # the server went away: reconnect from the last id


class AsyncEvaluationClient:
    """The evaluation service from async code."""

    def __init__(
        self, base_url: str, api_key: str, *, timeout: float = 30.0, retries: int = 3
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout,
        )
        self._retries = retries

    async def __aenter__(self) -> AsyncEvaluationClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(self._retries + 1),
            wait=wait_exponential(multiplier=0.2, max=5),
            retry=retry_if_exception(_retryable),
            reraise=True,
        ):
            with attempt:
                response = await self._http.request(method, path, **kwargs)
                _raise_for(response)
        return response

    async def create_evaluation(
        self,
        pack: str | None = None,
        model: str = "scripted",
        model_args: dict[str, Any] | None = None,
        metrics: list[str] | None = None,
        *,
        limit: int | None = None,
        concurrency: int | None = None,
        pack_files: dict[str, str] | None = None,
        endpoint: str | None = None,
        trials: int | None = None,
        models: Sequence[Mapping[str, Any]] | None = None,
        tasks: Sequence[str] | None = None,
    ) -> Evaluation:
        """Start an evaluation: every model on every task, as one job.

        convsim's form: ``pack`` (a bundled pack's name, a registered task's name,
        ``task:NAME``, ``lm-eval:TASK``), or a pack of your own given as ``pack_files``
        (its files' text by name), against ``model`` (your own, with its ``base_url`` and
        ``api_key`` in ``model_args``) or ``endpoint`` (a model the operator declared, by
        name).

        The developer guide's form: ``models=[{"model_id", "model_type", "config"}, ...]``
        (a ``model_id`` naming an operator's endpoint uses it; else ``model_type`` and
        ``config`` are your own model's type and arguments) and ``tasks=[...]`` (each
        named as ``pack`` is). The forms mix: ``models`` with ``pack``, ``tasks`` with
        ``model``. The first model is the base the others are compared with
        (:meth:`get_comparison`)."""
        body = _body(
            pack, model, model_args, metrics, models, tasks, limit=limit,
            concurrency=concurrency, pack_files=pack_files, endpoint=endpoint, trials=trials,
        )  # fmt: skip
        return Evaluation.of((await self._call("POST", "/v1/evaluations", json=body)).json())

    async def get_evaluation(self, evaluation_id: str) -> Evaluation:
        return Evaluation.of((await self._call("GET", f"/v1/evaluations/{evaluation_id}")).json())

    async def list_evaluations(self) -> list[Evaluation]:
        return [Evaluation.of(d) for d in (await self._call("GET", "/v1/evaluations")).json()]

    async def cancel(self, evaluation_id: str) -> Evaluation:
        response = await self._call("POST", f"/v1/evaluations/{evaluation_id}/cancel")
        return Evaluation.of(response.json())

    async def get_summary(self, evaluation_id: str, pair: int | None = None) -> dict[str, Any]:
        """The evaluation's summary: of one pair (a job of one pair needs none), or of
        every pair with the models compared (``{"pairs": [...], "comparisons": [...]}``)."""
        response = await self._call("GET", _summary_path(evaluation_id, pair))
        data: dict[str, Any] = response.json()
        return data

    async def get_comparison(self, evaluation_id: str) -> list[dict[str, Any]]:
        """Each model after the first against the first, task by task, paired by
        conversation (``task``, ``base``, ``candidate``, ``comparison``, ``note``)."""
        response = await self._call("GET", f"/v1/evaluations/{evaluation_id}/comparison")
        data: list[dict[str, Any]] = response.json()
        return data

    async def wait(
        self, evaluation_id: str, timeout: float = 600.0, poll: float = 0.5
    ) -> Evaluation:
        import anyio

        with anyio.fail_after(timeout):
            while True:
                evaluation = await self.get_evaluation(evaluation_id)
                if evaluation.finished:
                    return evaluation
                await anyio.sleep(poll)

    async def iter_results(self, evaluation_id: str) -> AsyncIterator[dict[str, Any]]:
        async with self._http.stream("GET", f"/v1/evaluations/{evaluation_id}/results",
                                     timeout=None) as response:  # fmt: skip
            if response.status_code >= 400:
                await response.aread()
                _raise_for(response)
            decoder = SSEDecoder()
            async for chunk in response.aiter_bytes():
                for event in decoder.feed(chunk):
                    if event.event == "end":
                        return
                    yield json.loads(event.data)
