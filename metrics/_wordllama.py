"""WordLlama: static word embeddings whose weights ship inside their PyPI wheel.

Semantic similarity without torch and without a download: the 256-dimensional
``l2_supercat`` weights (16 MB) and their tokenizer are files of the installed
``wordllama`` package. They are read from the package directory directly: WordLlama's
own loader looks for the tokenizer under a folder name its wheel does not use and then
falls back to a model hub, which a scorer must never touch.

A text's vector is the mean of its tokens' vectors, computed as WordLlama's own
``embed`` computes it (the same float32 values) but without padding: WordLlama pads
every text of a batch to the longest one, and coherence embeds each response beside the
whole conversation before it (a 3,000-token history beside 63 short answers took 385 MB
in WordLlama, 5 MB here), in as many worker threads as conversations end at once.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from ._once import LoadedOnce

__all__ = ["WordLlamaEmbedder", "wordllama_available"]

_WEIGHTS = "weights/l2_supercat_256.safetensors"
_TOKENIZER = "tokenizers/l2_supercat_tokenizer_config.json"


def _package_dir() -> Path | None:
    """Where the installed package lives, found without importing it."""
    spec = importlib.util.find_spec("wordllama")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def wordllama_available() -> bool:
    """Whether the WordLlama package and its shipped weights are installed."""
    root = _package_dir()
    return root is not None and (root / _WEIGHTS).is_file() and (root / _TOKENIZER).is_file()


class _WordVectors(NamedTuple):
    """WordLlama's model: a vector per token (float16, as shipped) and its tokenizer."""

    table: Any
    tokenizer: Any


@LoadedOnce
def _model() -> _WordVectors:
    """The model, loaded once per process however many scorers ask for it at once."""
    return _read_model()


def _read_model() -> _WordVectors:
    """The model, read from the package's own files (read-only)."""
    root = _package_dir()
    if root is None or not wordllama_available():
        raise RuntimeError("WordLlama's weights are not installed (pip install wordllama)")
    from safetensors import safe_open
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(root / _TOKENIZER))
    tokenizer.no_truncation()  # as WordLlama does: a long text is embedded whole
    with safe_open(str(root / _WEIGHTS), framework="np", device="cpu") as weights:
        table = weights.get_tensor("embedding.weight")
    return _WordVectors(table, tokenizer)


def _pooled(model: _WordVectors, ids: Sequence[int]) -> Any:
    """The mean of the token vectors of ``ids``, in float32, summed in token order (as
    WordLlama's ``embed`` sums them); zeros for no tokens."""
    import numpy as np

    if not ids:
        return np.zeros(model.table.shape[1], dtype=np.float32)
    rows = np.clip(np.asarray(ids, dtype=np.intp), 0, model.table.shape[0] - 1)
    total = np.sum(model.table[rows].astype(np.float32), axis=0, dtype=np.float32)
    return total / np.float32(len(ids))


class WordLlamaEmbedder:
    """Texts as L2-normalised WordLlama vectors (average-pooled token embeddings)."""

    name = "wordllama"

    def embed(self, texts: Sequence[str]) -> Any:
        import numpy as np

        if not any(t.strip() for t in texts):
            return None
        model = _model()
        # unpadded: each text's own tokens (the tokenizer pads nothing unless told to)
        encoded = model.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        vectors = np.stack([_pooled(model, e.ids) for e in encoded])
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        blank = np.array([not t.strip() for t in texts])
        vectors = np.where(norms > 0, vectors / np.maximum(norms, 1e-12), 0.0)
        vectors[blank] = 0.0  # an empty text is related to nothing
        return vectors
