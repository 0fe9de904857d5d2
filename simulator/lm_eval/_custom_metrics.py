"""The developer guide's ``CustomMetricsEngine``: its five custom metrics, measured by
convsim's scorers.

``register_custom_metrics`` registers them under the guide's names. Four of those
names are convsim metrics already (technical_accuracy, code_security_score,
financial_reasoning, conversation_flow): runs keep scoring convsim's, which these
methods call; ``domain_expertise_score`` is new to the registry, so runs may name it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ._metrics_engine import MetricsEngine, _value

__all__ = ["CustomMetricsEngine"]


class CustomMetricsEngine(MetricsEngine):
    """The guide's extended metrics engine: domain expertise, technical accuracy, code
    security, financial reasoning and conversation flow, as convsim measures them."""

    def __init__(self, *, allow_code: bool = False) -> None:
        super().__init__(allow_code=allow_code)
        self.register_custom_metrics()

    def register_custom_metrics(self) -> None:
        """The guide's five custom metrics, by the guide's names."""
        self.custom_metrics = {
            "domain_expertise_score": self.calculate_domain_expertise,
            "technical_accuracy": self.calculate_technical_accuracy,
            "code_security_score": self.calculate_code_security,
            "financial_reasoning": self.calculate_financial_reasoning,
            "conversation_flow": self.calculate_conversation_flow,
        }

    def calculate_domain_expertise(
        self, response: str, reference: str | None, domain: str
    ) -> float | None:
        """The guide's domain expertise: convsim's ``domain_expertise`` (the domain's
        terms used in sentences of eight words or more; five earn full marks) times the
        answer's quality (:meth:`assess_response_quality` against the reference), at
        most 1. None where the domain is not one convsim knows."""
        expertise = _value(
            self.score("domain_expertise", response, metadata={"domain": domain}),
            "domain_expertise",
        )
        if expertise is None:
            return None
        quality = self.assess_response_quality(response, reference)
        return expertise if quality is None else min(expertise * quality, 1.0)

    def calculate_technical_accuracy(
        self, response: str, reference: str | None = None, context: Mapping[str, Any] | None = None
    ) -> float | None:
        """convsim's ``technical_accuracy``: per fenced Python block, 0.6 if it compiles
        plus 0.4 x best-practice signals; None without Python blocks. (Whether the code
        is right is :meth:`validate_logic`'s question, with the task's tests.)"""
        return _value(self.score("technical_accuracy", response, reference), "technical_accuracy")

    def calculate_code_security_score(self, code: str, language: str = "python") -> float | None:
        """The guide's name for :meth:`calculate_code_security`."""
        return self.calculate_code_security(code, language)

    def calculate_financial_reasoning(
        self, response: str, context: Mapping[str, Any] | None = None
    ) -> float | None:
        """convsim's ``financial_reasoning``; ``context["domain"]`` == "finance" makes the
        answer count even where it says nothing financial. None where nothing financial
        was said."""
        domain = (context or {}).get("domain")
        metadata = {"domain": domain} if isinstance(domain, str) else {}
        return _value(
            self.score("financial_reasoning", response, metadata=metadata), "financial_reasoning"
        )

    def calculate_conversation_flow(
        self, conversation_turns: Sequence[Mapping[str, Any]]
    ) -> float | None:
        """convsim's ``conversation_flow`` of the guide's turns (``prompt``,
        ``response``): 0.4 x topic consistency + 0.3 x relevance + 0.3 x progression;
        None for fewer than two turns."""
        return _value(self.score("conversation_flow", conversation_turns), "conversation_flow")
