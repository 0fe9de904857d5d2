"""Text embeddings and their similarities: what the coherence and retention scorers
compare texts with (WordLlama where installed, TF-IDF otherwise)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["Embedder", "TfidfEmbedder", "cosine", "default_embedder", "NO_WORDS"]


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into vectors whose cosine similarity means relatedness."""

    def embed(self, texts: Sequence[str]) -> Any:
        """An (n, d) array or sparse matrix for ``texts``, fitted on them if it learns."""
        ...


class TfidfEmbedder:
    """TF-IDF fitted on the texts of each call (sublinear tf, English stop words)."""

    def embed(self, texts: Sequence[str]) -> Any:
        from sklearn.feature_extraction.text import TfidfVectorizer

        for stop_words in ("english", None):  # texts of stop words only: keep them all
            try:
                return TfidfVectorizer(
                    stop_words=stop_words, sublinear_tf=True, token_pattern=r"(?u)\b\w+\b"
                ).fit_transform(texts)
            except ValueError:  # no vocabulary
                continue
        return None


NO_WORDS = "no comparable words in the texts"


def cosine(
    embedder: Embedder, texts: Sequence[str], pairs: Sequence[tuple[int, int]]
) -> list[float] | None:
    """Cosine similarity of each (i, j) pair of ``texts``, 0 where one text is empty;
    None when the texts hold nothing to compare (all empty, emoji only)."""
    vectors = embedder.embed(texts)
    if vectors is None:
        return None
    from sklearn.metrics.pairwise import cosine_similarity

    matrix = cosine_similarity(vectors)
    # rounded: float32 vectors make identical texts 0.9999999 rather than 1
    return [round(float(max(0.0, min(1.0, matrix[i][j]))), 6) for i, j in pairs]


def default_embedder() -> Embedder:
    """WordLlama where it is installed (semantic, offline), TF-IDF otherwise."""
    from ._wordllama import WordLlamaEmbedder, wordllama_available

    return WordLlamaEmbedder() if wordllama_available() else TfidfEmbedder()
