"""Text embeddings and their similarities: what the coherence and retention scorers
compare texts with (WordLlama where installed, TF-IDF otherwise)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from ._stop_words import ENGLISH_STOP_WORDS

__all__ = ["Embedder", "TfidfEmbedder", "cosine", "default_embedder", "NO_WORDS"]

_TOKEN = re.compile(r"(?u)\b\w+\b")


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into vectors whose cosine similarity means relatedness."""

    def embed(self, texts: Sequence[str]) -> Any:
        """An (n, d) array or sparse matrix for ``texts``, fitted on them if it learns."""
        ...


class TfidfEmbedder:
    """TF-IDF fitted on the texts of each call (sublinear tf, English stop words).

    scikit-learn's ``TfidfVectorizer(stop_words="english", sublinear_tf=True)`` with
    words of one character kept: lower-cased words (runs of ``\\w``), tf ``1 +
    ln(count)``, smoothed idf ``ln((1 + n) / (1 + df)) + 1``, rows of unit length; where
    the texts hold stop words only, the stop words count. Dense rows: one float per
    distinct word of the call's texts.
    """

    name = "tfidf"

    def embed(self, texts: Sequence[str]) -> Any:
        import numpy as np

        for stop_words in (ENGLISH_STOP_WORDS, frozenset[str]()):
            docs = [[w for w in _TOKEN.findall(t.lower()) if w not in stop_words] for t in texts]
            vocabulary = sorted({w for doc in docs for w in doc})
            if vocabulary:
                break
        else:
            return None  # no word at all
        width = len(vocabulary)
        column = {word: i for i, word in enumerate(vocabulary)}
        cells = np.fromiter(
            (row * width + column[w] for row, doc in enumerate(docs) for w in doc), np.int64
        )
        shape = (len(docs), width)
        weights = np.bincount(cells, minlength=shape[0] * width).reshape(shape).astype(float)
        present = weights > 0
        np.log(weights, out=weights, where=present)  # tf: 1 + ln(count), 0 stays 0
        np.add(weights, 1.0, out=weights, where=present)
        weights *= np.log((len(docs) + 1) / (present.sum(axis=0) + 1.0)) + 1.0  # idf
        return _unit_rows(weights)


def _unit_rows(matrix: Any) -> Any:
    """``matrix`` (a float array, changed in place) with each row scaled to length 1;
    rows of (nearly) zero length stay as they are."""
    import numpy as np

    norms = np.sqrt(np.einsum("ij,ij->i", matrix, matrix))
    norms[norms < 10 * np.finfo(norms.dtype).eps] = 1.0
    matrix /= norms[:, None]
    return matrix


NO_WORDS = "no comparable words in the texts"


def cosine(
    embedder: Embedder, texts: Sequence[str], pairs: Sequence[tuple[int, int]]
) -> list[float] | None:
    """Cosine similarity of each (i, j) pair of ``texts``, 0 where one text is empty;
    None when the texts hold nothing to compare (all empty, emoji only).

    Raises:
        ValueError: the embedder's vectors are not a 2-D array of finite numbers.
    """
    vectors = embedder.embed(texts)
    if vectors is None:
        return None
    import numpy as np

    if hasattr(vectors, "toarray"):  # a sparse matrix from an embedder of one's own
        vectors = vectors.toarray()
    given = np.asarray(vectors)
    # float32 vectors are compared in float32, as they were with scikit-learn
    matrix = given.astype(np.float32 if given.dtype == np.float32 else np.float64)
    if matrix.ndim != 2 or not np.isfinite(matrix).all():
        raise ValueError("the embedder's vectors are not a 2-D array of finite numbers")
    unit = _unit_rows(matrix)
    similarity = unit @ unit.T
    # rounded: float32 vectors make identical texts 0.9999999 rather than 1
    return [round(float(max(0.0, min(1.0, similarity[i][j]))), 6) for i, j in pairs]


def default_embedder() -> Embedder:
    """WordLlama where it is installed (semantic, offline), TF-IDF otherwise."""
    from ._wordllama import WordLlamaEmbedder, wordllama_available

    return WordLlamaEmbedder() if wordllama_available() else TfidfEmbedder()
