"""``transformer``: a BERT-like encoder whose every layer reads the attention mask graph input."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper

from sharderd.examples.builder import (
    Graph,
    float_info,
    graph_model,
    ints,
    normal,
    positive,
    require,
    scalar,
)


def transformer(
    *,
    layers: int = 4,
    hidden: int = 256,
    heads: int = 4,
    seq: int = 128,
    vocab: int = 1000,
    ffn: int | None = None,
    batch: int | str = "batch",
    tied_embeddings: bool = False,
    name_nodes: bool = True,
    seed: int = 0,
) -> onnx.ModelProto:
    """A BERT-like encoder shaped like a PyTorch export, ops and node names included.

    The attention mask is turned into an additive bias inside every layer straight from the graph
    input, so every pipeline stage needs ``attention_mask``. ``tied_embeddings`` makes the LM head
    read the token-embedding initializer through a Transpose: one weight, two distant consumers.
    """
    ffn = 4 * hidden if ffn is None else ffn
    positive(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab, ffn=ffn)
    require(hidden % heads == 0, "hidden", f"must be divisible by heads ({heads}), got {hidden}")
    require(
        (isinstance(batch, str) and batch != "") or (isinstance(batch, int) and batch >= 1),
        "batch",
        f"must be a dim name or an integer >= 1, got {batch!r}",
    )
    rng = np.random.default_rng(seed)
    g = Graph(name_nodes=name_nodes)

    embedding = g.weight("embeddings.word_embeddings.weight", normal(rng, vocab, hidden))
    x = g.op("Gather", "/embeddings/Gather", embedding, "input_ids", axis=0)
    x = g.op(
        "Add",
        "/embeddings/Add",
        x,
        g.weight("embeddings.position_embeddings.weight", normal(rng, seq, hidden)),
    )
    x = _layer_norm(g, rng, "/embeddings/LayerNorm", "embeddings.LayerNorm", x, hidden)
    for i in range(layers):
        x = _encoder_layer(g, rng, i, x, hidden=hidden, heads=heads, seq=seq, ffn=ffn)

    if tied_embeddings:
        head = g.op("Transpose", "/lm_head/Transpose", embedding, perm=[1, 0])
    else:
        head = g.weight("lm_head.weight", normal(rng, hidden, vocab))
    g.op("MatMul", "/lm_head/MatMul", x, head, out="logits")

    ids = [
        helper.make_tensor_value_info(n, TensorProto.INT64, [batch, seq])
        for n in ("input_ids", "attention_mask")
    ]
    graph = g.to_graph("transformer", ids, [float_info("logits", [batch, seq, vocab])])
    return graph_model(
        graph, f"BERT-like encoder: {layers} layers, hidden {hidden}, {heads} heads, seq {seq}"
    )


def _layer_norm(
    g: Graph, rng: np.random.Generator, node: str, param: str, x: str, hidden: int
) -> str:
    scale = g.weight(f"{param}.weight", 1.0 + normal(rng, hidden, scale=0.1))
    bias = g.weight(f"{param}.bias", normal(rng, hidden))
    return g.op("LayerNormalization", node, x, scale, bias, axis=-1, epsilon=1e-12)


def _linear(
    g: Graph, rng: np.random.Generator, node: str, param: str, x: str, fan_in: int, fan_out: int
) -> str:
    y = g.op(
        "MatMul", f"{node}/MatMul", x, g.weight(f"{param}.weight", normal(rng, fan_in, fan_out))
    )
    return g.op("Add", f"{node}/Add", y, g.weight(f"{param}.bias", normal(rng, fan_out)))


def _encoder_layer(
    g: Graph,
    rng: np.random.Generator,
    i: int,
    x: str,
    *,
    hidden: int,
    heads: int,
    seq: int,
    ffn: int,
) -> str:
    node, param = f"/layer{i}", f"encoder.layer.{i}"
    head_dim = hidden // heads
    split_heads = g.weight(f"{param}.attention.split_heads_shape", ints(0, seq, heads, head_dim))

    def project(which: str, perm: list[int]) -> str:
        y = _linear(g, rng, f"{node}/attn/{which}", f"{param}.attention.{which}", x, hidden, hidden)
        y = g.op("Reshape", f"{node}/attn/{which}/Reshape", y, split_heads)
        return g.op("Transpose", f"{node}/attn/{which}/Transpose", y, perm=perm)

    q = project("query", [0, 2, 1, 3])  # [b, heads, seq, head_dim]
    k = project("key", [0, 2, 3, 1])  # [b, heads, head_dim, seq]: K^T
    v = project("value", [0, 2, 1, 3])

    mask = g.op("Cast", f"{node}/attn/mask/Cast", "attention_mask", to=TensorProto.FLOAT)
    mask = g.op(
        "Sub", f"{node}/attn/mask/Sub", g.weight(f"{param}.attention.mask_one", scalar(1.0)), mask
    )
    mask = g.op(
        "Mul",
        f"{node}/attn/mask/Mul",
        mask,
        g.weight(f"{param}.attention.mask_fill", scalar(-10000.0)),
    )
    mask = g.op(
        "Unsqueeze",
        f"{node}/attn/mask/Unsqueeze",
        mask,
        g.weight(f"{param}.attention.mask_axes", ints(1, 2)),
    )

    scores = g.op("MatMul", f"{node}/attn/MatMul_qk", q, k)
    scale = g.weight(f"{param}.attention.scale", scalar(1.0 / math.sqrt(head_dim)))
    scores = g.op("Mul", f"{node}/attn/Mul_scale", scores, scale)
    scores = g.op("Add", f"{node}/attn/Add_mask", scores, mask)
    probs = g.op("Softmax", f"{node}/attn/Softmax", scores, axis=-1)
    context = g.op("MatMul", f"{node}/attn/MatMul_v", probs, v)
    context = g.op("Transpose", f"{node}/attn/Transpose_merge", context, perm=[0, 2, 1, 3])
    merge = g.weight(f"{param}.attention.merge_heads_shape", ints(0, seq, hidden))
    context = g.op("Reshape", f"{node}/attn/Reshape_merge", context, merge)
    attn = _linear(
        g, rng, f"{node}/attn/output", f"{param}.attention.output", context, hidden, hidden
    )
    x = g.op("Add", f"{node}/attn/Add_residual", attn, x)
    x = _layer_norm(g, rng, f"{node}/attn/LayerNorm", f"{param}.attention.LayerNorm", x, hidden)

    h = _linear(g, rng, f"{node}/ffn/intermediate", f"{param}.intermediate", x, hidden, ffn)
    h = _gelu(g, f"{node}/ffn/gelu", f"{param}.intermediate.gelu", h)
    h = _linear(g, rng, f"{node}/ffn/output", f"{param}.output", h, ffn, hidden)
    x = g.op("Add", f"{node}/ffn/Add_residual", h, x)
    return _layer_norm(g, rng, f"{node}/ffn/LayerNorm", f"{param}.output.LayerNorm", x, hidden)


def _gelu(g: Graph, node: str, param: str, x: str) -> str:
    """x * 0.5 * (1 + erf(x / sqrt 2)): the five-op pattern torch exports before opset 20."""
    y = g.op("Div", f"{node}/Div", x, g.weight(f"{param}.sqrt2", scalar(math.sqrt(2.0))))
    y = g.op("Erf", f"{node}/Erf", y)
    y = g.op("Add", f"{node}/Add", y, g.weight(f"{param}.one", scalar(1.0)))
    y = g.op("Mul", f"{node}/Mul", x, y)
    return g.op("Mul", f"{node}/Mul_half", y, g.weight(f"{param}.half", scalar(0.5)))
