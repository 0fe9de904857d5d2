"""The mock tokenizer and the mock model's logprobs.

``/v1/completions`` answers ``echo`` and ``logprobs`` with them, so a test can work out
the exact loglikelihood lm-eval gets (:func:`mock_tokens`, :func:`mock_token_logprob`,
:func:`mock_logprobs`).
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from typing import Any, NamedTuple

__all__ = [
    "MockToken",
    "mock_tokens",
    "mock_token_logprob",
    "mock_logprobs",
    "MOCK_GREEDY_MIN",
    "MOCK_ALTERNATIVE",
]

_TOKEN = re.compile(r"\s*(?:\w+|[^\w\s])|\s+")
"""A word or a single punctuation mark, each with the whitespace before it; whitespace
at the very end is a token of its own. The tokens of a text join back to the text."""

MOCK_GREEDY_MIN = -2.0
"""A token whose logprob is at least this is the model's top choice at its position."""
MOCK_ALTERNATIVE = ("<alt>", -0.5)
"""The top choice (token, logprob) wherever the actual token is not. No text splits
into this token, so it never collides with a real one."""


class MockToken(NamedTuple):
    """One token of the mock tokenizer and where it starts."""

    text: str
    offset: int
    """Character offset of the token in the text it was read from."""


def mock_tokens(text: str) -> list[MockToken]:
    """The mock tokenizer: the tokens covering ``text``, each with its offset.

    ``"Answer: Paris"`` is ``[("Answer", 0), (":", 6), (" Paris", 7)]``.
    """
    return [MockToken(m.group(), m.start()) for m in _TOKEN.finditer(text)]


@lru_cache(maxsize=16384)
def mock_token_logprob(token: str, seed: int) -> float:
    """The mock model's logprob of ``token``, whatever came before it:
    ``-(1 + H % 800) / 100`` where ``H`` is the first 4 bytes (big-endian) of
    ``sha256(f"{seed}:{token}")``; so between -8.00 and -0.01, in steps of 0.01."""
    digest = hashlib.sha256(f"{seed}:{token}".encode()).digest()
    return -(1 + int.from_bytes(digest[:4], "big") % 800) / 100


def mock_logprobs(
    prompt: str, completion: str, *, echo: bool, top: int, seed: int
) -> dict[str, Any]:
    """The ``choices[0].logprobs`` object the mock server answers with.

    The prompt and the completion are tokenized apart (:func:`mock_tokens`), as a
    server reads a prompt and then generates; with ``echo`` the prompt's tokens come
    first, otherwise only the completion's are listed. ``text_offset`` counts characters
    into the answer's ``text`` (which starts with the prompt when echoed). The very
    first token of prompt + completion has no context: its ``token_logprobs`` and
    ``top_logprobs`` entries are None. Every other token has
    :func:`mock_token_logprob`; its ``top_logprobs`` lists the ``top`` most likely of:
    the token itself if its logprob is at least :data:`MOCK_GREEDY_MIN` (a completion
    token always, as generation is greedy), otherwise :data:`MOCK_ALTERNATIVE` and then
    the token.
    """
    pieces = [(t.text, t.offset, False) for t in mock_tokens(prompt)]
    pieces += [(t.text, len(prompt) + t.offset, True) for t in mock_tokens(completion)]
    start = 0 if echo else len(prompt)
    tokens: list[str] = []
    values: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    for index, (token, offset, generated) in enumerate(pieces):
        if echo or generated:
            tokens.append(token)
            offsets.append(offset - start)
            if index == 0:
                values.append(None)
                tops.append(None)
                continue
            value = mock_token_logprob(token, seed)
            values.append(value)
            if generated or value >= MOCK_GREEDY_MIN:
                choices = [(token, value)]
            else:
                choices = [MOCK_ALTERNATIVE, (token, value)]
            tops.append(dict(choices[:top]))
    return {
        "tokens": tokens,
        "token_logprobs": values,
        "top_logprobs": tops,
        "text_offset": offsets,
    }
