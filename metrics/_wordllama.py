"""WordLlama: static word embeddings whose weights ship inside their PyPI wheel.

Semantic similarity without torch and without a download: the 256-dimensional
``l2_supercat`` weights (16 MB) and their tokenizer are files of the installed
``wordllama`` package. They are read from the package directory directly: WordLlama's
own loader looks for the tokenizer under a folder name its wheel does not use and then
falls back to a model hub, which a scorer must never touch.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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


def _import_inference() -> Any:
    """``wordllama.inference``, imported so that its ``logging.basicConfig()`` at import
    time cannot configure the application's root logger (a library must not)."""
    root = logging.getLogger()
    guard = None
    if not root.handlers:
        guard = logging.NullHandler()
        root.addHandler(guard)  # basicConfig() does nothing where a handler exists
    try:
        from wordllama import inference
    finally:
        if guard is not None:
            root.removeHandler(guard)
    return inference


def wordllama_available() -> bool:
    """Whether the WordLlama package and its shipped weights are installed."""
    root = _package_dir()
    return root is not None and (root / _WEIGHTS).is_file() and (root / _TOKENIZER).is_file()


@LoadedOnce
def _model() -> Any:
    """The model, loaded once per process however many scorers ask for it at once."""
    return _read_model()


def _read_model() -> Any:
    """The model, read from the package's own files (read-only): 31 MB of vectors."""
    root = _package_dir()
    if root is None or not wordllama_available():
        raise RuntimeError("WordLlama's weights are not installed (pip install wordllama)")
    from safetensors import safe_open
    from tokenizers import Tokenizer

    inference = _import_inference()
    tokenizer = Tokenizer.from_file(str(root / _TOKENIZER))
    with safe_open(str(root / _WEIGHTS), framework="np", device="cpu") as weights:
        embedding = weights.get_tensor("embedding.weight")
    return inference.WordLlamaInference(embedding, tokenizer, binary=False)


class WordLlamaEmbedder:
    """Texts as L2-normalised WordLlama vectors (average-pooled token embeddings)."""

    name = "wordllama"

    def embed(self, texts: Sequence[str]) -> Any:
        import numpy as np

        if not any(t.strip() for t in texts):
            return None
        vectors = np.asarray(_model().embed(list(texts)), dtype=np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        blank = np.array([not t.strip() for t in texts])
        vectors = np.where(norms > 0, vectors / np.maximum(norms, 1e-12), 0.0)
        vectors[blank] = 0.0  # an empty text is related to nothing
        return vectors
