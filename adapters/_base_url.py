"""What makes a model endpoint's URL usable: http(s), a host, a port in range.

Checked when an adapter's settings are read, so that a URL no request could reach
(``127.0.0.1:8000/v1`` without its scheme, ``http//host``, port 99999, ``unix://``)
stops the run before it starts, naming the setting, instead of failing every call.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from convsim._secrets import redact_url

__all__ = ["EXAMPLE", "check_base_url"]

EXAMPLE = "http://HOST:PORT/v1"
"""The form a base URL takes, shown in every error."""

_SCHEMES = ("http", "https")
_NOT_IN_HOST = frozenset(' <>"{}|\\^`')


def _problem(url: str) -> str | None:
    """What is wrong with ``url`` as a model endpoint, or None."""
    if "://" not in url:
        return "has no scheme (http:// or https://)"
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        return f"is not a URL ({exc})"
    if parts.scheme not in _SCHEMES:
        return f"uses {parts.scheme or 'no'}:// where convsim speaks http:// or https:// only"
    host = parts.hostname
    if not host:
        return "has no host"
    if any(c in _NOT_IN_HOST or c.isspace() or ord(c) < 32 for c in host):
        return f"has an invalid host {host!r}"
    try:
        port = parts.port
    except ValueError:
        port_text = parts.netloc.rpartition("@")[2].rpartition(":")[2]
        return f"has an invalid port {port_text!r} (a number from 1 to 65535)"
    if port == 0:
        return "has port 0 (a port is a number from 1 to 65535)"
    return None


def check_base_url(value: str) -> str:
    """``value`` without surrounding spaces, when it is an http(s) URL with a host and a
    valid port.

    Raises:
        ValueError: saying what is wrong and what a valid URL looks like (credentials in
            ``value`` are not shown).
    """
    url = value.strip()
    problem = _problem(url)
    if problem is None:
        return url
    fixed = f"http://{url}"
    if "://" not in url and _problem(fixed) is None and not url.lower().startswith("http"):
        hint = f"did you mean {redact_url(fixed)}? (a base URL looks like {EXAMPLE})"
    else:
        hint = f"a base URL looks like {EXAMPLE}, e.g. http://127.0.0.1:8000/v1"
    raise ValueError(f"{redact_url(url)!r} {problem}: {hint}")
