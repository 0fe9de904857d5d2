"""The exception hierarchy of convsim.

Every error convsim raises on purpose derives from :class:`ConvsimError`::

    ConvsimError
    ├── ConfigError              a bad setting, CLI value or model spec
    │   └── MissingExtra         a feature whose extra is not installed (also an ImportError)
    ├── RegistryError            an unknown adapter or metric name (also a KeyError
    │                            and a ValueError)
    ├── PackError                a scenario pack failed validation (lists its problems)
    ├── TemplateError            a prompt template is malformed or unsafe
    ├── TranscriptTooLong        a conversation would pass max_transcript_chars
    ├── InvalidTransition        a conversation state machine was driven illegally
    ├── ResultsError             the results file cannot be written or resumed
    ├── EndpointError            a model endpoint cannot serve a run (checked before it)
    └── AdapterError             a model call failed (carries model and attempts)
        ├── RateLimited          429, after retries (retry_after, paused_s)
        │   └── QuotaExhausted   a 429 asking for a wait past max_retry_after; not retried
        ├── ServerError          5xx or a dropped connection, after retries (status_code)
        ├── Timeout              the call did not finish in time
        ├── BadRequest           400/404/422: the request itself is wrong (status_code)
        ├── AuthError            401/403: the key is missing or refused
        ├── LocalResourceError   this machine ran out of open files for a connection
        ├── ResponseTooLarge     the answer went past a size limit (limit, setting)
        ├── EgressRefused        a URL or address the egress policy does not allow (field)
        ├── AdapterCodeError     an adapter's own code raised what says nothing of the
        │                        network or the server (KeyError, a bare Exception)
        └── ProtocolError        the response could not be understood (snippet)
            └── MalformedResponse  a 2xx answer that arrived broken; retried

Infrastructure failures (rate limits, servers down, timeouts) are kept apart from
failures of the request or of the model so results can tell them apart. Each
:class:`AdapterError` also says whether trying the call again could help
(``retryable``): a 429, a 5xx, a dropped connection, a timeout or an answer that
arrived broken (:class:`MalformedResponse`) can; a 400 or a refused key cannot, and
neither can a stream whose text already reached the caller.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from ._plural import counted

if TYPE_CHECKING:
    from ._types import RequestIds

M = TypeVar("M", bound=BaseModel)

__all__ = [
    "ConvsimError",
    "ConfigError",
    "MissingExtra",
    "RegistryError",
    "PackError",
    "PackProblem",
    "ProblemLog",
    "MAX_LISTED_PROBLEMS",
    "TemplateError",
    "InvalidTransition",
    "TranscriptTooLong",
    "ResultsError",
    "AdapterError",
    "RateLimited",
    "QuotaExhausted",
    "ServerError",
    "Timeout",
    "BadRequest",
    "AuthError",
    "ProtocolError",
    "LocalResourceError",
    "EndpointError",
    "MalformedResponse",
    "EgressRefused",
    "AdapterCodeError",
    "ResponseTooLarge",
    "RETRYABLE_STATUSES",
    "describe_validation_error",
    "parse_config",
]


class ConvsimError(Exception):
    """Root of every error convsim raises on purpose."""


class ConfigError(ConvsimError):
    """A setting, command-line value or model spec is invalid."""


class MissingExtra(ConfigError, ImportError):
    """A feature was used whose optional dependencies (its extra) are not installed.

    An :class:`ImportError` too, so code that probes for an optional part with
    ``except ImportError`` keeps working.
    """

    def __init__(self, extra: str, feature: str) -> None:
        self.extra = extra
        self.feature = feature
        super().__init__(f"{feature} needs the {extra} extra: pip install 'convsim[{extra}]'")

    def __reduce__(self) -> tuple[type[MissingExtra], tuple[str, str]]:
        return type(self), (self.extra, self.feature)


class RegistryError(ConvsimError, KeyError, ValueError):
    """A name is not registered; the message lists the valid names.

    A :class:`KeyError` (a lookup that missed) and a :class:`ValueError` (the guide's
    ``get_model_adapter`` raises one for an unsupported model type), so callers that
    catch either keep working.
    """

    def __init__(self, kind: str, name: str, known: Sequence[str]) -> None:
        self.kind = kind
        self.name = name
        self.known = sorted(known)
        super().__init__(
            f"unknown {kind} {name!r}; known {kind}s: {', '.join(self.known) or '(none)'}"
        )

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


@dataclass(frozen=True)
class PackProblem:
    """One validation problem: where it is and what is wrong."""

    file: str
    line: int | None
    field: str | None
    message: str

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        what = f"{self.field}: " if self.field else ""
        return f"{where}: {what}{self.message}"


class PackError(ConvsimError):
    """A scenario pack is invalid. ``problems`` lists the problems found, or the first of
    them when there are very many: ``more`` counts the ones not listed. The message is
    one line for one problem, else a line per problem."""

    def __init__(self, problems: Sequence[PackProblem], more: int = 0) -> None:
        self.problems = list(problems)
        self.more = more
        total = len(self.problems) + more
        if len(self.problems) == 1 and not more:
            super().__init__(f"invalid scenario pack: {self.problems[0]}")
            return
        lines = "".join(f"\n  {p}" for p in self.problems)
        listed = f", the first {len(self.problems):,} listed" if more else ""
        tail = f"\n  ... and {more:,} more" if more else ""
        count = counted(total, "problem", grouped=True)
        super().__init__(f"invalid scenario pack ({count}{listed}):{lines}{tail}")


MAX_LISTED_PROBLEMS = 1000
"""The most problems a :class:`PackError` from a pack or transcript file lists; it
counts the rest (a systematic mistake in 100,000 scenarios is 100,000 problems)."""


@dataclass
class ProblemLog:
    """The problems a reader finds: the first ``limit`` kept, the rest only counted, so
    that a file with a mistake on every line costs no more memory than one with a few."""

    limit: int = MAX_LISTED_PROBLEMS
    problems: list[PackProblem] = field(default_factory=list)
    more: int = 0
    """Problems found beyond the first ``limit``."""

    def add(self, problem: PackProblem) -> None:
        if len(self.problems) < self.limit:
            self.problems.append(problem)
        else:
            self.more += 1

    def __bool__(self) -> bool:
        return bool(self.problems)

    def error(self) -> PackError:
        """The problems as the error to raise."""
        return PackError(self.problems, more=self.more)


class TemplateError(ConvsimError):
    """A prompt template is malformed, unsafe, or misses a variable; ``field`` names the
    placeholder to blame when there is one."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class TranscriptTooLong(ConvsimError):
    """A conversation's transcript would pass its limit (``max_transcript_chars``): a
    prompt that repeats the context, or answers that keep growing. Fails the turn."""

    def __init__(self, message: str, *, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


class InvalidTransition(ConvsimError):
    """A conversation state machine was asked for a transition it does not allow."""

    def __init__(self, conversation_id: str, current: str, target: str) -> None:
        self.conversation_id = conversation_id
        self.current = current
        self.target = target
        super().__init__(
            f"conversation {conversation_id!r}: illegal transition {current} -> {target}"
        )


class ResultsError(ConvsimError):
    """The results file cannot be written, read or resumed."""


RETRYABLE_STATUSES = frozenset({408, 409, 429})
"""4xx answers that say "try again", besides every 5xx."""


class AdapterError(ConvsimError):
    """A model call failed. ``attempts`` counts the tries made, retries included."""

    infrastructure: bool = True
    """True when the failure lies with infrastructure (network, quota, server), not with
    the request or the model's output."""
    retryable: bool = False
    """True when the same call may succeed if tried again."""

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        attempts: int = 1,
        status_code: int | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.model = model
        self.attempts = attempts
        self.status_code = status_code
        if retryable is not None:
            self.retryable = retryable
        self.request_ids: tuple[RequestIds, ...] = ()
        """The :class:`~convsim.RequestIds` of each attempt the call made, where the
        adapter learnt them (HTTP adapters do), to find the failure in the server's
        logs."""


class RateLimited(AdapterError):
    """The provider kept answering 429 until the retry budget ran out.

    ``retry_after`` is the wait the server asked for (seconds; None if it named none);
    ``paused_s`` how long the provider key then stopped sending (set by the adapter's
    rate budget; None when nothing paused).
    """

    retryable = True

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        paused_s: float | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after
        self.paused_s = paused_s


class QuotaExhausted(RateLimited):
    """A 429 asked for a longer wait than the adapter takes (``max_retry_after``): most
    likely a daily or monthly quota is used up. Not retried; the key sends nothing for
    ``max_retry_after`` seconds, and calls in that time fail at once with this error
    (``sent`` False). ``retry_after`` is what the server asked."""

    retryable = False

    def __init__(self, message: str, *, max_retry_after: float, sent: bool, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.max_retry_after = max_retry_after
        self.sent = sent


class ServerError(AdapterError):
    """The server failed (5xx) or dropped the connection, after retries."""

    def __init__(self, message: str, **kw: Any) -> None:
        status = kw.get("status_code")
        kw.setdefault("retryable", status is None or status >= 500 or status in RETRYABLE_STATUSES)
        super().__init__(message, **kw)


class Timeout(AdapterError):
    """The call did not complete within its deadline."""

    retryable = True


class BadRequest(AdapterError):
    """The request was rejected as invalid (400, 404, 422); retrying cannot help."""

    infrastructure = False


class AuthError(AdapterError):
    """The API key is missing or was refused (401, 403)."""


class ResponseTooLarge(AdapterError):
    """An answer went past a size limit: an endless body or server-sent event, or a
    compression bomb (sizes count after decompression). Reading stopped at the limit.

    ``setting`` names the adapter argument that sets the limit, ``limit`` its value in
    bytes. The server's fault, not the model's; not retried, as the server would most
    likely do it again. The one exception is ``max_inflight_bytes``, the bytes all calls
    of an adapter hold at once: that call failed for its neighbours' answers, and is
    retried.
    """

    def __init__(self, message: str, *, limit: int, setting: str, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.limit = limit
        self.setting = setting


class ProtocolError(AdapterError):
    """The response could not be understood; ``snippet`` shows what came back."""

    infrastructure = False

    def __init__(self, message: str, *, snippet: str = "", **kw: Any) -> None:
        super().__init__(message, **kw)
        self.snippet = snippet[:200]


class LocalResourceError(AdapterError):
    """A connection could not be opened because this process ran out of file
    descriptors (EMFILE/ENFILE): a local limit, not the server's fault. Worth retrying
    once other connections close."""

    retryable = True


class EgressRefused(AdapterError):
    """A call (or a URL given for one) goes where the egress policy does not allow: a
    URL outside the allowed prefixes, or a host at a loopback, private or reserved
    address. ``field`` names the setting that holds the URL."""

    infrastructure = False

    def __init__(self, reason: str, *, field: str = "base_url", **kw: Any) -> None:
        super().__init__(f"{field}: {reason}", **kw)
        self.field = field
        self.reason = reason


class AdapterCodeError(AdapterError):
    """An adapter's own code (the ``generate_response`` of an adapter written in the
    guide's style) raised an exception that says nothing about the network or the
    server: a KeyError reading the answer, a TypeError, a bare Exception with no HTTP
    status, timeout or connection error behind it. Not retried (the same code would
    most likely fail the same way); counted as the model's side, not infrastructure.
    ``cause`` names the exception's type."""

    infrastructure = False

    def __init__(self, message: str, *, cause: str, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.cause = cause


class EndpointError(ConvsimError):
    """A model endpoint cannot serve a run: unreachable, its key refused, or its URL
    wrong. Raised by the check before the first conversation; the message says what to
    fix."""

    def __init__(
        self, message: str, *, url: str | None = None, status_code: int | None = None
    ) -> None:
        super().__init__(message)
        self.url = url
        self.status_code = status_code


class MalformedResponse(ProtocolError):
    """A 2xx answer that arrived broken: truncated or malformed JSON, a body of the
    wrong shape, an HTML page from a proxy, an unparsable stream event.

    A fault on the way (a proxy, a gateway, a server cut short), not the model's: it
    is retried like a 5xx and counts as infrastructure when retries run out. ``snippet``
    shows what came back.
    """

    infrastructure = True
    retryable = True


def describe_validation_error(exc: ValidationError, what: str) -> str:
    """One line naming each invalid field of a pydantic error."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg'].removeprefix('Value error, ')}")
    return f"invalid {what}: " + "; ".join(parts)


def parse_config(model: type[M], config: M | Mapping[str, Any] | None, what: str) -> M:
    """``config`` as a ``model``: itself, validated from a mapping, or the defaults.

    Raises ConfigError naming every invalid field.
    """
    if isinstance(config, model):
        return config
    try:
        return model.model_validate(dict(config or {}))
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, what)) from exc
