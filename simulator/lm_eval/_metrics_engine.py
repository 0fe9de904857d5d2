"""The developer guide's metrics engine, backed by convsim's registered metrics.

``MetricsEngine`` gives the guide's names real behaviour: ``calculate_metric(name, ...)``
dispatches as the guide's engine does (a ``calculate_<name>`` method, then the engine's
``custom_metrics``, then convsim's metric registry; an unknown name raises
:class:`~convsim.RegistryError`, a ValueError as the guide's engine raises),
``validate_logic`` runs a task's test cases against an answer's code,
``assess_response_quality`` measures structure, relevance and completeness, and the
helpers the guide's ``CustomMetricsEngine`` calls (code security, financial signals,
conversation flow parts) are convsim's scorers. Custom metrics set with
``self.custom_metrics = {...}`` (the guide's ``register_custom_metrics``) become metrics
of convsim's registry (:mod:`._engine_metrics`), so runs can name them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from convsim._errors import RegistryError
from convsim._records import Score
from convsim._registry import Registry
from convsim.metrics import (
    METRICS,
    LogicCheck,
    Metric,
    ResponseQuality,
    check_logic,
    financial_signals,
    response_quality,
    score_transcript,
)
from convsim.scenarios import CodeTests, code_tests

from ._engine_metrics import EngineRegistration, register_engine_metrics

__all__ = ["MetricsEngine", "QualityScore"]


class QualityScore(float):
    """The guide's quality multiplier: a float, the mean of the parts of the answer's
    quality that were measured, which also carries those parts (``quality``)."""

    quality: ResponseQuality

    def __new__(cls, quality: ResponseQuality) -> QualityScore:
        value = quality.value
        if value is None:
            raise ValueError("no part of the answer's quality was measured")
        score = super().__new__(cls, value)
        score.quality = quality
        return score

    def __reduce__(self) -> tuple[type[QualityScore], tuple[ResponseQuality]]:
        return (QualityScore, (self.quality,))

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}={p.value!r}" for n, p in self.quality.parts.items())
        return f"QualityScore({float(self)!r}, {parts})"

    @property
    def structure(self) -> float | None:
        return self.quality.structure.value

    @property
    def relevance(self) -> float | None:
        return self.quality.relevance.value

    @property
    def completeness(self) -> float | None:
        return self.quality.completeness.value

    @property
    def details(self) -> dict[str, Any]:
        """Each part's value, what it rests on, and why a part was not measured."""
        return self.quality.details


def _messages(
    response: str | Sequence[Mapping[str, Any]], prompt: str | None
) -> list[dict[str, Any]]:
    """A transcript of one answer (to ``prompt``), or of the guide's turn dicts
    (``prompt`` and ``response``) or chat messages (``role`` and ``content``)."""
    if isinstance(response, str):
        return [
            {"role": "user", "content": prompt or ""},
            {"role": "assistant", "content": response},
        ]
    turns: list[Mapping[str, Any]] = (
        [t for t in response if isinstance(t, Mapping)] if isinstance(response, Sequence) else []
    )
    if not turns or len(turns) != len(response):
        raise TypeError(
            "expected an answer (str) or the conversation's turns (dicts with 'prompt' and "
            f"'response', or chat messages), not {type(response).__name__}"
        )
    if all("role" in t for t in turns):
        return [dict(t) for t in turns]
    messages: list[dict[str, Any]] = []
    for turn in turns:
        messages.append({"role": "user", "content": str(turn.get("prompt") or "")})
        messages.append({"role": "assistant", "content": str(turn.get("response") or "")})
    return messages


def _value(score: Score, metric: str) -> float | None:
    if score.status == "failed":
        raise RuntimeError(f"convsim metric {metric} failed: {score.reason}")
    return float(score.value) if score.value is not None else None


def _tests(tests: Any) -> CodeTests | None:
    if tests is None or isinstance(tests, CodeTests):
        return tests
    return code_tests({"tests": tests})


class MetricsEngine:
    """The guide's metrics engine, backed by convsim's registered metrics.

    Each ``calculate_*`` method scores one answer (or the guide's list of turns) with the
    named convsim metric through :func:`convsim.metrics.score_transcript`, on the
    calling thread (no event loop is needed). Where the metric does not apply (an empty
    answer has no words to compare) the value is None, never a made-up 0.0: a
    ``process_results`` that returns it leaves that metric out for the document. A
    failing metric raises.

    Args:
        allow_code: let ``validate_logic`` (and the ``validate_logic`` metric through
            :meth:`calculate_metric`) run answers' code and tests' code; allow it only for
            tasks and models you trust. Also an attribute, for subclasses whose
            ``__init__`` takes no arguments (the guide's).
    """

    metric_registry: ClassVar[Registry[Metric]] = METRICS
    """The registry custom metrics are registered in (a test may give its copy)."""

    def __init__(self, *, allow_code: bool = False) -> None:
        self.allow_code = allow_code
        self._custom_metrics: dict[str, Callable[..., Any]] = {}
        self.registration = EngineRegistration((), ())
        """What registering the custom metrics in convsim's registry did."""

    # -- the guide's custom metrics ---------------------------------------------------

    @property
    def custom_metrics(self) -> dict[str, Callable[..., Any]]:
        """Custom metrics by name (the guide's ``register_custom_metrics`` sets them)."""
        return self.__dict__.setdefault("_custom_metrics", {})

    @custom_metrics.setter
    def custom_metrics(self, metrics: Mapping[str, Callable[..., Any]]) -> None:
        wrong = [
            name for name, f in metrics.items() if not isinstance(name, str) or not callable(f)
        ]
        if wrong:
            raise TypeError(f"custom metrics map names to functions; not so for {wrong!r}")
        self._custom_metrics = dict(metrics)
        self.registration = register_engine_metrics(self, self.metric_registry)

    def register_custom_metrics(self) -> None:
        """Set ``self.custom_metrics`` (a subclass's names and functions; none here).
        Each name not held by another metric becomes usable in runs (``--metrics NAME``,
        ``Simulator(metrics=[NAME])``); ``registration`` says which."""
        self.custom_metrics = {}

    def calculate_metric(self, metric_name: str, *args: Any, **kwargs: Any) -> Any:
        """The metric called ``metric_name`` on ``args``: the engine's
        ``calculate_<metric_name>`` method, else its custom metric of that name, else
        convsim's registered metric (``(response, reference=None, **scenario)``, as
        :meth:`score`; the value, None where it does not apply).

        Raises:
            RegistryError: no method, custom metric or registered metric has that name
                (also a ValueError, as the guide's engine raises); it lists the known.
        """
        if isinstance(metric_name, str) and metric_name.isidentifier() and metric_name != "metric":
            method = getattr(self, f"calculate_{metric_name}", None)
            if callable(method):
                return method(*args, **kwargs)
        if metric_name in self.custom_metrics:
            return self.custom_metrics[metric_name](*args, **kwargs)
        if isinstance(metric_name, str) and metric_name in self.metric_registry:
            return _value(self.score(metric_name, *args, **kwargs), metric_name)
        raise RegistryError("metric", str(metric_name), self._known())

    def _known(self) -> list[str]:
        methods = [
            name.removeprefix("calculate_")
            for name in dir(self)
            if name.startswith("calculate_") and name != "calculate_metric"
        ]
        return sorted({*methods, *self.custom_metrics, *self.metric_registry.names()})

    # -- convsim's metrics --------------------------------------------------------------

    def score(
        self,
        metric: str,
        response: str | Sequence[Mapping[str, Any]],
        reference: str | None = None,
        *,
        prompt: str | None = None,
        **scenario: Any,
    ) -> Score:
        """convsim's ``metric`` on ``response`` (an answer to ``prompt``, or the guide's
        list of turns); ``reference``: the (last) turn's reference; ``scenario``: other
        scenario fields (required_keywords, metadata, facts, goal, ...)."""
        messages = _messages(response, prompt)
        if reference is not None:
            turns = sum(1 for m in messages if m.get("role") == "assistant")
            scenario["reference_responses"] = {turns: reference}
        scores = score_transcript(messages, [metric], allow_code=self.allow_code, **scenario)
        return scores[metric]

    def calculate_semantic_similarity(self, text_a: str, text_b: str) -> float | None:
        """convsim's ``semantic_similarity`` of ``text_a`` to ``text_b``."""
        return _value(self.score("semantic_similarity", text_a, text_b), "semantic_similarity")

    def calculate_exact_match(self, prediction: str, reference: str) -> float | None:
        """convsim's ``exact_match`` (normalized answers)."""
        return _value(self.score("exact_match", prediction, reference), "exact_match")

    def calculate_custom_score(
        self, response: str, reference: str | None = None, required_keywords: Sequence[str] = ()
    ) -> float | None:
        """convsim's ``custom_score`` (the guide's keyword and length score)."""
        score = self.score(
            "custom_score", response, reference, required_keywords=list(required_keywords)
        )
        return _value(score, "custom_score")

    # -- logic and quality ------------------------------------------------------------

    def validate_logic(
        self,
        response: str,
        reference: Any = None,
        *,
        tests: Any = None,
        allow_code: bool | None = None,
    ) -> LogicCheck:
        """Run the task's test cases against the Python of ``response`` in a sandboxed
        subprocess (convsim's ``validate_logic``); true when every case passed.

        ``tests``: a list of cases, a mapping of :class:`~convsim.scenarios.CodeTests`
        fields, or a CodeTests; given as ``reference`` (the guide's second argument)
        when that is a list or a mapping. A reference answer in text cannot be run: the
        check is then not applicable, as it is without code or without
        ``allow_code`` (the engine's, unless given here). Blocks the calling thread
        while the code runs (at most the tests' time limits).

        Raises:
            ValueError: the test cases are malformed.
        """
        if tests is None and isinstance(reference, (list, tuple, Mapping, CodeTests)):
            tests = reference
        allowed = self.allow_code if allow_code is None else allow_code
        return check_logic([response], _tests(tests), allow_code=allowed)

    def assess_response_quality(
        self,
        response: str,
        reference: str | None = None,
        *,
        prompt: str | None = None,
        required_keywords: Sequence[str] = (),
    ) -> QualityScore | None:
        """The answer's quality: the mean of its structure, its relevance to ``prompt``
        (else to ``reference``) and its completeness against ``required_keywords``, each
        where it applies (convsim's ``response_quality``); None when none applies (a
        short answer with nothing to compare it to and no keywords)."""
        quality = response_quality(
            response, prompt=prompt, reference=reference, required_keywords=required_keywords
        )
        return None if quality.value is None else QualityScore(quality)

    # -- the helpers the guide's CustomMetricsEngine calls --------------------------------

    def calculate_code_security(self, code: str, language: str = "python") -> float | None:
        """convsim's ``code_security_score`` (bandit) of ``code`` (fenced or bare
        Python); None for another language, or code that does not parse."""
        if language.lower() not in ("python", "py", "python3"):
            return None
        text = code if "```" in code else f"```python\n{code}\n```"
        return _value(self.score("code_security_score", text), "code_security_score")

    def contains_quantitative_analysis(self, response: str) -> bool:
        """An amount or a percentage beside a computation or comparison."""
        return financial_signals(response)["quantitative"] == 1.0

    def mentions_risk_factors(self, response: str) -> bool:
        """Risk, downside, drawdown, volatility, losses, uncertainty, exposure, ..."""
        return financial_signals(response)["risk"] == 1.0

    def includes_implementation_details(self, response: str) -> bool:
        """Steps to take: a numbered or bulleted list, or verbs such as allocate,
        rebalance, hedge with, set a stop-loss."""
        return financial_signals(response)["implementation"] == 1.0

    def _flow_part(
        self, conversation_turns: Sequence[Mapping[str, Any]], part: str
    ) -> float | None:
        score = self.score("conversation_flow", conversation_turns)
        if score.status == "failed":
            raise RuntimeError(f"convsim metric conversation_flow failed: {score.reason}")
        return None if score.value is None else float(score.details[part])

    def calculate_topic_consistency(
        self, conversation_turns: Sequence[Mapping[str, Any]]
    ) -> float | None:
        """Mean similarity of each answer to the one before (``conversation_flow``'s
        part); None for fewer than two turns."""
        return self._flow_part(conversation_turns, "topic_consistency")

    def calculate_response_relevance(
        self, conversation_turns: Sequence[Mapping[str, Any]]
    ) -> float | None:
        """Mean similarity of each answer to the prompt it answers."""
        return self._flow_part(conversation_turns, "relevance")

    def calculate_progression_quality(
        self, conversation_turns: Sequence[Mapping[str, Any]]
    ) -> float | None:
        """Mean of 1 - each answer's highest similarity to an earlier one."""
        return self._flow_part(conversation_turns, "progression")
