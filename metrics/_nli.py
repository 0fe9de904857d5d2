"""NLI: an ONNX sequence-pair classifier (entailment, neutral, contradiction) without torch.

The contextual scorers ask whether one statement contradicts, entails or is unrelated to
another. A cross-encoder answers that far better than word vectors, and its ONNX export
runs on onnxruntime with a ``tokenizers`` tokenizer (the ``nli`` extra).

The model is a folder holding ``model.onnx`` (or ``onnx/model*.onnx``: an int8 file is
preferred), ``tokenizer.json`` and ``config.json`` (its ``id2label`` gives the label
order), or a hub id whose files are downloaded once into the Hugging Face cache.
``CONVSIM_NLI_MODEL`` names it. Without that setting the default model is used only when
it is already cached: nothing is downloaded unless asked for, and a download says so on
one line. Offline (``HF_HUB_OFFLINE=1``) no network call is made.

One classifier per process, loaded once under a lock; ``classify`` is thread-safe
(onnxruntime sessions and ``encode_batch`` are), so callers run it in worker threads.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from typing import Any, NamedTuple, cast

from convsim._errors import ConfigError
from convsim._extras import needs_extra
from convsim._log import get_logger

from ._once import LoadedOnce

__all__ = [
    "DEFAULT_NLI_MODEL",
    "NLI_MODEL_ENV",
    "NliScores",
    "NliUnavailable",
    "PairClassifier",
    "load_pair_classifier",
    "nli_classifier",
    "set_nli_classifier",
]

DEFAULT_NLI_MODEL = "cross-encoder/nli-deberta-v3-xsmall"
"""Apache-2.0; its int8 ONNX export is about 87 MB, with an 8.7 MB tokenizer."""
NLI_MODEL_ENV = "CONVSIM_NLI_MODEL"
_OFF = frozenset({"none", "off", "0", "false"})
_FEATURE = "NLI scoring"
_BATCH = 16
_MAX_LENGTH = 512
_LABELS = ("entailment", "neutral", "contradiction")
_ETAG_TIMEOUT_S = 10.0  # each hub request; huggingface_hub bounds reads the same way
_HOW_TO_PLACE = (
    "place model.onnx, tokenizer.json and config.json in a folder and set "
    f"{NLI_MODEL_ENV}=/path/to/folder"
)

_log = get_logger(__name__)


class NliScores(NamedTuple):
    """The probabilities of the three relations of a (premise, hypothesis) pair; sum 1."""

    entailment: float
    neutral: float
    contradiction: float


class NliUnavailable(ConfigError):
    """The NLI model that was asked for cannot be loaded; the one-line message names it,
    says why and how to place it in a folder."""

    def __init__(self, model: str, why: str) -> None:
        self.model = model
        self.why = why
        super().__init__(f"NLI model {model}: {why}; {_HOW_TO_PLACE}")

    def __reduce__(self) -> tuple[type[NliUnavailable], tuple[str, str]]:
        return type(self), (self.model, self.why)


class _Encoded(NamedTuple):
    """A tokenized batch, as the graph's inputs want it."""

    feeds: dict[str, Any]


class PairClassifier:
    """One loaded ONNX sequence-pair classifier.

    Build one with :func:`load_pair_classifier`; a test double may subclass it and
    override :meth:`classify`.
    """

    model_id: str
    """The hub id or folder path, as given."""

    def __init__(
        self,
        model_id: str,
        session: Any,
        tokenizer: Any,
        label_index: Sequence[int],
        *,
        max_length: int = _MAX_LENGTH,
        pad_id: int = 0,
        batch_size: int = _BATCH,
    ) -> None:
        """``label_index`` holds the logit columns of entailment, neutral, contradiction;
        ``tokenizer`` truncates to ``max_length`` and does not pad (padding is done here,
        with ``pad_id``)."""
        self.model_id = model_id
        self._session = session
        self._tokenizer = tokenizer
        self._label_index = list(label_index)
        self._max_length = max_length
        self._pad_id = pad_id
        self._batch_size = batch_size
        self._inputs = {i.name: i.type for i in session.get_inputs()}
        self._output = session.get_outputs()[0].name

    def classify(self, pairs: Sequence[tuple[str, str]]) -> list[NliScores]:
        """The relation probabilities of each (premise, hypothesis) pair, in order.

        Synchronous and CPU-bound: batched inside, safe to call from several threads.
        """
        # batches of pairs of like length: a batch is padded to its longest pair
        order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
        scores: list[NliScores | None] = [None] * len(pairs)
        for start in range(0, len(order), self._batch_size):
            batch = order[start : start + self._batch_size]
            for i, score in zip(
                batch, self._classify_batch([pairs[i] for i in batch]), strict=True
            ):
                scores[i] = score
        return cast("list[NliScores]", scores)

    def _classify_batch(self, pairs: Sequence[tuple[str, str]]) -> list[NliScores]:
        import numpy as np

        encoded = self._encode(pairs)
        (logits,) = self._session.run([self._output], encoded.feeds)
        logits = np.asarray(logits, dtype=np.float64)[:, list(self._label_index)]
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        return [NliScores(*map(float, row)) for row in probs]

    def _cut(self, texts: list[str]) -> list[str]:
        """Each text cut after its first ``max_length`` tokens.

        The pair truncation of ``tokenizers`` (longest first) takes time that grows
        with the square of the tokens it drops; a side is never longer than this.
        """
        encodings = self._tokenizer.encode_batch(texts, add_special_tokens=False)
        return [
            text[: e.offsets[-1][1]] if len(e.ids) >= self._max_length else text
            for text, e in zip(texts, encodings, strict=True)
        ]

    def _encode(self, pairs: Sequence[tuple[str, str]]) -> _Encoded:
        import numpy as np

        texts = self._cut([text for pair in pairs for text in pair])
        encodings = self._tokenizer.encode_batch(list(zip(texts[::2], texts[1::2], strict=True)))
        width = max(len(e.ids) for e in encodings)
        columns = {
            "input_ids": ([e.ids for e in encodings], self._pad_id),
            "attention_mask": ([e.attention_mask for e in encodings], 0),
            "token_type_ids": ([e.type_ids for e in encodings], 0),
        }
        feeds = {}
        for name, (rows, pad) in columns.items():
            if name in self._inputs:
                dtype = np.int32 if "int32" in self._inputs[name] else np.int64
                feeds[name] = np.array([[*r, *[pad] * (width - len(r))] for r in rows], dtype)
        return _Encoded(feeds)


# -- loading ---------------------------------------------------------------------------


def _is_quantized(name: str) -> bool:
    return "int8" in name or "quant" in name


def _onnx_file(folder: Path) -> Path | None:
    """The folder's ONNX graph: an int8 file for this machine first, then any int8 one,
    then the full-precision one."""
    found = [folder / "model.onnx", *sorted((folder / "onnx").glob("model*.onnx"))]
    found = [f for f in found if f.is_file()]
    arm = platform.machine().lower() in {"arm64", "aarch64"}

    def rank(f: Path) -> int:
        name = f.name.lower()
        if not _is_quantized(name):
            return 3
        if ("arm64" in name) == arm and ("avx2" in name or "arm64" in name):
            return 0
        return 2 if ("arm64" in name) != arm else 1

    return min(found, key=rank, default=None)


def _label_index(model: str, config: Mapping[str, Any]) -> list[int]:
    """The logit columns of entailment, neutral and contradiction, from ``id2label``."""
    raw = config.get("id2label")
    if not isinstance(raw, Mapping):
        raise NliUnavailable(model, "config.json has no id2label")
    try:
        by_name = {str(name).strip().lower(): int(i) for i, name in raw.items()}
    except (TypeError, ValueError):
        raise NliUnavailable(model, f"config.json id2label is not index->name: {raw}") from None
    if set(by_name) != set(_LABELS):
        raise NliUnavailable(
            model,
            f"config.json id2label names {sorted(by_name)}, not entailment, neutral and "
            "contradiction (an NLI model is needed)",
        )
    return [by_name[label] for label in _LABELS]


def _read_json(model: str, path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise NliUnavailable(model, f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise NliUnavailable(model, f"{path} is not a JSON object")
    return data


def _max_length(model: str, folder: Path, config: Mapping[str, Any]) -> int:
    """The longest input the model takes: tokenizer_config's, else config's, at most 512."""
    limits = [_MAX_LENGTH]
    tokenizer_config = folder / "tokenizer_config.json"
    if tokenizer_config.is_file():
        value = _read_json(model, tokenizer_config).get("model_max_length")
        if isinstance(value, int) and value > 0:
            limits.append(value)
    value = config.get("max_position_embeddings")
    if isinstance(value, int) and value > 0:
        limits.append(value)
    return min(limits)


def _load_folder(model: str, folder: Path, batch_size: int) -> PairClassifier:
    with needs_extra("nli", _FEATURE):
        import onnxruntime
        from tokenizers import Tokenizer

    if not folder.is_dir():
        raise NliUnavailable(model, f"{folder} is not a folder")
    graph = _onnx_file(folder)
    missing = [n for n in ("tokenizer.json", "config.json") if not (folder / n).is_file()]
    if graph is None:
        missing.insert(0, "model.onnx (or onnx/model*.onnx)")
    if missing:
        raise NliUnavailable(model, f"{folder} has no {', '.join(missing)}")
    config = _read_json(model, folder / "config.json")
    labels = _label_index(model, config)
    try:
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as exc:  # the Rust library raises a bare Exception
        raise NliUnavailable(model, f"cannot read {folder / 'tokenizer.json'}: {exc}") from exc
    max_length = _max_length(model, folder, config)
    tokenizer.enable_truncation(max_length)
    tokenizer.no_padding()  # padded per batch in PairClassifier._encode
    pad_id = config.get("pad_token_id")
    try:
        session = onnxruntime.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's errors share no public base class
        raise NliUnavailable(model, f"cannot load {graph}: {exc}") from exc
    names = {i.name for i in session.get_inputs()}
    if not {"input_ids", "attention_mask"} <= names:
        raise NliUnavailable(
            model, f"{graph} takes {sorted(names)}, not input_ids and attention_mask"
        )
    if names - {"input_ids", "attention_mask", "token_type_ids"}:
        raise NliUnavailable(model, f"{graph} needs inputs {sorted(names)}")
    return PairClassifier(
        model,
        session,
        tokenizer,
        labels,
        max_length=max_length,
        pad_id=pad_id if isinstance(pad_id, int) else 0,
        batch_size=batch_size,
    )


def _onnx_candidates() -> list[str]:
    """The hub files to try for the graph, best for this machine first."""
    arm = platform.machine().lower() in {"arm64", "aarch64"}
    native = "onnx/model_qint8_arm64.onnx" if arm else "onnx/model_quint8_avx2.onnx"
    return [native, "onnx/model_quantized.onnx", "onnx/model_int8.onnx", "onnx/model.onnx",
            "model.onnx"]  # fmt: skip


def _offline(env: Mapping[str, str]) -> bool:
    value = env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().lower() in {"1", "on", "yes", "true"}


def _hub_files(model: str, *, local_only: bool) -> Path:
    """The snapshot folder of hub id ``model`` in the Hugging Face cache, with its config,
    tokenizer and one ONNX graph; ``local_only`` makes no network call.

    Raises:
        NliUnavailable: a file is missing from the cache (``local_only``) or the hub.
    """
    with needs_extra("nli", _FEATURE):
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    absent = (EntryNotFoundError, LocalEntryNotFoundError)

    def get(name: str) -> Path:
        path = hf_hub_download(
            model, name, local_files_only=local_only, etag_timeout=_ETAG_TIMEOUT_S
        )
        return Path(path)

    config = get("config.json")
    get("tokenizer.json")
    with suppress(*absent):  # optional: it only tells the longest input
        get("tokenizer_config.json")
    for name in _onnx_candidates():
        try:
            get(name)
            return config.parent
        except absent:
            continue
    raise NliUnavailable(model, f"the hub repository has none of {', '.join(_onnx_candidates())}")


def _hub_folder(model: str, env: Mapping[str, str], *, download: bool) -> Path | None:
    """The cached folder of hub id ``model``: from the cache when it is there; else
    downloaded (saying so on one line) when ``download`` and not offline, else None."""
    with needs_extra("nli", _FEATURE):
        from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return _hub_files(model, local_only=True)
    except HFValidationError as exc:
        raise NliUnavailable(model, "neither a folder nor a hub id (owner/name)") from exc
    except (LocalEntryNotFoundError, NliUnavailable):
        if not download:
            return None
    if _offline(env):
        raise NliUnavailable(model, "not in the Hugging Face cache and HF_HUB_OFFLINE is set")
    print(
        f"convsim: downloading the NLI model {model} into the Hugging Face cache "
        "(once; about 100 MB)",
        file=sys.stderr,
    )
    _log.info("nli_model_download", model=model)
    try:
        return _hub_files(model, local_only=False)
    except NliUnavailable:
        raise
    except Exception as exc:  # network, HTTP and hub errors alike
        raise NliUnavailable(
            model, f"could not be downloaded ({type(exc).__name__}: {exc})".splitlines()[0]
        ) from exc


def _looks_like_path(model: str) -> bool:
    return model.startswith(("/", ".", "~", "\\")) or model.count("/") > 1 or "\\" in model


def load_pair_classifier(
    model: str, *, env: Mapping[str, str] | None = None, batch_size: int = _BATCH
) -> PairClassifier:
    """The classifier in folder ``model``, or of hub id ``model`` (downloaded into the
    Hugging Face cache if it is not there yet and ``HF_HUB_OFFLINE`` is not set).

    Raises:
        MissingExtra: the ``nli`` extra is not installed.
        NliUnavailable: the model cannot be found, fetched or read.
    """
    env = os.environ if env is None else env
    folder = Path(model).expanduser()
    if folder.exists() or _looks_like_path(model):
        return _load_folder(model, folder, batch_size)
    hub = _hub_folder(model, env, download=True)
    assert hub is not None  # download=True returns a folder or raises
    return _load_folder(model, hub, batch_size)


def _extra_installed() -> bool:
    """Whether the ``nli`` extra's modules can be imported (found, not imported)."""
    import importlib.util

    try:
        return all(
            importlib.util.find_spec(name) is not None
            for name in ("onnxruntime", "tokenizers", "huggingface_hub")
        )
    except (ImportError, ValueError):  # ValueError: a module blocked in sys.modules
        return False


@LoadedOnce
def _process_classifier(setting: str) -> PairClassifier | None:
    """The classifier of a ``CONVSIM_NLI_MODEL`` value ('' when unset), once per process."""
    env = os.environ
    if setting.lower() in _OFF:
        return None
    if setting:
        return load_pair_classifier(setting, env=env)
    if not _extra_installed():
        return None
    folder = _hub_folder(DEFAULT_NLI_MODEL, env, download=False)
    return None if folder is None else _load_folder(DEFAULT_NLI_MODEL, folder, _BATCH)


class _Override(NamedTuple):
    """A classifier put in place by :func:`set_nli_classifier`."""

    classifier: PairClassifier | None


class _Overrides:
    """The stack of classifiers tests put in place; the top one wins."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stack: list[_Override] = []

    def top(self) -> _Override | None:
        with self._lock:
            return self._stack[-1] if self._stack else None

    def push(self, override: _Override) -> None:
        with self._lock:
            self._stack.append(override)

    def remove(self, override: _Override) -> None:
        with self._lock:
            for i in range(len(self._stack) - 1, -1, -1):
                if self._stack[i] is override:
                    del self._stack[i]
                    return


_OVERRIDES = _Overrides()  # set by tests (set_nli_classifier), read by nli_classifier


def nli_classifier() -> PairClassifier | None:
    """The process's classifier, loaded once (under a lock) on first use.

    ``CONVSIM_NLI_MODEL`` names a folder or hub id (``none`` turns NLI off); unset, the
    default model is used only if it is already in the Hugging Face cache.

    Returns:
        The classifier, or None when the ``nli`` extra is not installed or no model is
        configured or cached.

    Raises:
        MissingExtra: a model is configured but the ``nli`` extra is not installed.
        NliUnavailable: a model is configured but cannot be loaded.
    """
    override = _OVERRIDES.top()
    if override is not None:
        return override.classifier
    return _process_classifier(os.environ.get(NLI_MODEL_ENV, "").strip())


@contextmanager
def _in_place(override: _Override) -> Iterator[None]:
    try:
        yield
    finally:
        _OVERRIDES.remove(override)


def set_nli_classifier(classifier: PairClassifier | None) -> AbstractContextManager[None]:
    """Make :func:`nli_classifier` return ``classifier`` (None: no NLI) from now on.

    Returns a context manager that puts the previous one back on exit::

        with set_nli_classifier(FakeClassifier()):
            ...
    """
    override = _Override(classifier)
    _OVERRIDES.push(override)
    return _in_place(override)
