"""The NLI pair classifier: loading, batching, label order, one load per process, threads,
offline use and the missing extra, on a tiny random ONNX model built here (no weights, no
network).

The model: token embeddings averaged over the attention mask, times a matrix, give three
logits. Its output does not depend on padding, so a batch and one pair at a time agree,
and a numpy copy of it tells what each pair's probabilities must be.
"""

from __future__ import annotations

import pickle
import socket
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
tokenizers = pytest.importorskip("tokenizers")

from _nli_model import ID2LABEL, WORDS, TinyModel  # noqa: E402
from _nli_model import graph as _graph  # noqa: E402
from _nli_model import random_model as _random_model  # noqa: E402
from _nli_model import tokenizer as _tokenizer  # noqa: E402
from _nli_model import write_model as _write_model  # noqa: E402

from convsim import MissingExtra  # noqa: E402
from convsim.metrics import _nli  # noqa: E402
from convsim.metrics._nli import (  # noqa: E402
    DEFAULT_NLI_MODEL,
    NliScores,
    NliUnavailable,
    PairClassifier,
    load_pair_classifier,
    nli_classifier,
    set_nli_classifier,
)

PAIRS = [
    ("the cat sat on the mat", "a cat sat"),
    ("the dog ran in the park", "it is not a dog"),
    ("the sky is blue", "the sea is red"),
    ("cat", "dog"),
    ("the cat sat on a mat the dog ran in a park it is red", "sky"),
    ("", "the sea"),
]


def _expected(model: TinyModel, premise: str, hypothesis: str) -> NliScores:
    """What the tiny model must answer, computed in numpy, columns read by ID2LABEL."""
    ids = _tokenizer().encode(premise, hypothesis).ids
    logits = model.embedding[ids].mean(axis=0).astype(np.float64) @ model.weights
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    column = {name.lower(): int(i) for i, name in ID2LABEL.items()}
    return NliScores(
        float(probs[column["entailment"]]),
        float(probs[column["neutral"]]),
        float(probs[column["contradiction"]]),
    )


def _close(got: NliScores, want: NliScores) -> bool:
    return bool(np.allclose(got, want, atol=1e-5))


@pytest.fixture
def model() -> TinyModel:
    return _random_model(7)


@pytest.fixture
def folder(tmp_path: Path, model: TinyModel) -> Path:
    return _write_model(tmp_path / "nli", model)


@pytest.fixture(autouse=True)
def _fresh_process_classifier(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts as a new process would: nothing loaded, nothing configured."""
    monkeypatch.delenv("CONVSIM_NLI_MODEL", raising=False)
    _nli._process_classifier.cache_clear()
    yield
    _nli._process_classifier.cache_clear()


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hugging Face cache of this test's own; no socket may connect."""
    from huggingface_hub import constants

    cache = tmp_path / "hf"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a network connection was attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    return cache


def _cache_repo(cache: Path, repo: str, model: TinyModel, onnx_name: str) -> None:
    """``repo`` laid out in ``cache`` as huggingface_hub leaves a download."""
    entry = cache / f"models--{repo.replace('/', '--')}"
    commit = "0" * 40
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text(commit)
    _write_model((entry / "snapshots" / commit), model, onnx_name=onnx_name)


# -- loading and scoring ----------------------------------------------------------------


def test_a_folder_loads_and_scores_with_the_labels_of_its_config(
    folder: Path, model: TinyModel
) -> None:
    classifier = load_pair_classifier(str(folder))
    assert classifier.model_id == str(folder)
    got = classifier.classify(PAIRS)
    assert len(got) == len(PAIRS)
    for pair, scores in zip(PAIRS, got, strict=True):
        assert isinstance(scores, NliScores)
        assert sum(scores) == pytest.approx(1.0)
        assert _close(scores, _expected(model, *pair)), pair
    assert classifier.classify([]) == []


def test_a_batch_scores_as_the_pairs_one_by_one(folder: Path) -> None:
    pairs = [
        (f"{a} {b}", f"{b} {c}") for a in WORDS[:6] for b in WORDS[6:9] for c in "it sky".split()
    ]
    batched = load_pair_classifier(str(folder), batch_size=16).classify(pairs)
    single = load_pair_classifier(str(folder), batch_size=1)
    assert len(pairs) == 36  # three batches of 16, 16 and 4
    for pair, scores in zip(pairs, batched, strict=True):
        assert _close(scores, single.classify([pair])[0]), pair


def test_batches_hold_pairs_of_like_length_and_answers_keep_their_order(folder: Path) -> None:
    classifier = load_pair_classifier(str(folder), batch_size=2)
    widths: list[int] = []
    run = classifier._session.run

    def recording(outputs: Any, feeds: dict[str, Any]) -> Any:
        widths.append(feeds["input_ids"].shape[1])
        return run(outputs, feeds)

    classifier._session = type("Recording", (), {"run": staticmethod(recording)})()
    long, short = " ".join(WORDS * 3), "sky"
    pairs = [(long, long), (short, short), (long, "it"), ("it", short)]
    got = classifier.classify(pairs)
    assert sorted(widths) == [5, 2 * 3 * len(WORDS) + 3]  # the two short pairs together
    one_by_one = load_pair_classifier(str(folder), batch_size=1)
    for pair, scores in zip(pairs, got, strict=True):
        assert _close(scores, one_by_one.classify([pair])[0]), pair


def test_inputs_are_truncated_to_the_models_longest(tmp_path: Path, model: TinyModel) -> None:
    short = load_pair_classifier(str(_write_model(tmp_path / "s", model, max_length=8)))
    whole = load_pair_classifier(str(_write_model(tmp_path / "w", model)))
    one = ("the cat sat on a mat the dog ran in park", "sky")
    two = ("the cat sat on a mat the dog ran in sea", "sky")  # differs past 8 tokens
    assert _close(*short.classify([one, two]))
    assert not _close(*whole.classify([one, two]))
    very_long = (" ".join(WORDS * 100), " ".join(WORDS * 100))
    assert sum(short.classify([very_long])[0]) == pytest.approx(1.0)


def test_token_type_ids_are_fed_when_the_graph_takes_them(tmp_path: Path, model: TinyModel) -> None:
    classifier = load_pair_classifier(str(_write_model(tmp_path / "t", model, token_types=True)))
    assert _close(classifier.classify(PAIRS[:1])[0], _expected(model, *PAIRS[0]))


def test_an_int8_file_under_onnx_is_preferred(tmp_path: Path, model: TinyModel) -> None:
    folder = _write_model(tmp_path / "q", _random_model(99), onnx_name="onnx/model.onnx")
    onnx.save(_graph(model), str(folder / "onnx" / "model_quantized.onnx"))
    got = load_pair_classifier(str(folder)).classify(PAIRS[:2])
    assert all(_close(g, _expected(model, *p)) for g, p in zip(got, PAIRS, strict=False))


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({}, "config.json has no id2label"),
        ({"id2label": {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}}, "not entailment"),
        ({"id2label": {"0": "entailment", "1": "neutral"}}, "not entailment"),
        ({"id2label": {"x": "entailment", "1": "neutral", "2": "contradiction"}}, "index"),
    ],
)
def test_a_config_without_the_three_nli_labels_is_refused(
    tmp_path: Path, model: TinyModel, config: dict[str, Any], says: str
) -> None:
    folder = _write_model(tmp_path / "c", model, config=config)
    with pytest.raises(NliUnavailable, match=says) as caught:
        load_pair_classifier(str(folder))
    assert str(folder) in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("missing", ["model.onnx", "tokenizer.json", "config.json"])
def test_a_folder_missing_a_file_names_it(folder: Path, missing: str) -> None:
    (folder / missing).unlink()
    with pytest.raises(NliUnavailable, match=rf"{folder} has no {missing}") as caught:
        load_pair_classifier(str(folder))
    assert "CONVSIM_NLI_MODEL=/path/to/folder" in str(caught.value)


def test_a_folder_that_is_not_there(tmp_path: Path) -> None:
    with pytest.raises(NliUnavailable, match="is not a folder"):
        load_pair_classifier(str(tmp_path / "nowhere"))


def test_a_corrupt_graph_is_a_clear_error(folder: Path) -> None:
    (folder / "model.onnx").write_bytes(b"not an onnx file")
    with pytest.raises(NliUnavailable, match=r"cannot load .*model\.onnx"):
        load_pair_classifier(str(folder))


# -- one per process, threads ------------------------------------------------------------


def test_the_process_classifier_is_loaded_once_by_threads_asking_together(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnxruntime

    loads: list[str] = []
    real = onnxruntime.InferenceSession

    def counted(path: str, **kwargs: Any) -> Any:
        loads.append(path)
        return real(path, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", counted)
    monkeypatch.setenv("CONVSIM_NLI_MODEL", str(folder))
    start = threading.Barrier(8)

    def ask(_: int) -> PairClassifier | None:
        start.wait(timeout=10)
        return nli_classifier()

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(ask, range(8)))
    assert got[0] is not None and all(c is got[0] for c in got)
    assert nli_classifier() is got[0]
    assert len(loads) == 1


def test_threads_classify_at_once_and_each_gets_its_own_answers(folder: Path) -> None:
    classifier = load_pair_classifier(str(folder), batch_size=4)
    work = [[(f"{a} {b}", f"{b} {a}") for b in WORDS[i : i + 9]] for i, a in enumerate(WORDS[:8])]
    alone = [classifier.classify(pairs) for pairs in work]
    start = threading.Barrier(len(work))

    def run(pairs: list[tuple[str, str]]) -> list[NliScores]:
        start.wait(timeout=10)
        return [s for _ in range(3) for s in classifier.classify(pairs)][: len(pairs)]

    with ThreadPoolExecutor(len(work)) as pool:
        together = list(pool.map(run, work))
    for mine, want in zip(together, alone, strict=True):
        assert all(_close(g, w) for g, w in zip(mine, want, strict=True))


# -- what nli_classifier answers -----------------------------------------------------------


def test_no_setting_and_nothing_cached_is_no_classifier_without_network(hf_cache: Path) -> None:
    assert nli_classifier() is None


def test_no_setting_uses_the_default_model_when_it_is_cached(
    hf_cache: Path, model: TinyModel
) -> None:
    _cache_repo(hf_cache, DEFAULT_NLI_MODEL, model, "onnx/model_quint8_avx2.onnx")
    classifier = nli_classifier()
    assert classifier is not None and classifier.model_id == DEFAULT_NLI_MODEL
    assert _close(classifier.classify(PAIRS[:1])[0], _expected(model, *PAIRS[0]))


def test_a_cached_hub_id_loads_offline(
    hf_cache: Path, model: TinyModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    _cache_repo(hf_cache, "someone/tiny-nli", model, "onnx/model_quantized.onnx")
    monkeypatch.setenv("CONVSIM_NLI_MODEL", "someone/tiny-nli")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    classifier = nli_classifier()
    assert classifier is not None and classifier.model_id == "someone/tiny-nli"


def test_offline_and_not_cached_is_one_line_naming_the_model_and_the_folder_setting(
    hf_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONVSIM_NLI_MODEL", "someone/not-cached-nli")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(NliUnavailable) as caught:
        nli_classifier()
    message = str(caught.value)
    assert "\n" not in message
    assert "someone/not-cached-nli" in message and "HF_HUB_OFFLINE" in message
    assert "CONVSIM_NLI_MODEL=/path/to/folder" in message
    assert str(pickle.loads(pickle.dumps(caught.value))) == message  # crosses processes


def test_none_turns_nli_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVSIM_NLI_MODEL", "none")
    assert nli_classifier() is None


def test_set_nli_classifier_replaces_it_until_the_block_ends(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Fake(PairClassifier):
        def __init__(self) -> None:
            self.model_id = "fake"

        def classify(self, pairs: Any) -> list[NliScores]:
            return [NliScores(0.0, 0.0, 1.0) for _ in pairs]

    monkeypatch.setenv("CONVSIM_NLI_MODEL", str(folder))
    fake = Fake()
    with set_nli_classifier(fake):
        assert nli_classifier() is fake
        with set_nli_classifier(None):
            assert nli_classifier() is None
        assert nli_classifier() is fake
    loaded = nli_classifier()
    assert loaded is not None and loaded.model_id == str(folder)


# -- without the extra ---------------------------------------------------------------------


@pytest.mark.parametrize("blocked", ["onnxruntime", "tokenizers"])
def test_a_configured_model_without_the_extra_names_the_nli_extra(
    folder: Path, monkeypatch: pytest.MonkeyPatch, blocked: str
) -> None:
    monkeypatch.setitem(sys.modules, blocked, None)
    monkeypatch.setenv("CONVSIM_NLI_MODEL", str(folder))
    with pytest.raises(MissingExtra) as caught:
        nli_classifier()
    assert str(caught.value) == "NLI scoring needs the nli extra: pip install 'convsim[nli]'"


def test_a_hub_id_without_huggingface_hub_names_the_nli_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(MissingExtra, match=r"convsim\[nli\]"):
        load_pair_classifier("someone/tiny-nli")


def test_no_setting_without_the_extra_is_no_classifier(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    assert nli_classifier() is None
