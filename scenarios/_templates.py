"""Prompt templates with the guide's ``{name}`` placeholders, rendered safely.

Syntax: ``{name}`` inserts a variable; ``{name:spec}`` applies a format spec (e.g.
``{price:.2f}``); ``{{`` and ``}}`` are literal braces. Names are plain identifiers:
attribute access (``{x.__class__}``), indexing (``{x[0]}``), conversions (``{x!r}``) and
nested fields are rejected when the template is parsed, so a template can never reach
an object's internals. Values are inserted as text and never parsed as templates, so
user data cannot inject placeholders either.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from convsim._errors import TemplateError, TranscriptTooLong
from convsim._plural import counted

__all__ = ["Template"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WIDE = re.compile(r"\d{4,}")  # widths/precisions >= 1000 would only waste memory
_NUMBER = re.compile(r"\d+")
#: The most characters a template's format specs may pad to, all placeholders together.
MAX_PADDING = 100_000


@dataclass(frozen=True)
class _Part:
    literal: str
    field: str | None
    spec: str


@dataclass(frozen=True)
class Template:
    """A parsed template. Build with :meth:`parse`; render with :meth:`render`."""

    source: str
    fields: frozenset[str]
    _parts: tuple[_Part, ...]

    @classmethod
    def parse(cls, source: str) -> Template:
        """Parse ``source``; raise TemplateError for malformed or unsafe placeholders."""
        parts: list[_Part] = []
        try:
            parsed = list(string.Formatter().parse(source))
        except ValueError as exc:
            raise TemplateError(
                f"malformed template: {exc} (write '{{{{' or '}}}}' for a literal brace)"
            ) from None
        for literal, field, spec, conversion in parsed:
            if field is None:
                parts.append(_Part(literal, None, ""))
                continue
            if not _NAME.fullmatch(field):
                what = "empty placeholder '{}'" if field == "" else f"placeholder {{{field}}}"
                raise TemplateError(
                    f"{what} is not allowed: use a plain variable name such as {{question}}; "
                    "attribute access, indexing and positional fields are rejected"
                )
            if conversion is not None:
                raise TemplateError(f"conversion '!{conversion}' in {{{field}}} is not allowed")
            if "{" in (spec or "") or "}" in (spec or ""):
                raise TemplateError(f"nested placeholder in the format spec of {{{field}}}")
            if spec and _WIDE.search(spec):
                raise TemplateError(f"format spec {spec!r} of {{{field}}} is too wide")
            parts.append(_Part(literal, field, spec or ""))
        padding = sum(int(n) for p in parts for n in _NUMBER.findall(p.spec))
        if padding > MAX_PADDING:
            # each width is < 1000, but thousands of them would make every prompt huge
            raise TemplateError(
                f"the format specs pad to {counted(padding, 'character', grouped=True)} in all, "
                f"over {MAX_PADDING:,}"
            )
        fields = frozenset(p.field for p in parts if p.field is not None)
        return cls(source, fields, tuple(parts))

    def render(self, values: Mapping[str, Any], *, max_chars: int | None = None) -> str:
        """Fill the placeholders from ``values``; raise TemplateError if one is missing,
        or, with ``max_chars``, before the text would pass that many characters (a
        template that repeats ``{context}`` must not build a prompt without end)."""
        out: list[str] = []
        size = 0
        for part in self._parts:
            pieces = [part.literal]
            if part.field is not None:
                try:
                    value = values[part.field]
                except KeyError:
                    raise TemplateError(
                        f"template variable {{{part.field}}} is not defined"
                    ) from None
                pieces.append(self._formatted(part, value))
            for piece in pieces:
                size += len(piece)
                out.append(piece)
            if max_chars is not None and size > max_chars:
                raise TranscriptTooLong(
                    f"the rendered prompt passes the "
                    f"{counted(max_chars, 'character', grouped=True)} left in the conversation's "
                    "transcript (max_transcript_chars)",
                    limit=max_chars,
                )
        return "".join(out)

    @staticmethod
    def _formatted(part: _Part, value: Any) -> str:
        if not part.spec:
            return value if isinstance(value, str) else str(value)
        try:
            return format(value, part.spec)
        except (ValueError, TypeError, OverflowError) as exc:
            raise TemplateError(
                f"cannot format {{{part.field}:{part.spec}}} with {_short(value)}: {exc}",
                part.field,
            ) from None


def _short(value: Any) -> str:
    """A value as an error message shows it: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
