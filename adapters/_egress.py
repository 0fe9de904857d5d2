"""Where model calls may go: an allow-list of URL prefixes, checked on every connection.

An :class:`EgressPolicy` guards URLs that someone other than the operator chose (a
tenant of the evaluation service). A URL must be http(s), carry no fragment or dot
segments, and fall under an allowed prefix. Addresses are checked where the connection
is made, after name resolution, so a name that resolves to a private address at the
second look (DNS rebinding) is refused as at the first:

- a URL under a prefix that names its host exactly (``http://10.0.0.5:8000/v1``,
  ``https://llm.internal/v1``) may go to any address: the operator named it;
- any other URL (under ``https://`` or ``https://*.example.com``) must resolve to
  public addresses only: loopback, link-local, private, shared, multicast, reserved and
  unspecified addresses are refused, in every spelling (``2130706433``, ``127.1``,
  ``[::ffff:127.0.0.1]``, NAT64 and 6to4 forms), as is a name that resolves to one.

Redirects are not followed and proxies from the environment are not used under a
policy: either would connect to a place the check did not see.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

import anyio

from convsim._errors import ConfigError, EgressRefused

__all__ = ["EgressPolicy", "AllowedPrefix", "Target", "is_public_address"]

_DEFAULT_PORTS = {"http": 80, "https": 443}
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")

Resolve = Callable[[str, int], Awaitable[list[str]]]
"""Resolves a host name and port to IP address strings."""


def is_public_address(address: str) -> bool:
    """Whether ``address`` is a globally routable unicast address, also when it is
    written inside an IPv6 form (IPv4-mapped, NAT64, 6to4, Teredo)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in _NAT64:
            return is_public_address(str(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)))
        if ip in _NAT64_LOCAL:
            return False
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is not None:
            return is_public_address(str(embedded))
        if ip.teredo is not None:
            return all(is_public_address(str(part)) for part in ip.teredo)
    return ip.is_global and not ip.is_multicast and not ip.is_reserved


@dataclass(frozen=True)
class AllowedPrefix:
    """One ``--allow-base-url`` prefix, parsed: a scheme, a host (exact, ``*.suffix`` or
    any), a port (or any) and a path under which URLs may go."""

    text: str
    scheme: str
    host: str | None
    """Lower-case; None for any host; ``*.example.com`` for its subdomains."""
    port: int | None
    """The scheme's default when the prefix names a host without one; None: any."""
    path: str
    """Without a trailing slash ("" for the whole host)."""

    @classmethod
    def parse(cls, text: str) -> AllowedPrefix:
        parts = urlsplit(text.strip())
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS or not text.strip().lower().startswith(f"{scheme}://"):
            raise ConfigError(
                f"--allow-base-url {text!r}: expected http(s)://[HOST[:PORT]][/PATH], "
                "e.g. https://api.openai.com/v1 or http://10.0.0.5:8000/v1"
            )
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ConfigError(
                f"--allow-base-url {text!r}: a prefix has no credentials, query or fragment"
            )
        try:
            port = parts.port
        except ValueError:
            raise ConfigError(f"--allow-base-url {text!r}: the port is not a number") from None
        try:
            host = _host(text.strip()) or None
        except ValueError:
            raise ConfigError(f"--allow-base-url {text!r}: not a valid host name") from None
        if host is None and port is not None:
            raise ConfigError(f"--allow-base-url {text!r}: a port needs a host")
        if host is not None and "*" in host and not (host.startswith("*.") and "*" not in host[2:]):
            raise ConfigError(f"--allow-base-url {text!r}: a wildcard host is *.DOMAIN")
        if _dot_segments(parts.path):
            raise ConfigError(f"--allow-base-url {text!r}: the path has . or .. segments")
        if host is not None and port is None:
            port = _DEFAULT_PORTS[scheme]  # a URL without a port means the scheme's
        return cls(text.strip(), scheme, host, port, parts.path.rstrip("/"))

    @property
    def names_host(self) -> bool:
        """Whether the prefix names one host exactly (which may then be anywhere)."""
        return self.host is not None and not self.host.startswith("*.")

    def matches(self, url: SplitResult, host: str, port: int) -> bool:
        if url.scheme.lower() != self.scheme:
            return False
        if self.host is not None:
            if self.host.startswith("*."):
                if not host.endswith(self.host[1:]):
                    return False
            elif host != self.host:
                return False
        if self.port is not None and port != self.port:
            return False
        path = url.path
        return path == self.path or path.startswith(self.path + "/") or not self.path


def _host(url: str) -> str:
    """The host the HTTP client will connect to, as it normalises it (IDNA: full-width
    digits and ideographic dots become ASCII), lower case, without a trailing dot."""
    from yarl import URL

    return (URL(url).raw_host or "").lower().rstrip(".")


def _dot_segments(path: str) -> bool:
    return any(part in (".", "..") for part in unquote(path).replace("\\", "/").split("/"))


@dataclass(frozen=True)
class Target:
    """Where a checked URL goes."""

    host: str
    port: int
    named: bool
    """A prefix names the host exactly: any address is allowed for it."""


async def _system_resolve(host: str, port: int) -> list[str]:
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


class EgressPolicy:
    """The URLs model calls may reach, and the check made on each connection.

    Args:
        allow: URL prefixes (``https://api.openai.com/v1``, ``http://10.0.0.5:8000``,
            ``https://*.example.com``, ``https://`` for any public https host).
        resolve: the name resolver (tests inject one); the system's by default.
    """

    def __init__(self, allow: Iterable[str] = (), *, resolve: Resolve | None = None) -> None:
        self.prefixes: tuple[AllowedPrefix, ...] = tuple(AllowedPrefix.parse(p) for p in allow)
        self._resolve = resolve or _system_resolve

    def __repr__(self) -> str:
        return f"EgressPolicy({[p.text for p in self.prefixes]!r})"

    def describe(self) -> str:
        """What is allowed, for an error message."""
        if not self.prefixes:
            return "no URL is allowed here (the operator allows none: use an endpoint)"
        return "allowed: " + ", ".join(p.text for p in self.prefixes)

    def check_url(self, url: str, *, field: str = "base_url") -> Target:
        """The URL's host and port if it may be called, before any name resolution.

        Raises:
            EgressRefused: naming ``field``, when the URL is not allowed.
        """
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise EgressRefused("not a valid URL", field=field) from None
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS:
            raise EgressRefused("only http and https URLs are allowed", field=field)
        try:
            host = _host(url)
        except ValueError:
            raise EgressRefused("not a valid host name", field=field) from None
        if not host:
            raise EgressRefused("the URL has no host", field=field)
        if parts.fragment or url.endswith("#"):
            raise EgressRefused("a URL with a fragment (#) is not allowed", field=field)
        if _dot_segments(parts.path):
            raise EgressRefused("a URL with . or .. path segments is not allowed", field=field)
        port = port if port is not None else _DEFAULT_PORTS[scheme]
        matched = [p for p in self.prefixes if p.matches(parts, host, port)]
        if not matched:
            raise EgressRefused(f"the URL is not under an allowed prefix ({self.describe()})",
                                field=field)  # fmt: skip
        named = any(p.names_host for p in matched)
        if not named and _is_address(host) and not is_public_address(host):
            raise EgressRefused(_private(host), field=field)
        return Target(host, port, named)

    async def addresses(
        self, host: str, port: int, *, named: bool, field: str = "base_url"
    ) -> list[str]:
        """``host`` resolved, keeping only the addresses a connection may go to: any
        when a prefix names the host (``named``), public ones otherwise.

        Raises:
            EgressRefused: when the name does not resolve, or only to refused addresses.
        """
        try:
            found = await self._resolve(host, port)
        except OSError as exc:
            raise EgressRefused(f"the host does not resolve ({exc.strerror or exc})",
                                field=field) from None  # fmt: skip
        except ValueError:  # UnicodeError included: a name IDNA cannot encode
            raise EgressRefused("not a valid host name", field=field) from None
        allowed = [a for a in found if named or is_public_address(a)]
        if not allowed:
            raise EgressRefused(_private(host), field=field)
        return allowed

    async def check(self, url: str, *, field: str = "base_url") -> None:
        """:meth:`check_url`, then the host resolved: the whole check made before a job
        is accepted (the connection checks again, at every connection)."""
        target = self.check_url(url, field=field)
        if not _is_address(target.host):
            await self.addresses(target.host, target.port, named=target.named, field=field)

    def resolver(self, named: set[tuple[str, int]]) -> Any:
        """An aiohttp resolver that hands out only allowed addresses; ``named`` holds
        the (host, port) pairs of the URLs checked so far whose prefix names the host,
        filled by the transport as it checks each URL."""
        from aiohttp.abc import AbstractResolver

        policy = self

        class _EgressResolver(AbstractResolver):
            async def resolve(
                self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
            ) -> list[Any]:
                bare = host.lower().rstrip(".")
                try:
                    found = await policy.addresses(host, port, named=(bare, port) in named)
                except EgressRefused as exc:
                    raise EgressBlocked(str(exc)) from None
                return [_resolved(host, address, port) for address in found]

            async def close(self) -> None:
                return None

        return _EgressResolver()


class EgressBlocked(OSError):
    """Raised inside the HTTP library when a connection would go where the policy does
    not allow; the transport turns it into :class:`~convsim.EgressRefused`."""


def _resolved(host: str, address: str, port: int) -> dict[str, Any]:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    return {"hostname": host, "host": address, "port": port, "family": family,
            "proto": 0, "flags": socket.AI_NUMERICHOST}  # fmt: skip


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    return True


def _private(host: str) -> str:
    return (
        f"{host} is (or resolves to) a loopback, private, link-local or reserved address; "
        "only an operator's --allow-base-url naming the host exactly allows one"
    )
