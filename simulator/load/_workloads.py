"""What the sessions of a load run say: synthetic text, a scenario pack, or ShareGPT.

A workload hands the driver one :class:`SessionScript` per session index, the same for
the same index and seed wherever it runs (so workers can split sessions by index). A
script holds the system prompt and the turns; a turn's user message is text, or (packs)
a function of the transcript so far, which holds the model's real answers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np
from pydantic import ValidationError

from convsim._errors import ConfigError
from convsim._types import Message, ToolCall, ToolSpec

from ._distributions import SyntheticWorkload

__all__ = [
    "TurnScript",
    "SessionScript",
    "Workload",
    "TokenText",
    "SyntheticSessions",
    "PackSessions",
    "ShareGPTSessions",
    "read_sharegpt",
    "vocabulary_text",
    "vocabulary_words",
    "VOCABULARY_SIZE",
]

UserText = str | Callable[[Sequence[Message]], str]


@dataclass(frozen=True, slots=True)
class TurnScript:
    """One turn of a session: what the user says and how many tokens to ask for.

    ``input_tokens`` is what the workload meant the user message to hold, in the
    server's tokens (None when the text is not synthetic).
    """

    user: UserText
    max_tokens: int | None = None
    exact_output: bool = False
    """Ask the server for exactly ``max_tokens`` (``min_tokens`` and ``ignore_eos``)."""
    input_tokens: int | None = None
    turn_id: str | None = None
    """The pack turn it renders (None for synthetic and ShareGPT turns)."""
    tools: tuple[ToolSpec, ...] = ()
    """Tools the turn's requests offer: a tool turn. The model's calls are answered
    with :attr:`tool_results` (no tool runs) and the answers sent in the turn's next
    request, until the model answers in text or :attr:`max_tool_rounds` is reached."""
    tool_results: tuple[tuple[str, str], ...] = ()
    """The result given for each tool, as ``(name, content)`` pairs."""
    max_tool_rounds: int = 5
    """Replies asking for tools that are answered in one turn; one more is not."""

    def tool_message(self, call: ToolCall) -> Message:
        """The ``tool`` message answering ``call``: the workload's result for its tool,
        or an error naming a tool the turn does not give a result for."""
        content = dict(self.tool_results).get(call.name)
        if content is None:
            content = json.dumps({"error": f"unknown tool {call.name!r}"})
        return Message(role="tool", content=content, tool_call_id=call.id, name=call.name)


@dataclass(frozen=True, slots=True)
class SessionScript:
    """One session: an id, an optional system prompt, and its turns in order."""

    session_id: str
    system: str | None
    turns: tuple[TurnScript, ...]
    prefix_tokens: int = 0
    """Tokens of the shared system prompt, as asked (0 when there is none)."""


class Workload(Protocol):
    """Sessions by index; ``size`` is how many distinct sessions there are (None when
    there is no end to them)."""

    @property
    def size(self) -> int | None: ...

    def session(self, index: int) -> SessionScript: ...


# Common English words that most tokenizers (GPT, Llama, Mistral, Qwen) hold as one
# token each after a space, so that word counts track token counts closely.
_WORDS = tuple(
    """time people way day man thing woman life child world school state family student
    group country problem hand part place case week company system program question work
    number night point home water room mother area money story fact month lot right study
    book eye job word business issue side kind head house service friend father power hour
    game line end member law car city name team minute idea body information back parent
    face level office door health person art war history party result change morning
    reason research girl guy moment air teacher force education foot boy age policy music
    market sense nation plan college interest death experience effect class control care
    field development role effort rate heart drug show leader light voice wife police mind
    price report decision son view relationship town road arm difference value building
    action model season society tax director position player record paper space ground form
    event official matter center couple site project activity star table need court oil
    situation cost industry figure street image phone data picture practice piece land
    product doctor wall patient worker news test movie north love support technology step
    baby computer type attention film tree source organization hair window evidence
    population truth song chance river""".split()
)


@dataclass(frozen=True)
class TokenText:
    """Synthetic text of a wanted length in the server's tokens.

    ``tokens_per_word`` comes from calibration against the server (its tokenize
    endpoint, or the prompt tokens it reports for probes); 1.0 without it.
    """

    tokens_per_word: float = 1.0

    def words_for(self, tokens: int) -> int:
        """How many words make ``tokens`` tokens."""
        return max(0, round(tokens / self.tokens_per_word))

    def text(self, tokens: int, rng: np.random.Generator) -> str:
        """Common words holding about ``tokens`` tokens: consecutive words of the
        vocabulary from a random place, so that any length holds an even mix of them
        (its token count then strays little from the calibrated mean)."""
        return self.text_at(tokens, int(rng.integers(0, len(_WORDS))))

    def text_at(self, tokens: int, start: int) -> str:
        """As :meth:`text`, from word ``start`` of the vocabulary."""
        return vocabulary_text(self.words_for(tokens), start)


def vocabulary_text(words: int, start: int = 0) -> str:
    """``words`` words of the vocabulary, in order from ``start``, wrapping around."""
    n = len(_WORDS)
    return " ".join(_WORDS[(start + j) % n] for j in range(words))


VOCABULARY_SIZE = len(_WORDS)


def vocabulary_words(indices: Sequence[int]) -> str:
    """The vocabulary's words at ``indices`` (each below :data:`VOCABULARY_SIZE`)."""
    return " ".join([_WORDS[i] for i in indices])


def _draw(dist: Any, rng: np.random.Generator) -> int:
    return int(dist.sample(rng, 1)[0])


_BLOCK = 512
"""Synthetic sessions are drawn this many at a time (numpy draws cost the same for one
value as for hundreds: per session they would cost more than sending its request)."""
_BLOCKS_KEPT = 4


class _Block(NamedTuple):
    """The draws of sessions ``[n * _BLOCK, (n + 1) * _BLOCK)``: session ``i`` of the
    block has turns ``first[i]:first[i + 1]`` of the other arrays."""

    first: list[int]
    input_tokens: list[int]
    output_tokens: list[int]
    starts: list[int]


@dataclass(frozen=True)
class SyntheticSessions:
    """Sessions made up from a :class:`SyntheticWorkload`: random words of the asked
    lengths, a shared system prompt of ``prefix_tokens``, exact output lengths."""

    workload: SyntheticWorkload
    text: TokenText = TokenText()
    seed: int = 0
    exact_output: bool = True
    _blocks: dict[int, _Block] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def size(self) -> int | None:
        return None

    @cached_property
    def _prefix(self) -> tuple[str | None, int]:
        rng = np.random.default_rng([self.seed, 0x5EED])
        tokens = _draw(self.workload.prefix_tokens, rng)
        return (self.text.text(tokens, rng) or None, tokens) if tokens else (None, 0)

    def _block(self, number: int) -> _Block:
        block = self._blocks.get(number)
        if block is None:
            w = self.workload
            rng = np.random.default_rng([self.seed, number, 0xB10C])
            turns = np.maximum(w.turns.sample(rng, _BLOCK), 1).astype(np.int64)
            first = np.concatenate(([0], np.cumsum(turns)))
            total = int(first[-1])
            block = _Block(
                first.tolist(),
                np.maximum(w.input_tokens.sample(rng, total), 1).astype(np.int64).tolist(),
                np.maximum(w.output_tokens.sample(rng, total), 1).astype(np.int64).tolist(),
                rng.integers(0, len(_WORDS), total).tolist(),
            )
            while len(self._blocks) >= _BLOCKS_KEPT:
                del self._blocks[next(iter(self._blocks))]
            self._blocks[number] = block
        return block

    def session(self, index: int) -> SessionScript:
        system, prefix_tokens = self._prefix
        block = self._block(index // _BLOCK)
        i = index % _BLOCK
        scripts = tuple(
            TurnScript(
                user=self.text.text_at(block.input_tokens[t], block.starts[t]) or _WORDS[0],
                max_tokens=block.output_tokens[t],
                exact_output=self.exact_output,
                input_tokens=block.input_tokens[t],
            )
            for t in range(block.first[i], block.first[i + 1])
        )
        return SessionScript(f"s{index}", system, scripts, prefix_tokens)


@dataclass(frozen=True)
class PackSessions:
    """Sessions from a scenario pack's conversations, each user message rendered from
    its template with the real answers so far; the pack is gone through in a seeded
    order, reshuffled each round, ``repeat`` rounds (None: as many as the run takes)."""

    conversations: tuple[Any, ...]
    """:class:`convsim.scenarios.Conversation` objects."""
    repeat: int | None = None
    seed: int = 0
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if not self.conversations:
            raise ConfigError("the pack holds no conversations to send")
        for conv in self.conversations:
            for turn in conv.flow.turns:
                if turn.config.role == "user":
                    raise ConfigError(
                        f"{conv.source}: turn {turn.turn_id!r} is written by a simulated "
                        "user; a load test sends scripted turns only (use a pack whose turns "
                        "are all role: assistant)"
                    )

    @property
    def size(self) -> int | None:
        return None if self.repeat is None else self.repeat * len(self.conversations)

    def _order(self, rounds: int) -> np.ndarray:
        return np.random.default_rng([self.seed, rounds]).permutation(len(self.conversations))

    def session(self, index: int) -> SessionScript:
        n = len(self.conversations)
        rounds, position = divmod(index, n)
        conv = self.conversations[int(self._order(rounds)[position])]
        system = conv.scenario.system_prompt or conv.flow.flow.system_prompt

        def user_text(turn: Any) -> UserText:
            def render(transcript: Sequence[Message]) -> str:
                return str(conv.render(turn, transcript))

            return render

        kept: set[str] = set()
        turns = []
        for turn in conv.flow.turns:
            # as a run plans them: an optional turn without its variables is skipped, and
            # so is a turn depending on a skipped one
            if turn.config.optional and conv.missing_variables(turn):
                continue
            if any(dep not in kept for dep in turn.config.depends_on):
                continue
            kept.add(turn.turn_id)
            turns.append(
                TurnScript(user=user_text(turn), max_tokens=self.max_tokens, turn_id=turn.turn_id)
            )
        return SessionScript(f"{conv.conversation_id}#{rounds}", system, tuple(turns))


@dataclass(frozen=True)
class _ShareGPTConversation:
    conversation_id: str
    system: str | None
    users: tuple[str, ...]
    reply_words: tuple[int | None, ...]
    """Words of the recorded reply to each user message (None where there is none)."""
    tools: tuple[ToolSpec, ...] = ()
    """The tools the recorded conversation offered (``tools``): its turns are tool turns."""
    tool_results: tuple[tuple[tuple[str, str], ...], ...] = ()
    """Per user turn, the result given for each tool: the one recorded in that turn, else
    the first recorded anywhere in the conversation (empty without tools)."""
    reply_tokens: tuple[int | None, ...] = ()
    """Tokens asked for each user turn, where the data gives them as tokens (a dataset's
    output length column); empty otherwise, and the reply's words are counted."""


def _tool_specs(raw: Any, where: str) -> tuple[ToolSpec, ...]:
    """A dataset item's ``tools``: OpenAI ``{"type": "function", "function": {...}}``
    entries or bare ``{"name", "description", "parameters"}`` ones."""
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: tools: expected a list of tools")
    specs = []
    for k, entry in enumerate(raw):
        body = entry.get("function", entry) if isinstance(entry, dict) else None
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            raise ConfigError(f"{where}: tools.{k}.name: expected the tool's name")
        parameters = body.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise ConfigError(f"{where}: tools.{k}.parameters: expected a JSON schema object")
        try:
            spec = ToolSpec(
                name=body["name"],
                description=str(body.get("description") or ""),
                parameters=parameters,
            )
        except ValidationError:
            raise ConfigError(
                f"{where}: tools.{k}.name: {body['name']!r} is not a tool name (1 to 64 "
                "letters, digits, _ or -)"
            ) from None
        specs.append(spec)
    return tuple(specs)


def _call_names(turn: dict[str, Any], where: str) -> dict[str, str]:
    """An assistant message's tool calls, by id: their tool's name."""
    calls = turn.get("tool_calls")
    if not isinstance(calls, list):
        raise ConfigError(f"{where}.tool_calls: expected a list of calls")
    names = {}
    for j, call in enumerate(calls):
        body = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            raise ConfigError(f"{where}.tool_calls.{j}.function.name: expected the tool's name")
        names[str(call.get("id", j))] = body["name"]
    return names


def _turns_of(item: Any, where: str) -> _ShareGPTConversation | None:
    if not isinstance(item, dict):
        raise ConfigError(f"{where}: expected an object with 'conversations'")
    turns = item.get("conversations", item.get("messages"))
    if not isinstance(turns, list):
        raise ConfigError(f"{where}: conversations: expected a list of turns")
    tools = _tool_specs(item["tools"], where) if item.get("tools") is not None else ()
    system: str | None = None
    users: list[str] = []
    replies: list[int | None] = []
    results: list[dict[str, str]] = []
    calls: dict[str, str] = {}
    for k, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise ConfigError(f"{where}: conversations.{k}: expected an object")
        role = turn.get("from", turn.get("role"))
        text = turn.get("value", turn.get("content"))
        if text is None and role in ("assistant", "gpt") and turn.get("tool_calls"):
            text = ""  # a reply that only asked for tools
        if not isinstance(text, str):
            raise ConfigError(f"{where}: conversations.{k}.value: expected text")
        if role in ("system",):
            system = text
        elif role in ("human", "user"):
            users.append(text)
            replies.append(None)
            results.append({})
        elif role in ("gpt", "assistant", "chatgpt", "bard", "bing"):
            if turn.get("tool_calls"):
                calls.update(_call_names(turn, f"{where}: conversations.{k}"))
            elif users and replies[-1] is None:
                replies[-1] = len(text.split())
        elif role == "tool":
            name = turn.get("name") or calls.get(str(turn.get("tool_call_id")))
            if not isinstance(name, str):
                raise ConfigError(
                    f"{where}: conversations.{k}.tool_call_id: answers no earlier tool call "
                    "(and the message has no name)"
                )
            if users:
                results[-1].setdefault(name, text)
        else:
            raise ConfigError(
                f"{where}: conversations.{k}.from: unknown speaker {role!r}; expected human, "
                "gpt, tool or system"
            )
    if not users:
        return None
    if any(results) and not tools:
        raise ConfigError(
            f"{where}: tools: the conversation records tool results but offers no tools"
        )
    first: dict[str, str] = {}
    for answered in results:
        for name, text in answered.items():
            first.setdefault(name, text)
    ident = item.get("id")
    return _ShareGPTConversation(
        str(ident) if ident is not None else where,
        system,
        tuple(users),
        tuple(replies),
        tools,
        tuple(tuple({**first, **answered}.items()) for answered in results) if tools else (),
    )


def read_sharegpt(path: str | Path) -> list[_ShareGPTConversation]:
    """The conversations of a ShareGPT-format file: a JSON list (or JSON lines) of
    ``{"id", "conversations": [{"from": "human"|"gpt"|"system", "value": ...}]}``
    (``messages`` with ``role``/``content`` is read too). Conversations without a user
    turn are skipped.

    Raises:
        ConfigError: naming the file, the item (or line) and the field.
    """
    path = Path(path)
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the dataset: {exc}") from exc
    items: list[tuple[str, Any]] = []
    stripped = raw.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
        items = [(f"{path}: item {i}", item) for i, item in enumerate(data)]
    else:
        for number, line in enumerate(raw.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                items.append((f"{path}:{number}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{number}: not valid JSON: {exc.msg}") from None
    conversations = [c for where, item in items if (c := _turns_of(item, where)) is not None]
    if not conversations:
        raise ConfigError(f"{path}: the dataset holds no conversation with a user turn")
    return conversations


@dataclass(frozen=True)
class ShareGPTSessions:
    """Sessions replaying a ShareGPT dataset's user turns (every turn, or with
    ``first_turn_only`` the first alone, as ``vllm bench serve`` sends ShareGPT), each
    asking for the output length the data gives in tokens, else as many tokens as the
    recorded reply had (estimated from its words with the calibrated tokens per word),
    or ``max_tokens`` when given.

    A conversation that declares ``tools`` (OpenAI's form) has tool turns: each request
    offers the tools, and the model's calls are answered with the tool results the
    conversation recorded (``role: tool`` messages), not by running anything."""

    conversations: tuple[_ShareGPTConversation, ...]
    text: TokenText = TokenText()
    seed: int = 0
    repeat: int | None = None
    max_tokens: int | None = None
    exact_output: bool = True
    first_turn_only: bool = False
    """Send each conversation's first user turn alone: single-turn sessions."""

    @property
    def size(self) -> int | None:
        return None if self.repeat is None else self.repeat * len(self.conversations)

    def session(self, index: int) -> SessionScript:
        n = len(self.conversations)
        rounds, position = divmod(index, n)
        order = np.random.default_rng([self.seed, rounds]).permutation(n)
        conv = self.conversations[int(order[position])]
        turns = []
        pairs = list(zip(conv.users, conv.reply_words, strict=True))
        for k, (user, words) in enumerate(pairs[:1] if self.first_turn_only else pairs):
            asked = self.max_tokens
            given = conv.reply_tokens[k] if conv.reply_tokens else None
            if asked is None and given is not None:
                asked = given
            elif asked is None and words is not None:
                asked = max(1, math.ceil(words * self.text.tokens_per_word))
            turns.append(
                TurnScript(
                    user=user,
                    max_tokens=asked,
                    # a tool turn leaves the model free to stop at its call
                    exact_output=self.exact_output and asked is not None and not conv.tools,
                    tools=conv.tools,
                    tool_results=conv.tool_results[k] if conv.tools else (),
                )
            )
        return SessionScript(f"{conv.conversation_id}#{rounds}", conv.system, tuple(turns))
