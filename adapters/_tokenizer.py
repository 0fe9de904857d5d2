"""Counting tokens with the model's own tokenizer, for answers that came without usage.

A server that sends no usage (a stream from a server that ignores
``stream_options.include_usage``) can often still count: vLLM and SGLang answer
``POST /tokenize`` (and take chat messages there, template included), llama.cpp's server
``POST /tokenize`` with ``content``, llama-cpp-python ``POST /extras/tokenize``.
:class:`ServerTokenizer` finds which of them the server speaks, once, and counts with it.
``convsim run`` (through the adapters) and ``convsim load`` (its calibration) use this one
implementation, so both count a server's tokens the same way.

A local tokenizer (tiktoken, for OpenAI's models) is :func:`tiktoken_counter`: optional,
used only when the package is installed (extra ``tiktoken``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NamedTuple

import anyio

from convsim._types import Message

__all__ = [
    "MESSAGE_OVERHEAD_TOKENS",
    "PostJson",
    "ServerTokenizer",
    "TokenCounter",
    "tiktoken_counter",
    "tokenizer_root",
]

MESSAGE_OVERHEAD_TOKENS = 4
"""What a chat template adds per message (role markers, separators), where the
tokenizer cannot apply the template itself: the same allowance the estimate makes."""

PostJson = Callable[[str, Mapping[str, Any]], Awaitable[Any]]
"""POST a JSON body to a URL; the decoded JSON of a 200 answer, None for any other."""

TokenCounter = Callable[[str], int]
"""A local tokenizer: the tokens of a text."""


class _Form(NamedTuple):
    """One server's tokenize request."""

    path: str
    """After the server's root (base_url without ``/v1``)."""
    field: str
    """The body field that carries the text."""
    extra: Mapping[str, Any]
    """The rest of the body (the model is added where the server wants it)."""
    with_model: bool
    chat: bool
    """The server takes chat ``messages`` here too (and applies its template)."""


_FORMS = (
    _Form("/tokenize", "prompt", {"add_special_tokens": False}, True, True),  # vLLM, SGLang
    _Form("/tokenize", "content", {"add_special": False}, False, False),  # llama.cpp
    _Form("/extras/tokenize", "input", {}, True, False),  # llama-cpp-python
)


def tokenizer_root(base_url: str) -> str:
    """Where a server's tokenize endpoints live: its base_url without ``/v1``."""
    base = base_url.partition("?")[0].rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def _count(data: Any) -> int | None:
    """The token count of a tokenize answer (``count`` or the ``tokens`` list)."""
    if not isinstance(data, dict):
        return None
    count = data.get("count")
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        return count
    tokens = data.get("tokens")
    return len(tokens) if isinstance(tokens, list) else None


class ServerTokenizer:
    """The tokenize endpoint of one server, found on first use and then kept.

    Every failure is a None (the caller then estimates): a count is a nicety that
    never fails a call. A server with no endpoint is asked once, not on every answer.
    """

    def __init__(self, post: PostJson, root: str, model: str) -> None:
        self._post = post
        self._root = root.rstrip("/")
        self._model = model
        self._form: _Form | None = None
        self._absent = False
        """Every form was refused: the server has no tokenizer to offer."""
        self._chat: bool | None = None
        """Whether the server tokenized chat messages (None: not asked yet)."""
        self._finding = anyio.Lock()

    @property
    def available(self) -> bool | None:
        """True once an endpoint answered, False once none did, None before asking."""
        if self._form is not None:
            return True
        return False if self._absent else None

    def _body(self, form: _Form, text: str) -> dict[str, Any]:
        body: dict[str, Any] = {form.field: text, **form.extra}
        if form.with_model:
            body["model"] = self._model
        return body

    async def _ask(self, form: _Form, body: Mapping[str, Any]) -> int | None:
        try:
            return _count(await self._post(self._root + form.path, body))
        except Exception:  # a count is never worth failing a call over
            return None

    async def count(self, text: str) -> int | None:
        """The tokens of ``text`` (without special tokens); None when the server has no
        tokenize endpoint or it failed."""
        if not text:
            return 0
        if self._form is not None:
            return await self._ask(self._form, self._body(self._form, text))
        if self._absent:
            return None
        async with self._finding:  # one search, however many calls wait for it
            if self._form is None and not self._absent:
                for form in _FORMS:
                    counted = await self._ask(form, self._body(form, text))
                    if counted:  # a server that ignores the field counts an empty text
                        self._form = form
                        return counted
                self._absent = True
                return None
        return await self.count(text)

    async def count_prompt(self, messages: Sequence[Message]) -> int | None:
        """The prompt tokens of a chat: exact (template included) where the server
        tokenizes messages (vLLM, SGLang); elsewhere the messages' text counted by the
        server plus :data:`MESSAGE_OVERHEAD_TOKENS` a message for the template."""
        text = "\n".join(m.content for m in messages)
        counted = None
        if self._form is None:
            counted = await self.count(text)  # finds the form
        form = self._form
        if form is None:
            return None
        if form.chat and self._chat is not False:
            body = {
                "model": self._model,
                "messages": [{"role": m.role, "content": m.content} for m in messages],
                "add_generation_prompt": True,
            }
            exact = await self._ask(form, body)
            if exact:
                self._chat = True
                return exact
            self._chat = False
        if counted is None:
            counted = await self.count(text)
        if counted is None:
            return None
        return counted + MESSAGE_OVERHEAD_TOKENS * len(messages)


def tiktoken_counter(model: str) -> TokenCounter | None:
    """tiktoken's tokenizer for an OpenAI model, when tiktoken is installed and knows
    the model; None otherwise (tiktoken fetches its vocabulary once, so an offline
    machine without it cached gets None too)."""
    try:
        import tiktoken
    except ImportError:
        return None
    try:
        encoding = tiktoken.encoding_for_model(model)
    except Exception:  # an unknown model, or a vocabulary that cannot be fetched
        return None

    def count(text: str) -> int:
        return len(encoding.encode(text, disallowed_special=()))

    return count
