"""What counts as a secret, and how it is kept out of everything convsim writes or logs.

Credentials reach convsim three ways: as arguments named like secrets (``api_key=``),
inside a URL (``https://user:KEY@host/v1``, ``https://host/v1?key=KEY``), or echoed back
by a server. Names are recognised by :func:`is_secret_key`; a URL is shown with
:func:`redact_url`; text that may carry a known secret goes through a :class:`Redactor`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlencode, urlsplit, urlunsplit

__all__ = ["MASK", "Redactor", "is_secret_key", "looks_like_url", "redact_url", "url_secrets"]

MASK = "***"

_SECRET_KEY = re.compile(r"(api[_-]?key|authorization|secret|password|token)$", re.IGNORECASE)
_SECRET_PARAM = re.compile(
    r"(^|[_-])(key|api[_-]?key|apikey|token|secret|password|passwd|pwd|auth|authorization"
    r"|sig|signature|credential|credentials|code|session)$",
    re.IGNORECASE,
)
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def is_secret_key(name: str) -> bool:
    """True for field names that hold credentials (api_key, authorization, token, ...)."""
    return _SECRET_KEY.search(name) is not None


def looks_like_url(value: object) -> bool:
    """True for a string with a scheme, such as ``http://``."""
    return isinstance(value, str) and _URL.match(value) is not None


def _secret_param(name: str) -> bool:
    return _SECRET_PARAM.search(name) is not None or is_secret_key(name)


def redact_url(url: str) -> str:
    """``url`` fit to show: user and password, and query values named like secrets
    (``key``, ``api-key``, ``token``, ``sig``, ...), replaced by ``***``.

    Text that does not parse as a URL is returned unchanged.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{MASK}@{netloc.rpartition('@')[2]}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_secret_param(k) for k, _ in pairs):
            query = urlencode([(k, MASK if _secret_param(k) else v) for k, v in pairs], safe="*")
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def url_secrets(url: str) -> tuple[str, ...]:
    """The secret parts of ``url`` (user, password, secret query values), as written and
    as decoded, so a :class:`Redactor` finds them in either form."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return ()
    found: list[str] = []
    if "@" in parts.netloc:
        userinfo = parts.netloc.rpartition("@")[0]
        # with a password, the user name is only a name; without one, it is the key
        found += [userinfo, userinfo.partition(":")[2] or userinfo]
    for k, v in parse_qsl(parts.query, keep_blank_values=True):
        if _secret_param(k) and v:
            found.append(v)
    forms = {form for s in found if s for form in (s, unquote(s), quote(s, safe=""), quote_plus(s))}
    return tuple(sorted(forms, key=len, reverse=True))


@dataclass(frozen=True)
class Redactor:
    """Blanks known secrets out of text (longest first, so no part of one survives)."""

    secrets: tuple[str, ...] = ()

    @classmethod
    def of(cls, *, keys: Iterable[str | None] = (), urls: Iterable[str | None] = ()) -> Redactor:
        found = {k for k in keys if k}
        for url in urls:
            if url:
                found.update(url_secrets(url))
        # a one- or two-character "secret" would blank out ordinary text
        return cls(tuple(sorted((s for s in found if len(s) >= 3), key=len, reverse=True)))

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text
