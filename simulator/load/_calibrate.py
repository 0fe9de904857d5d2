"""Sizing synthetic text in the server's own tokens, without downloading a tokenizer.

Before a run, a few probes (outside the measured window) ask the server how many tokens
the synthetic vocabulary makes: its tokenize endpoint where it has one (the adapter's
:meth:`~convsim.adapters.ModelAdapter.count_tokens`: vLLM, SGLang, llama.cpp,
llama-cpp-python), otherwise the
prompt tokens its usage reports for one-token generations of known texts. The same
probes measure what a chat template adds (the prompt of an empty conversation), and
one more asks for an exact output length, to learn whether the server honours
``min_tokens``/``ignore_eos``.
"""

from __future__ import annotations

from dataclasses import dataclass

from convsim._errors import AdapterError
from convsim._log import get_logger
from convsim._types import GenerationParams, Message
from convsim.adapters import ModelAdapter

from ._workloads import VOCABULARY_SIZE, TokenText, vocabulary_text

__all__ = ["Calibration", "calibrate"]

log = get_logger("convsim.load")

_EXACT_PROBE_TOKENS = 16


@dataclass(frozen=True)
class Calibration:
    """What the probes learned about the server's tokens."""

    method: str
    """``tokenize``, ``usage`` or ``none`` (the server reported no usage)."""
    tokens_per_word: float
    user_base_tokens: float
    """Prompt tokens of a conversation of one user message, besides the message's text."""
    system_tokens: float
    """Tokens a system message adds besides its text; negative when the chat template
    puts a default system prompt of its own in a conversation that has none (SmolLM2,
    Qwen) and the given one replaces it."""
    exact_output: bool
    """Whether the server answered an exact-length request with exactly that length."""
    notes: tuple[str, ...] = ()

    @property
    def text(self) -> TokenText:
        return TokenText(self.tokens_per_word)

    def first_turn_base(self, system_tokens_asked: int) -> float:
        """Prompt tokens of a first turn besides its user text."""
        if system_tokens_asked <= 0:
            return self.user_base_tokens
        return self.user_base_tokens + self.system_tokens + system_tokens_asked


async def _prompt_tokens(adapter: ModelAdapter, messages: list[Message]) -> int | None:
    completion = await adapter.generate(messages, GenerationParams(max_tokens=1))
    # the server's own count: a template's tokens are what is being measured
    return completion.usage.prompt_tokens if completion.usage.source == "server" else None


async def _exact_output(adapter: ModelAdapter) -> tuple[bool, str | None]:
    params = GenerationParams(
        max_tokens=_EXACT_PROBE_TOKENS, min_tokens=_EXACT_PROBE_TOKENS, ignore_eos=True
    )
    try:
        completion = await adapter.generate([Message(role="user", content="Hello")], params)
    except AdapterError as exc:
        if exc.status_code == 400:
            return False, (
                "the server refused min_tokens/ignore_eos: output lengths are caps "
                f"(max_tokens), not exact ({exc})"
            )
        raise
    got = completion.usage.completion_tokens
    if completion.usage.estimated:
        return False, (
            "the server reported no usage, so exact output lengths cannot be checked: "
            "output lengths are caps (max_tokens)"
        )
    if got != _EXACT_PROBE_TOKENS:
        return False, (
            f"asked for exactly {_EXACT_PROBE_TOKENS} output tokens, the server gave {got}: "
            "output lengths are caps (max_tokens), not exact"
        )
    return True, None


async def calibrate(adapter: ModelAdapter, *, exact_output: bool = True) -> Calibration:
    """Probe the server behind ``adapter`` (a handful of one-token requests).

    Raises:
        AdapterError: a probe failed for another reason than an unsupported option.
    """
    notes: list[str] = []
    one = vocabulary_text(VOCABULARY_SIZE)
    two = vocabulary_text(2 * VOCABULARY_SIZE)
    small = vocabulary_text(32)
    p_one = await _prompt_tokens(adapter, [Message(role="user", content=one)])
    p_two = await _prompt_tokens(adapter, [Message(role="user", content=two)])
    method = "usage"
    per_word = 1.0
    base = 0.0
    system = 0.0
    if p_one is None or p_two is None:
        method = "none"
        notes.append(
            "the server reported no token usage: input lengths assume one token per word "
            "and token throughput is not measured"
        )
    else:
        # the one counting `convsim run` uses (an adapter-like object may lack it)
        count_tokens = getattr(adapter, "count_tokens", None)
        counted = await count_tokens(one) if count_tokens is not None else None
        if counted is not None and counted > 0:
            method, per_word = "tokenize", counted / VOCABULARY_SIZE
        else:
            per_word = (p_two - p_one) / VOCABULARY_SIZE
        if per_word <= 0:
            method, per_word = "none", 1.0
            notes.append("the server's prompt counts did not grow with the text: ignored")
        base = p_one - per_word * VOCABULARY_SIZE
        p_sys = await _prompt_tokens(
            adapter, [Message(role="system", content=small), Message(role="user", content=one)]
        )
        if p_sys is not None:
            # negative when a template's default system prompt gives way to the given one
            system = p_sys - p_one - per_word * 32
    exact = False
    if exact_output:
        exact, note = await _exact_output(adapter)
        if note:
            notes.append(note)
    calibration = Calibration(method, per_word, base, system, exact, tuple(notes))
    log.info(
        "load_calibrated",
        method=method,
        tokens_per_word=round(per_word, 4),
        user_base_tokens=round(base, 2),
        system_tokens=round(system, 2),
        exact_output=exact,
    )
    return calibration
