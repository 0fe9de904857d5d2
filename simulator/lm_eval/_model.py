"""convsim as an lm-evaluation-harness model: ``lm_eval --model convsim``.

lm-eval is optional and heavy, so nothing here is imported by ``import convsim``; call
:func:`register_lm_eval_model` (``convsim lm-eval`` does) to make the name ``convsim``
known to lm-eval's model registry. Model args: ``model=SPEC`` (as ``convsim run
--model``), ``concurrency=N``, ``max_gen_toks=N``; every other key goes to the adapter
as a ``--model-arg``, e.g.
``--model_args model=openai-compatible:MODEL,base_url=http://127.0.0.1:8000/v1,rpm=600``.

Multi-turn packs exported by ``convsim lm-eval-tasks`` (``multi_turn_scenarios_<pack>``)
send a marker instead of a prompt; those requests are run as whole conversations through
convsim's :class:`~convsim.Simulator` (``seed=N`` and ``user_model=SPEC`` model args
apply to them) and answered with the JSON of the conversation's scores.

``loglikelihood`` and ``loglikelihood_rolling`` (multiple-choice and perplexity tasks)
need prompt logprobs: ``openai-compatible:MODEL`` with ``endpoint=completions``, against a
server that answers ``echo`` with ``logprobs`` (vLLM does), e.g.
``--model_args model=openai-compatible:MODEL,base_url=URL,endpoint=completions``. Each
request is one echo call through the adapter (budgets, retries, concurrency, usage);
the server tokenizes, and the continuation is found by the tokens' text offsets (see
:func:`continuation_logprob`). Other adapters refuse these request types at once.

lm-eval calls models synchronously. Each call runs its requests on an anyio event loop
in a worker thread (a blocking portal), so it works from a plain script and from a
thread of an application that already runs a loop. A failed request never stops the
evaluation: it is recorded in :attr:`ConvsimLM.failures`, reported on stderr, kept out
of lm-eval's cache, and scored as an empty answer (``generate_until``) or as
``-inf`` (``loglikelihood``: ``(-inf, False)``, never chosen over an answer that was
scored; ``loglikelihood_rolling``: ``-inf``, an infinite perplexity).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, TypeVar

import anyio
import anyio.from_thread

from convsim._errors import ConfigError
from convsim._extras import needs_extra
from convsim._log import get_logger
from convsim._runtime._simulator import Simulator
from convsim._types import GenerationParams, Message, Usage
from convsim.adapters import (
    ADAPTERS,
    LogprobsUnsupported,
    ModelAdapter,
    ModelPool,
    PromptLogprobs,
    can_score_prompts,
    parse_model_spec,
    render_prompt,
)

from ._export import CONVERSATION_MARKER
from ._logprobs import ContinuationScore, continuation_logprob, rolling_logprob

with needs_extra("lm-eval", "the lm-eval model (convsim.lm_eval.ConvsimLM)"):
    from lm_eval.api.model import LM

__all__ = ["ConvsimLM", "FailedRequest", "LogprobsUnsupported", "register_lm_eval_model"]

log = get_logger("convsim.lm_eval")

MODEL_NAME = "convsim"
DEFAULT_CONCURRENCY = 16
DEFAULT_MAX_GEN_TOKS = 256
_MAX_API_STOPS = 4
"""Stop sequences sent to the backend (OpenAI accepts 4); all are applied client-side."""
_ROLES = frozenset({"system", "user", "assistant"})
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class FailedRequest:
    """A request that failed; lm-eval got ``""`` for it (``generate_until``),
    ``(-inf, False)`` (``loglikelihood``) or ``-inf`` (``loglikelihood_rolling``)."""

    index: int
    """Position of the request in its call."""
    error_type: str
    message: str
    request_type: str = "generate_until"
    """The lm-eval method the request came through."""


class LmRequest(NamedTuple):
    """A ``generate_until`` request's arguments, as lm-eval caches them."""

    context: str
    gen_kwargs: Mapping[str, Any]


class ConversationRef(NamedTuple):
    """Which conversation a multi-turn task's request asks for."""

    pack: str
    conversation_id: str


class RequestSettings(NamedTuple):
    """How one request is sent: its sampling settings, and every stop sequence (the
    backend gets the first few; all of them cut the answer)."""

    params: GenerationParams
    stops: list[str]


class Answer(NamedTuple):
    """What one request gave lm-eval, and the tokens it used."""

    value: Any
    usage: Usage


class Outcomes(NamedTuple):
    """A call's answers by request index, and the requests that failed (sorted)."""

    answers: dict[int, Any]
    failures: list[FailedRequest]


class ConvsimLM(LM):
    """An lm-eval ``LM`` that sends its requests through a convsim adapter:
    ``generate_until`` with any adapter, ``loglikelihood`` and ``loglikelihood_rolling``
    with one that scores prompts (``supports_prompt_logprobs``)."""

    runs_convsim_conversations = True
    """What a multi-turn task checks before lm-eval generates anything: only this model
    runs a document that is a whole conversation."""

    def __init__(
        self,
        model: str | None = None,
        concurrency: int | str = DEFAULT_CONCURRENCY,
        max_gen_toks: int | str = DEFAULT_MAX_GEN_TOKS,
        batch_size: Any = None,
        max_batch_size: Any = None,
        device: Any = None,
        seed: int | str = 0,
        user_model: str | None = None,
        allow_code: bool | str = False,
        **adapter_args: Any,
    ) -> None:
        # batch_size, max_batch_size and device come from lm-eval's own options; an API
        # model has no use for them (concurrency bounds the requests in flight).
        super().__init__()
        if not model:
            raise ConfigError(
                "the convsim lm-eval model needs model=SPEC in --model_args, e.g. "
                "model=scripted or model=openai-compatible:MODEL,base_url=URL"
            )
        self.spec = str(model)
        self.concurrency = int(concurrency)
        self.max_gen_toks = int(max_gen_toks)
        if self.concurrency < 1 or self.max_gen_toks < 1:
            raise ConfigError("concurrency and max_gen_toks must be at least 1")
        # lm-eval parses "600" to 600 and "true" to True; convsim adapters take the
        # strings a --model-arg gives them and validate them themselves.
        self.adapter_args = {k: _as_arg(v) for k, v in adapter_args.items()}
        if "base_url_env" in self.adapter_args:  # see convsim lm-eval's secret arguments
            variable = self.adapter_args.pop("base_url_env")
            if variable not in os.environ:
                raise ConfigError(f"base_url_env={variable}: no such environment variable")
            self.adapter_args["base_url"] = os.environ[variable]
        ADAPTERS.get(parse_model_spec(self.spec).type)  # an unknown type fails now
        self.seed = int(seed)
        """The run seed of multi-turn conversations (as ``convsim run --seed``)."""
        self.user_model = str(user_model) if user_model else None
        """The simulated user's spec, for multi-turn packs with user turns."""
        self.allow_code = str(allow_code).lower() in ("true", "1", "yes")
        """Let multi-turn packs run the code they name (``allow_code=true``), as
        ``convsim run --allow-code``."""
        self.failures: list[FailedRequest] = []
        """Every failed request of every call so far."""
        self.usage = Usage()
        """Tokens used by all successful calls."""
        self._chat = False
        # Build the adapter once now so bad arguments fail before lm-eval loads tasks.
        with anyio.from_thread.start_blocking_portal() as portal:
            self._no_scoring: str | None = portal.call(self._why_no_scoring)
            """Why loglikelihood requests cannot run with this adapter (None: they can)."""

    # -- lm-eval API ----------------------------------------------------------------

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        items = [_request(req.args) for req in requests]
        if not items:
            return []
        conversations: dict[int, ConversationRef] = {}
        for index, item in enumerate(items):
            ref = self._conversation_ref(item.context)
            if ref is not None:
                conversations[index] = ref
        prompts = [i for i in range(len(items)) if i not in conversations]
        results = [""] * len(items)
        failures: list[FailedRequest] = []
        with anyio.from_thread.start_blocking_portal() as portal:
            if prompts:
                generated = portal.call(self._generate_all, [items[i] for i in prompts])
                for position, text in generated.answers.items():
                    results[prompts[position]] = text
                failures.extend(
                    FailedRequest(prompts[f.index], f.error_type, f.message)
                    for f in generated.failures
                )
            if conversations:
                ran = portal.call(self._run_conversations, conversations)
                for i, text in ran.answers.items():
                    results[i] = text
                failures.extend(ran.failures)
        failures.sort(key=lambda f: f.index)
        self._record(failures, len(items), "empty answers")
        failed = {f.index for f in failures}
        for index, (item, text) in enumerate(zip(items, results, strict=True)):
            if index not in failed:  # --use_cache: a failure is retried next time
                self.cache_hook.add_partial("generate_until", item, text)
        return results

    def loglikelihood(
        self, requests: list[Any], disable_tqdm: bool = False
    ) -> list[ContinuationScore]:
        """``(loglikelihood of continuation given context, is_greedy)`` per request.

        Each ``(context, continuation)`` is scored in one echo call of the whole text
        (:func:`continuation_logprob` finds the continuation's tokens); the calls run
        concurrently, at most ``concurrency`` at once. A failed request is recorded in
        :attr:`failures` and gets ``(-inf, False)``: its answer is never chosen over
        one that was scored.
        With ``--apply_chat_template`` the context's messages are rendered as for the
        completions endpoint (the server's chat template cannot be applied to a score).

        Raises:
            LogprobsUnsupported: the adapter cannot return prompt logprobs (at once,
                before any request is sent).
        """
        self._require_scoring("loglikelihood")
        args = [(str(req.args[0]), str(req.args[1])) for req in requests]
        pairs = [(self._prompt_text(context), continuation) for context, continuation in args]

        def score(index: int, scored: PromptLogprobs) -> ContinuationScore:
            return continuation_logprob(scored, *pairs[index])

        scores, failures = self._score([c + k for c, k in pairs], "loglikelihood", score)
        self._record(failures, len(args), "-inf loglikelihoods")
        results: list[ContinuationScore] = []
        for index, item in enumerate(args):
            result = scores.get(index)
            if result is None:
                results.append(ContinuationScore(-math.inf, False))
                continue
            self.cache_hook.add_partial("loglikelihood", item, result)
            results.append(result)
        return results

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """The loglikelihood of each whole text (perplexity tasks), one echo call each
        (:func:`rolling_logprob`). A failed request is recorded in :attr:`failures` and
        gets ``-inf`` (an infinite perplexity, never a plausible number).

        Raises:
            LogprobsUnsupported: the adapter cannot return prompt logprobs.
        """
        self._require_scoring("loglikelihood_rolling")
        texts = [str(req.args[0]) for req in requests]

        def score(index: int, scored: PromptLogprobs) -> float:
            return rolling_logprob(scored)

        scores, failures = self._score(texts, "loglikelihood_rolling", score)
        self._record(failures, len(texts), "-inf loglikelihoods")
        results: list[float] = []
        for index, text in enumerate(texts):
            result = scores.get(index)
            if result is None:
                results.append(-math.inf)
                continue
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), result)
            results.append(result)
        return results

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """Keep the messages: the adapter applies the model's own chat format."""
        self._chat = True
        return json.dumps(chat_history, ensure_ascii=False)

    @property
    def tokenizer_name(self) -> str:
        return f"convsim-{self.spec}"

    def chat_template(self, chat_template: bool | str = False) -> str:
        return ""  # messages are sent as messages; the served model owns the template

    # -- internals ----------------------------------------------------------------------

    def _conversation_ref(self, context: str) -> ConversationRef | None:
        """(pack, conversation_id) when ``context`` is a multi-turn task's marker."""
        text = context.lstrip()
        if self._chat and not text.startswith(CONVERSATION_MARKER):
            # with --apply_chat_template the marker is the last message's content
            messages = self._messages(context)
            text = messages[-1].content.lstrip() if messages else ""
        if not text.startswith(CONVERSATION_MARKER):
            return None
        try:
            ref = json.loads(text[len(CONVERSATION_MARKER) :])
            return ConversationRef(str(ref["pack"]), str(ref["conversation_id"]))
        except (ValueError, TypeError, KeyError) as exc:
            raise ConfigError(f"malformed convsim conversation request {text[:120]!r}") from exc

    async def _run_conversations(self, requests: Mapping[int, ConversationRef]) -> Outcomes:
        """Run each requested conversation once through convsim's runtime, one pack
        load per pack; answer each request with the JSON of its conversation's scores."""
        by_pack: dict[str, list[str]] = {}
        for pack_ref, conversation_id in requests.values():
            by_pack.setdefault(pack_ref, [])
            if conversation_id not in by_pack[pack_ref]:
                by_pack[pack_ref].append(conversation_id)
        scores: dict[ConversationRef, str] = {}
        errors: dict[ConversationRef, FailedRequest] = {}
        async with Simulator(
            self.spec,
            model_args=self.adapter_args,
            user_model=self.user_model,
            concurrency=self.concurrency,
            seed=self.seed,
            allow_code=self.allow_code,
        ) as sim:
            handles = [(pack_ref, sim.run(pack_ref, only=ids)) for pack_ref, ids in by_pack.items()]
            for pack_ref, handle in handles:
                async for result in handle:
                    key = ConversationRef(pack_ref, result.conversation_id)
                    values = {
                        name: score.value
                        for name, score in result.scores.items()
                        if score.value is not None
                    }
                    scores[key] = json.dumps(values, sort_keys=True)
                    self.usage = self.usage + result.usage
                    if result.error is not None:
                        errors[key] = FailedRequest(-1, result.error.type, result.error.message)
                    elif result.status.value != "DONE":
                        errors[key] = FailedRequest(
                            -1, str(result.status.value), "conversation did not finish"
                        )
                for conversation_id in by_pack[pack_ref]:
                    key = ConversationRef(pack_ref, conversation_id)
                    if key not in scores:
                        errors[key] = FailedRequest(-1, "NotRun", "no result")
        answers: dict[int, str] = {}
        failures: list[FailedRequest] = []
        for index, key in requests.items():
            answers[index] = scores.get(key, "{}")
            if key in errors:
                failures.append(replace(errors[key], index=index))
        return Outcomes(answers, failures)

    def _require_scoring(self, method: str) -> None:
        """Refuse ``method`` at once when the adapter cannot return prompt logprobs."""
        if self._no_scoring is None:
            return
        raise LogprobsUnsupported(
            f"the convsim lm-eval model with model={self.spec} supports generate_until "
            f"tasks only, so it cannot run {method} (multiple-choice and perplexity tasks): "
            f"{self._no_scoring}. Prompt logprobs come from openai-compatible:MODEL with "
            "endpoint=completions against a server that supports echo with logprobs (such "
            "as vLLM): --model_args model=openai-compatible:MODEL,base_url=URL,"
            "endpoint=completions"
        )

    def _record(self, failures: Sequence[FailedRequest], total: int, scored_as: str) -> None:
        """Keep the failures of one call and report them (the evaluation goes on)."""
        self.failures.extend(failures)
        if not failures:
            return
        first = failures[0]
        log.warning(
            "lm_eval.requests_failed",
            request_type=first.request_type,
            failed=len(failures),
            total=total,
            scored_as=scored_as,
            first_error=f"{first.error_type}: {first.message}",
        )

    def _prompt_text(self, context: str) -> str:
        """The text to score for a context: itself, or with ``--apply_chat_template`` its
        messages rendered as the completions endpoint renders them for generation."""
        return render_prompt(self._messages(context))

    def _score(
        self,
        texts: Sequence[str],
        request_type: str,
        reduce: Callable[[int, PromptLogprobs], _T],
    ) -> Outcomes:
        """Score each text (one echo call) and ``reduce`` it; failures are recorded."""
        if not texts:
            return Outcomes({}, [])

        async def call(adapter: ModelAdapter, index: int) -> Answer:
            scored = await adapter.prompt_logprobs(texts[index])
            return Answer(reduce(index, scored), scored.usage)

        with anyio.from_thread.start_blocking_portal() as portal:
            return portal.call(self._each, len(texts), request_type, call)

    def _models(self) -> ModelPool:
        """Where a call's adapter comes from: as `convsim run`, one rate budget per
        provider key, a connection pool that fits the concurrency."""
        return ModelPool(concurrency=self.concurrency)

    async def _why_no_scoring(self) -> str | None:
        """Why the adapter cannot score prompts (None: it can); building it checks the
        model's arguments."""
        async with self._models() as models:
            adapter = models.get(self.spec, self.adapter_args)
            return None if can_score_prompts(adapter) else adapter.no_prompt_logprobs_reason()

    async def _generate_all(self, items: Sequence[LmRequest]) -> Outcomes:
        """Each request's answer (cut at its stop sequences) by position in ``items``."""

        async def call(adapter: ModelAdapter, index: int) -> Answer:
            item = items[index]
            settings = self._settings(item.gen_kwargs)
            completion = await adapter.generate(self._messages(item.context), settings.params)
            return Answer(_truncate(completion.text, settings.stops), completion.usage)

        return await self._each(len(items), "generate_until", call)

    async def _each(
        self,
        count: int,
        request_type: str,
        call: Callable[[ModelAdapter, int], Awaitable[Answer]],
    ) -> Outcomes:
        """Run ``call`` for requests ``0..count-1`` on one adapter, at most
        ``concurrency`` at once. A failed request is recorded and the others go on;
        the results are keyed by request index, the failures sorted by it."""
        results: dict[int, Any] = {}
        failures: list[FailedRequest] = []
        usage: list[Usage] = []
        limiter = anyio.CapacityLimiter(self.concurrency)

        async def one(adapter: ModelAdapter, index: int) -> None:
            async with limiter:
                try:
                    answer = await call(adapter, index)
                except Exception as exc:  # recorded; the evaluation goes on
                    failure = FailedRequest(index, type(exc).__name__, str(exc), request_type)
                    failures.append(failure)
                    log.warning(
                        "lm_eval.request_failed",
                        request_type=request_type,
                        index=index,
                        error_type=failure.error_type,
                        error=failure.message,
                    )
                    return
            results[index] = answer.value
            usage.append(answer.usage)

        async with self._models() as models:
            adapter = models.get(self.spec, self.adapter_args)
            async with anyio.create_task_group() as tg:
                for index in range(count):
                    tg.start_soon(one, adapter, index)
        for item in usage:
            self.usage = self.usage + item
        failures.sort(key=lambda f: f.index)
        return Outcomes(results, failures)

    def _messages(self, context: str) -> list[Message]:
        if self._chat:
            try:
                chat = json.loads(context)
            except ValueError:
                chat = None
            if isinstance(chat, list) and all(
                isinstance(m, dict) and m.get("role") in _ROLES for m in chat
            ):
                return [Message(role=m["role"], content=str(m.get("content", ""))) for m in chat]
        return [Message(role="user", content=context)]

    def _settings(self, gen_kwargs: Mapping[str, Any]) -> RequestSettings:
        kwargs = dict(gen_kwargs)
        until = kwargs.pop("until", None)
        stops = [until] if isinstance(until, str) else [s for s in until or [] if s]
        max_tokens = kwargs.pop("max_gen_toks", None) or self.max_gen_toks
        temperature = kwargs.pop("temperature", None)
        if not kwargs.pop("do_sample", bool(temperature)):
            temperature = 0.0  # greedy, as lm-eval means by do_sample=False
        top_p = kwargs.pop("top_p", None)
        params = GenerationParams(
            temperature=None if temperature is None else float(temperature),
            max_tokens=int(max_tokens),
            top_p=None if top_p is None else float(top_p),
            stop=tuple(stops[:_MAX_API_STOPS]) or None,
        )
        return RequestSettings(params, stops)


def _request(args: Any) -> LmRequest:
    context, gen_kwargs = args[0], args[1] if len(args) > 1 else {}
    return LmRequest(str(context), dict(gen_kwargs or {}))


def _truncate(text: str, stops: Sequence[str]) -> str:
    """Cut at the first stop sequence, as lm-eval does for API models."""
    for stop in stops:
        text = text.split(stop, 1)[0]
    return text


def _as_arg(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def register_lm_eval_model() -> type[ConvsimLM]:
    """Register :class:`ConvsimLM` in lm-eval's model registry as ``convsim``.

    lm-eval's built-in models are added to the registry when ``lm_eval.models`` is first
    imported, so that import comes first. Registering again is a no-op.
    """
    import lm_eval.models  # noqa: F401  # fills the registry with the built-in models
    from lm_eval.api.registry import register_model

    register_model(MODEL_NAME)(ConvsimLM)  # the same class again is accepted
    return ConvsimLM
