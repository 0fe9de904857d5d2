"""TF-IDF and cosine in numpy score exactly as scikit-learn's did.

convsim's core install leaves scikit-learn out; the TF-IDF weighting and the cosine
similarity it used are numpy code. scikit-learn (a test tool here) is the reference:
the vectors agree to 1e-12, and every similarity and every score, rounded as convsim
rounds them, is the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS as SKLEARN_STOP_WORDS
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.metrics.pairwise import cosine_similarity

import convsim
from convsim.metrics import _coherence, _embedding
from convsim.metrics._embedding import Embedder, TfidfEmbedder, cosine
from convsim.metrics._stop_words import ENGLISH_STOP_WORDS

# words that repeat across texts, stop words among them, and the odd ones TF-IDF must
# tokenise as scikit-learn does: digits, underscores, accents, apostrophes, one letter
WORDS = [
    "refund", "order", "Order", "ORDER", "12345", "a", "I", "the", "and", "not", "is",
    "café", "naïve", "snake_case", "don't", "x", "42", "lamp", "lamp.", "(lamp)", "über",
    "Straße", "日本", "🙂", "", "--", "it's", "again", "again!", "delivery", "damaged",
]  # fmt: skip
TEXT = st.lists(st.sampled_from(WORDS), max_size=25).map(" ".join)
ANY_TEXT = st.one_of(TEXT, st.text(max_size=40))


def _sklearn_tfidf(texts: Sequence[str]) -> Any:
    """What TfidfEmbedder.embed returned when it was scikit-learn's."""
    for stop_words in ("english", None):
        try:
            return TfidfVectorizer(
                stop_words=stop_words, sublinear_tf=True, token_pattern=r"(?u)\b\w+\b"
            ).fit_transform(texts)
        except ValueError:
            continue
    return None


def _sklearn_cosine(
    embedder: Embedder, texts: Sequence[str], pairs: Sequence[tuple[int, int]]
) -> list[float] | None:
    """convsim's cosine as it was with scikit-learn (its TF-IDF for TfidfEmbedder)."""
    if isinstance(embedder, TfidfEmbedder):
        vectors = _sklearn_tfidf(texts)
    else:
        vectors = embedder.embed(texts)
    if vectors is None:
        return None
    matrix = cosine_similarity(vectors)
    return [round(float(max(0.0, min(1.0, matrix[i][j]))), 6) for i, j in pairs]


def _all_pairs(n: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(n) for j in range(n)]


def test_the_stop_words_are_scikit_learns() -> None:
    assert ENGLISH_STOP_WORDS == SKLEARN_STOP_WORDS


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(ANY_TEXT, min_size=1, max_size=8))
def test_tfidf_vectors_are_scikit_learns(texts: list[str]) -> None:
    ours = TfidfEmbedder().embed(texts)
    theirs = _sklearn_tfidf(texts)
    if theirs is None:
        assert ours is None
        return
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs.toarray(), rtol=0, atol=1e-12)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(ANY_TEXT, min_size=1, max_size=8))
def test_tfidf_similarities_are_scikit_learns(texts: list[str]) -> None:
    pairs = _all_pairs(len(texts))
    assert cosine(TfidfEmbedder(), texts, pairs) == _sklearn_cosine(TfidfEmbedder(), texts, pairs)


class _Vectors:
    """An embedder that returns given vectors (WordLlama's are float32)."""

    def __init__(self, vectors: Any) -> None:
        self.vectors = vectors

    def embed(self, texts: Sequence[str]) -> Any:
        return self.vectors


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 8),
    st.integers(1, 16),
    st.sampled_from([np.float32, np.float64]),
    st.integers(0, 2**32 - 1),
)
def test_cosine_of_dense_vectors_is_scikit_learns(
    rows: int, dims: int, dtype: Any, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(rows, dims)).astype(dtype)
    vectors[rng.random(rows) < 0.2] = 0.0  # an empty text embeds as a zero row
    embedder = _Vectors(vectors)
    pairs = _all_pairs(rows)
    texts = [""] * rows
    assert cosine(embedder, texts, pairs) == _sklearn_cosine(embedder, texts, pairs)


def test_a_sparse_matrix_from_ones_own_embedder_is_still_taken() -> None:
    texts = ["the order arrived damaged", "my order arrived broken", "weather today"]
    sparse = _sklearn_tfidf(texts)
    pairs = _all_pairs(3)
    assert cosine(_Vectors(sparse), texts, pairs) == _sklearn_cosine(_Vectors(sparse), texts, pairs)


@pytest.mark.parametrize(
    "vectors",
    [[[1.0, float("nan")]], [[float("inf"), 0.0]], [1.0, 2.0]],
    ids=["nan", "inf", "one-dimensional"],
)
def test_vectors_that_are_not_finite_or_not_a_matrix_are_refused(vectors: Any) -> None:
    with pytest.raises(ValueError, match="2-D array of finite numbers"):
        cosine(_Vectors(vectors), ["a"], [(0, 0)])


def test_texts_without_words_have_no_vectors() -> None:
    assert TfidfEmbedder().embed(["", "🙂", " -- "]) is None
    # stop words only: they are the words
    vectors = TfidfEmbedder().embed(["the and", "the"])
    assert vectors is not None and vectors.shape == (2, 2)


SIMILARITY = ["coherence", "lexical_coherence", "conversation_flow", "semantic_similarity"]


def _scores(pack: str, model_args: dict[str, str]) -> dict[str, Any]:
    results = convsim.run_sync(pack, "scripted", model_args=model_args, metrics=SIMILARITY)
    return {
        r.conversation_id: {k: s.model_dump() for k, s in r.scores.items() if k in SIMILARITY}
        for r in results
    }


@pytest.mark.slow
@pytest.mark.parametrize("model_args", [{}, {"use_references": "false", "memory_turns": "1"}])
@pytest.mark.parametrize(
    "pack", ["customer_support", "multi_session_memory", "coding_help", "single_turn_qa"]
)
def test_every_bundled_pack_scores_as_it_did_with_scikit_learn(
    pack: str, model_args: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ours = _scores(pack, model_args)
    monkeypatch.setattr(_embedding, "cosine", _sklearn_cosine)
    monkeypatch.setattr(_coherence, "cosine", _sklearn_cosine)
    theirs = _scores(pack, model_args)
    assert ours == theirs
    assert all(set(scores) == set(SIMILARITY) for scores in ours.values())
    assert any(s["value"] for scores in ours.values() for s in scores.values())
