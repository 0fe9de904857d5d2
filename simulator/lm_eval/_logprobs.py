"""Loglikelihoods from a prompt's logprobs: what lm-eval's multiple-choice and
perplexity tasks ask of a model, worked out from one echo call of the whole text."""

from __future__ import annotations

from typing import NamedTuple

from convsim._errors import ConvsimError
from convsim.adapters import PromptLogprobs

__all__ = ["ContinuationScore", "UnscorableRequest", "continuation_logprob", "rolling_logprob"]


class ContinuationScore(NamedTuple):
    """lm-eval's answer to a loglikelihood request."""

    logprob: float
    """The loglikelihood of the continuation given the context."""
    is_greedy: bool
    """Whether each of the continuation's tokens was the model's most likely one."""


class UnscorableRequest(ConvsimError):
    """The server's logprobs cannot give this request's score (e.g. no logprob for the
    first continuation token after an empty context, or no top logprobs)."""


def continuation_logprob(
    scored: PromptLogprobs, context: str, continuation: str
) -> ContinuationScore:
    """The loglikelihood of ``continuation`` after ``context``, from the scored text
    ``context + continuation``, and whether each of its tokens was the greedy choice.

    The server tokenized the whole text, so the continuation is found by offsets: its
    tokens run from the first token starting at or after ``len(context)`` (lm-eval's
    rule). A token that straddles the boundary belongs to the context, unless no token
    starts inside the continuation at all: then that straddling token is the
    continuation's only token, since it alone carries its probability. An empty
    continuation has loglikelihood 0.

    Raises:
        UnscorableRequest: the text has no tokens, or a continuation token has no
            logprob (after an empty context) or no top logprobs to tell whether it
            was greedy.
    """
    if not continuation:
        return ContinuationScore(0.0, True)  # log P(nothing more) = 0
    offsets = scored.text_offset
    if not offsets:
        raise UnscorableRequest("the server returned no tokens for the text")
    first = next((i for i, o in enumerate(offsets) if o >= len(context)), None)
    if first is None:  # the whole continuation lies inside the text's last token
        first = len(offsets) - 1
    total = 0.0
    greedy = True
    for i in range(first, len(offsets)):
        value = scored.token_logprobs[i]
        if value is None:
            raise UnscorableRequest(
                f"the server gave no logprob for the continuation's token {scored.tokens[i]!r}"
                " (it has no context before it): give the request a non-empty context"
            )
        top = scored.top_logprobs[i] if scored.top_logprobs is not None else None
        if not top:
            raise UnscorableRequest(
                f"the server gave no top logprobs for the continuation's token "
                f"{scored.tokens[i]!r}, so whether it was the greedy choice is unknown"
            )
        total += value
        greedy = greedy and value >= max(top.values())
    return ContinuationScore(total, greedy)


def rolling_logprob(scored: PromptLogprobs) -> float:
    """The loglikelihood of a whole scored text: the sum of its tokens' logprobs.

    The first token has no context, so servers give it no logprob and it is left out
    (lm-eval's own models score it after a BOS token; a server that does the same and
    returns its logprob has it counted). The text is scored in one call, so it must fit
    the model's context window; a longer one fails as that request's error.

    Raises:
        UnscorableRequest: a token after the first has no logprob.
    """
    total = 0.0
    for i, value in enumerate(scored.token_logprobs):
        if value is None:
            if i == 0:
                continue
            raise UnscorableRequest(
                f"the server gave no logprob for token {i} ({scored.tokens[i]!r}) of the text"
            )
        total += value
    return total
