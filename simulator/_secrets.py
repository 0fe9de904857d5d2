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
from urllib.parse import quote, quote_plus, unquote, unquote_plus

__all__ = [
    "MASK",
    "Redactor",
    "is_secret_key",
    "looks_like_url",
    "redact_url",
    "shown_setting",
    "url_secrets",
]

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


def shown_setting(name: str, value: object) -> object:
    """A setting as it may be shown (a repr, a manifest, a dump): masked when its name
    is a secret's, a URL without its credentials, anything else as it is."""
    if is_secret_key(name):
        return MASK
    return redact_url(value) if isinstance(value, str) and looks_like_url(value) else value


def _secret_param(name: str) -> bool:
    return _SECRET_PARAM.search(name) is not None or is_secret_key(name)


_URL_PARTS = re.compile(
    r"^(?:(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*):)?(?://(?P<netloc>[^/?#]*))?"
    r"(?P<path>[^?#]*)(?:\?(?P<query>[^#]*))?(?:#(?P<fragment>.*))?$",
    re.DOTALL,
)
"""RFC 3986's own split (appendix B): it takes any string, a malformed URL included."""
_KEY_RUN = re.compile(r"[A-Za-z0-9]{16,}")
_SECRET_SEGMENT = re.compile(
    r"^(api[_-]?key|apikey|key|(access[_-]?|auth[_-]?)?token|secret|password|passwd|pwd"
    r"|bearer)$",
    re.IGNORECASE,
)
"""A path segment naming what the next segment holds (``/key/VALUE``)."""


def _key_shaped(text: str) -> bool:
    """Whether ``text`` looks like a generated credential: 16 letters and digits or more
    in a row, mixing both, or 32 or more of either (words and dates are shorter)."""
    return any(
        len(run) >= 32 or not (run.isalpha() or run.isdigit())
        for run in _KEY_RUN.findall(unquote(text))
    )


class _Scan:
    """A URL's text with its secrets masked, and the secrets as written."""

    def __init__(self) -> None:
        self.secrets: list[str] = []

    def hide(self, value: str) -> str:
        self.secrets.append(value)
        return MASK

    def pairs(self, text: str) -> str:
        """``name=value`` pairs split by ``&`` or ``;`` (a query, a fragment, a path
        segment's parameters): a value named like a secret or shaped like a key is
        masked, as is a lone key-shaped item."""
        pieces = re.split(r"([&;])", text)
        for i in range(0, len(pieces), 2):
            name, eq, value = pieces[i].partition("=")
            if eq:
                if value and (_secret_param(unquote_plus(name)) or _key_shaped(value)):
                    pieces[i] = f"{name}={self.hide(value)}"
            elif _key_shaped(name):
                pieces[i] = self.hide(name)
        return "".join(pieces)

    def path(self, text: str) -> str:
        """Segments shaped like a key, or following one that names a secret
        (``/key/VALUE``), masked; parameters after ``;`` as :meth:`pairs`."""
        segments = text.split("/")
        names_secret = False
        for i, segment in enumerate(segments):
            base, semi, params = segment.partition(";")
            was = base
            if base and (names_secret or _key_shaped(base)):
                base = self.hide(base)
            names_secret = _SECRET_SEGMENT.match(unquote(was)) is not None
            segments[i] = base + semi + (self.pairs(params) if semi else "")
        return "/".join(segments)

    def netloc(self, text: str) -> str:
        """User and password replaced: with a password, the user name is only a name;
        without one, it is the key."""
        if "@" not in text:
            return text
        userinfo, _, host = text.rpartition("@")
        self.secrets += [userinfo, userinfo.partition(":")[2] or userinfo]
        return f"{MASK}@{host}"


def _scan(url: str) -> tuple[str, list[str]]:
    match = _URL_PARTS.match(url)
    assert match is not None  # every string matches
    scan = _Scan()
    scheme, netloc, path, query, fragment = match.group(
        "scheme", "netloc", "path", "query", "fragment"
    )
    shown = f"{scheme}:" if scheme is not None else ""
    if netloc is not None:
        shown += "//" + scan.netloc(netloc)
    shown += scan.path(path)
    if query is not None:
        shown += "?" + scan.pairs(query)
    if fragment is not None:
        shown += "#" + scan.pairs(fragment)
    return (shown if scan.secrets else url), scan.secrets


def redact_url(url: str) -> str:
    """``url`` fit to show: user and password; query and fragment values named like
    secrets (``key``, ``api-key``, ``token``, ``sig``, ...) or shaped like keys, also
    after ``;``; path segments shaped like keys (``/v1/KEY/chat``) or following a
    segment that names one (``/key/VALUE``) — each replaced by ``***``.

    A URL that does not parse is masked the same way (it is split as RFC 3986 splits
    any string); text without credentials is returned unchanged.
    """
    return _scan(url)[0]


def url_secrets(url: str) -> tuple[str, ...]:
    """The secret parts of ``url`` (what :func:`redact_url` masks), as written and as
    decoded, so a :class:`Redactor` finds them in either form."""
    forms = {
        form
        for written in _scan(url)[1]
        for plain in {written, unquote(written), unquote_plus(written)}
        for form in (plain, quote(plain, safe=""), quote_plus(plain))
        if form
    }
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
