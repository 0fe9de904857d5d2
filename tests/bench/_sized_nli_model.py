"""A random NLI cross-encoder of DeBERTa-v3-xsmall's shape, written as a real model's
folder is, to time the NLI backend where no real model's weights can be installed.

Its weights are random, so its answers mean nothing; what it keeps of the real model is
the work per pair: 12 layers of hidden size 384, 6 heads, feed-forward 1,536, a 128,100
word vocabulary, and DeBERTa's disentangled attention (content-to-position and
position-to-content scores against 512 relative position embeddings, in every layer:
for short inputs that is most of the attention's cost), with the int8 dynamic
quantisation the hub's ONNX exports use (``onnx/model_quint8_avx2.onnx``). What it
leaves out: the log-bucketing of relative positions (an index computation) and the
tokenizer's vocabulary (a Unigram model trained here on the bench's own text, which cuts
common English words as the real SentencePiece model does: one piece a word). Times with
it are an estimate of the real model's, and are reported as such.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx
import tokenizers
from onnx import TensorProto, helper, numpy_helper

LAYERS = 12
HIDDEN = 384
HEADS = 6
FEED_FORWARD = 1536
VOCAB = 128_100
POSITION_BUCKETS = 256
ID2LABEL = {"0": "contradiction", "1": "entailment", "2": "neutral"}


class _Graph:
    """Nodes and initializers being gathered, with fresh names."""

    def __init__(self, seed: int) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.weights: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(seed)
        self.count = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def const(self, stem: str, value: np.ndarray) -> str:
        name = self.name(stem)
        self.weights.append(numpy_helper.from_array(value, name))
        return name

    def random(self, stem: str, *shape: int) -> str:
        return self.const(stem, self.rng.normal(0.0, 0.02, size=shape).astype(np.float32))

    def op(self, op_type: str, inputs: list[str], **attrs: object) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def ints(self, *values: int) -> str:
        return self.const("shape", np.array(values, dtype=np.int64))

    def dense(self, x: str, n_in: int, n_out: int) -> str:
        return self.op(
            "Add", [self.op("MatMul", [x, self.random("w", n_in, n_out)]), self.random("b", n_out)]
        )

    def layer_norm(self, x: str) -> str:
        gamma = self.const("gamma", np.ones(HIDDEN, dtype=np.float32))
        beta = self.const("beta", np.zeros(HIDDEN, dtype=np.float32))
        return self.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-7)

    def gelu(self, x: str) -> str:
        scaled = self.op("Div", [x, self.const("sqrt2", np.array(math.sqrt(2), np.float32))])
        one = self.const("one", np.array(1.0, np.float32))
        half = self.const("half", np.array(0.5, np.float32))
        return self.op(
            "Mul", [self.op("Mul", [x, half]), self.op("Add", [one, self.op("Erf", [scaled])])]
        )


def build(seed: int = 0) -> onnx.ModelProto:
    """The fp32 graph: input_ids, attention_mask -> logits [B, 3]."""
    g = _Graph(seed)
    head = HIDDEN // HEADS
    span = 2 * POSITION_BUCKETS
    x = g.layer_norm(g.op("Gather", [g.random("words", VOCAB, HIDDEN), "input_ids"]))
    mask = g.op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    one = g.const("one", np.array(1.0, np.float32))
    bias = g.op("Mul", [g.op("Sub", [one, mask]), g.const("neg", np.array(-1e4, np.float32))])
    bias = g.op("Reshape", [bias, g.ints(0, 1, 1, -1)])
    # relative positions i - j, shifted into the table of 2 * buckets embeddings
    length = g.op("Gather", [g.op("Shape", ["input_ids"]), g.ints(1)])
    length = g.op("Squeeze", [length])
    zero, step = g.const("zero", np.array(0, np.int64)), g.const("step", np.array(1, np.int64))
    positions = g.op("Range", [zero, length, step])
    relative = g.op(
        "Sub",
        [g.op("Unsqueeze", [positions, g.ints(1)]), g.op("Unsqueeze", [positions, g.ints(0)])],
    )
    low, high = g.const("low", np.array(0, np.int64)), g.const("high", np.array(span - 1, np.int64))
    shift = g.const("buckets", np.array(POSITION_BUCKETS, np.int64))
    c2p_index = g.op("Clip", [g.op("Add", [relative, shift]), low, high])
    p2c_index = g.op("Clip", [g.op("Sub", [shift, relative]), low, high])
    relative_embeddings = g.layer_norm(g.random("relative", span, HIDDEN))
    scale = g.const("scale", np.array(1.0 / math.sqrt(head * 3), np.float32))
    for _ in range(LAYERS):
        wq, bq = g.random("wq", HIDDEN, HIDDEN), g.random("bq", HIDDEN)
        wk, bk = g.random("wk", HIDDEN, HIDDEN), g.random("bk", HIDDEN)

        def project(source: str, w: str, b: str) -> str:
            return g.op("Add", [g.op("MatMul", [source, w]), b])

        def heads(t: str, perm: Iterable[int]) -> str:
            split = g.op("Reshape", [t, g.ints(0, 0, HEADS, head)])
            return g.op("Transpose", [split], perm=list(perm))

        q = heads(project(x, wq, bq), (0, 2, 1, 3))  # [B, h, L, d]
        k = heads(project(x, wk, bk), (0, 2, 1, 3))
        v = heads(g.dense(x, HIDDEN, HIDDEN), (0, 2, 1, 3))
        # the position projections share the content ones (share_att_key)
        pos_key = g.op(
            "Transpose",
            [g.op("Reshape", [project(relative_embeddings, wk, bk), g.ints(span, HEADS, head)])],
            perm=[1, 2, 0],
        )  # [h, d, 2k]
        pos_query = g.op(
            "Transpose",
            [g.op("Reshape", [project(relative_embeddings, wq, bq), g.ints(span, HEADS, head)])],
            perm=[1, 2, 0],
        )
        c2c = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])])
        shape = g.op("Shape", [c2c])
        c2p = g.op(
            "GatherElements",
            [g.op("MatMul", [q, pos_key]), g.op("Expand", [c2p_index, shape])],
            axis=3,
        )
        p2c = g.op(
            "GatherElements",
            [g.op("MatMul", [k, pos_query]), g.op("Expand", [p2c_index, shape])],
            axis=3,
        )
        p2c = g.op("Transpose", [p2c], perm=[0, 1, 3, 2])
        scores = g.op("Mul", [g.op("Add", [g.op("Add", [c2c, c2p]), p2c]), scale])
        probs = g.op("Softmax", [g.op("Add", [scores, bias])], axis=-1)
        context = g.op("Transpose", [g.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        context = g.op("Reshape", [context, g.ints(0, 0, HIDDEN)])
        x = g.layer_norm(g.op("Add", [g.dense(context, HIDDEN, HIDDEN), x]))
        ff = g.dense(g.gelu(g.dense(x, HIDDEN, FEED_FORWARD)), FEED_FORWARD, HIDDEN)
        x = g.layer_norm(g.op("Add", [ff, x]))
    first = g.op("Gather", [x, g.const("cls", np.array(0, np.int64))], axis=1)
    pooled = g.gelu(g.dense(first, HIDDEN, HIDDEN))
    logits = g.dense(pooled, HIDDEN, 3)
    g.nodes.append(helper.make_node("Identity", [logits], ["logits"]))
    graph = helper.make_graph(
        g.nodes,
        "sized_nli",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "L"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["B", "L"]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", 3])],
        g.weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def tokenizer(texts: Iterable[str]) -> tokenizers.Tokenizer:
    """A Unigram (SentencePiece-style) tokenizer trained on ``texts``, with DeBERTa's
    [CLS] A [SEP] B [SEP] template."""
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    special = ["[PAD]", "[CLS]", "[SEP]", "[UNK]"]
    tok = tokenizers.Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=4000, special_tokens=special, unk_token="[UNK]")
    tok.train_from_iterator(texts, trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return tok


def write_sized_model(folder: Path, texts: Iterable[str], *, seed: int = 0) -> Path:
    """Write the int8 model, its tokenizer and config to ``folder``; return it."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    (folder / "onnx").mkdir(parents=True, exist_ok=True)
    fp32 = folder / "fp32.onnx"
    onnx.save(build(seed), str(fp32))
    quantize_dynamic(
        str(fp32), str(folder / "onnx" / "model_quint8_avx2.onnx"), weight_type=QuantType.QUInt8
    )
    fp32.unlink()
    tokenizer(texts).save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text(json.dumps({"id2label": ID2LABEL, "pad_token_id": 0}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 512}))
    return folder
