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
    "Framing",
    "PostJson",
    "PromptUsage",
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

PromptUsage = Callable[[Sequence[Message]], Awaitable["int | None"]]
"""The prompt tokens the server itself reports for a conversation (a one-token answer,
not streamed); None when it reports none."""


class Framing(NamedTuple):
    """What a server's chat template adds to the text of the messages, in tokens,
    measured against the server's own prompt counts: so much a message, and a base
    that differs when no system message is given (a template may then add its own,
    as SmolLM2's and Qwen's do)."""

    per_message: float
    base: float
    """With a system message among the messages."""
    base_without_system: float

    def tokens(self, messages: Sequence[Message]) -> int:
        has_system = any(m.role == "system" for m in messages)
        base = self.base if has_system else self.base_without_system
        return max(0, round(base + self.per_message * len(messages)))


_PROBES: tuple[tuple[Message, ...], ...] = (
    (Message(role="user", content="Hello there."),),
    (
        Message(role="user", content="Hello there."),
        Message(role="assistant", content="Hi."),
        Message(role="user", content="How are you?"),
    ),
    (Message(role="system", content="Be brief."), Message(role="user", content="Hello there.")),
)
"""Conversations whose framing is measured: one message, three, and two with a system
message (the three unknowns of :class:`Framing`)."""


def _joined(messages: Sequence[Message]) -> str:
    return "\n".join(m.content for m in messages)


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

    Args:
        post: sends a tokenize request.
        root: the server's root URL.
        model: the model the requests name.
        prompt_usage: the server's own prompt count of a conversation; with it, what a
            chat template adds is measured once (three one-token answers) where the
            tokenizer counts text only. Without it, such a server's prompts are not
            counted.
    """

    def __init__(
        self, post: PostJson, root: str, model: str, prompt_usage: PromptUsage | None = None
    ) -> None:
        self._post = post
        self._prompt_usage = prompt_usage
        self._framing: Framing | None = None
        self._framing_measured = False
        self._root = root.rstrip("/")
        self._model = model
        self._form: _Form | None = None
        self._absent = False
        """Every form was refused: the server has no tokenizer to offer."""
        self._chat: bool | None = None
        """Whether the server tokenized chat messages (None: not asked yet)."""
        self._finding = anyio.Lock()
        self._measuring = anyio.Lock()

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

    async def framing(self) -> Framing | None:
        """What the chat template adds, measured once; None when it cannot be (no
        ``prompt_usage``, or the server reports no usage even when not streaming)."""
        if self._framing_measured:
            return self._framing
        async with self._measuring:  # once, however many calls wait for it
            if not self._framing_measured:
                self._framing = await self._measure_framing()
                self._framing_measured = True
        return self._framing

    async def _measure_framing(self) -> Framing | None:
        if self._prompt_usage is None:
            return None
        added: list[int] = []
        for probe in _PROBES:
            try:
                reported = await self._prompt_usage(probe)
            except Exception:  # a count is never worth failing a call over
                return None
            counted = await self.count(_joined(probe))
            if reported is None or counted is None:
                return None
            added.append(reported - counted)
        one, three, with_system = added
        per_message = (three - one) / 2
        return Framing(
            per_message=per_message,
            base=with_system - 2 * per_message,
            base_without_system=one - per_message,
        )

    async def count_prompt(self, messages: Sequence[Message]) -> int | None:
        """The prompt tokens of a chat: exact (template included) where the server
        tokenizes messages (vLLM, SGLang); elsewhere the messages' text counted by the
        server plus what its chat template adds (:meth:`framing`), or None when that
        cannot be measured."""
        text = _joined(messages)
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
        framing = await self.framing()
        if framing is None:
            return None
        if counted is None:
            counted = await self.count(text)
        if counted is None:
            return None
        return counted + framing.tokens(messages)


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
