"""A tiny random ONNX NLI pair classifier and its tokenizer, written to a folder as a real
model's files are (``model.onnx``, ``tokenizer.json``, ``config.json``): for the NLI tests
and ``tests/bench/bench_nli.py``, without weights or network.

The model: token embeddings averaged over the attention mask, times a matrix, give three
logits. Its output does not depend on padding, so a batch and one pair at a time agree.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import onnx
import tokenizers
from onnx import TensorProto, helper, numpy_helper

WORDS = "the cat sat on a mat dog ran in park it is red blue sky sea not".split()
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
VOCAB = {w: i for i, w in enumerate([*SPECIAL, *WORDS])}
DIM = 4
# the model's logit columns, in a non-default order with mixed case
ID2LABEL = {"0": "Contradiction", "1": "ENTAILMENT", "2": "neutral"}


class TinyModel(NamedTuple):
    """The weights of a tiny classifier, to compute what it must answer."""

    embedding: np.ndarray
    weights: np.ndarray


def graph(model: TinyModel, *, token_types: bool = False) -> onnx.ModelProto:
    """input_ids, attention_mask -> masked mean of embeddings -> MatMul -> logits [B, 3]."""
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "L"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["B", "L"]),
    ]
    if token_types:
        inputs.append(
            helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ["B", "L"])
        )
    nodes = [
        helper.make_node("Gather", ["embedding", "input_ids"], ["vectors"]),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axis2"], ["mask3"]),
        helper.make_node("Mul", ["vectors", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis1"], ["total"], keepdims=0),
        helper.make_node("ReduceSum", ["mask3", "axis1"], ["count"], keepdims=0),
        helper.make_node("Div", ["total", "count"], ["mean"]),
        helper.make_node("MatMul", ["mean", "weights"], ["logits"]),
    ]
    initializers = [
        numpy_helper.from_array(model.embedding, "embedding"),
        numpy_helper.from_array(model.weights, "weights"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_nli",
        inputs,
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", 3])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def tokenizer() -> tokenizers.Tokenizer:
    from tokenizers import models, pre_tokenizers, processors

    tokenizer = tokenizers.Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", VOCAB["[CLS]"]), ("[SEP]", VOCAB["[SEP]"])],
    )
    return tokenizer


def random_model(seed: int) -> TinyModel:
    rng = np.random.default_rng(seed)
    return TinyModel(
        rng.normal(size=(len(VOCAB), DIM)).astype(np.float32),
        rng.normal(scale=3.0, size=(DIM, 3)).astype(np.float32),
    )


def write_model(
    folder: Path,
    model: TinyModel,
    *,
    onnx_name: str = "model.onnx",
    config: Mapping[str, Any] | None = None,
    token_types: bool = False,
    max_length: int | None = None,
) -> Path:
    (folder / onnx_name).parent.mkdir(parents=True, exist_ok=True)
    onnx.save(graph(model, token_types=token_types), str(folder / onnx_name))
    tokenizer().save(str(folder / "tokenizer.json"))
    config = {"id2label": ID2LABEL, "pad_token_id": 0} if config is None else config
    (folder / "config.json").write_text(json.dumps(config))
    if max_length is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": max_length}))
    return folder
