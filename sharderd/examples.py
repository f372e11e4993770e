"""Realistic ONNX models built locally, so demos, tests and benchmarks need no downloads.

Each builder exercises something a sharder gets wrong easily: a graph input consumed in every
transformer layer, one weight shared by distant nodes, weights inside ``If`` branches that read
outer-scope tensors, graph outputs that are also consumed, 100k-node chains, and multi-gigabyte
external weights that are never held in memory. Models use opset 17 and IR version 8 (onnxruntime
1.17+ loads them); weights come from a seeded generator at a small scale, so two builds with the same
arguments are byte-identical and outputs stay finite.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from numpy.typing import DTypeLike
from onnx import TensorProto, helper, numpy_helper

from sharderd.errors import ConfigError

__all__ = [
    "EXAMPLES",
    "IR_VERSION",
    "OPSET",
    "chain",
    "cnn",
    "large_external_model",
    "multi_io",
    "save",
    "shared_weights",
    "transformer",
    "with_if",
]

OPSET = 17
"""LayerNormalization needs 17; PopRT and onnxruntime >= 1.17 both accept it."""
IR_VERSION = 8
"""The highest IR version onnxruntime 1.17 loads."""

_WEIGHT_SCALE = 0.02
_EXTERNAL_ALIGNMENT = 4096
"""Tensors in a data file start on page boundaries, as memory-mapping loaders prefer."""


class _Graph:
    """Accumulates one graph's nodes and initializers.

    Every output tensor is named ``<node name>_output_0`` (graph outputs excepted) whether or not the
    node keeps its name, so ``name_nodes=False`` empties node names only and tensors stay unique.
    """

    __slots__ = ("initializers", "name_nodes", "nodes")

    def __init__(self, *, name_nodes: bool) -> None:
        self.name_nodes = name_nodes
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []

    def weight(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def op(
        self, op_type: str, name: str, *inputs: str, out: str | None = None, **attrs: Any
    ) -> str:
        """Add a node; returns its output, named ``out`` when that is a graph output."""
        output = f"{name}_output_0" if out is None else out
        node = helper.make_node(
            op_type, list(inputs), [output], name=name if self.name_nodes else "", **attrs
        )
        self.nodes.append(node)
        return output

    def to_graph(
        self,
        name: str,
        inputs: Sequence[onnx.ValueInfoProto],
        outputs: Sequence[onnx.ValueInfoProto],
    ) -> onnx.GraphProto:
        return helper.make_graph(self.nodes, name, list(inputs), list(outputs), self.initializers)


def _empty_model(doc: str) -> onnx.ModelProto:
    return onnx.ModelProto(
        ir_version=IR_VERSION,
        opset_import=[helper.make_opsetid("", OPSET)],
        producer_name="sharderd.examples",
        doc_string=doc,
    )


def _model(graph: onnx.GraphProto, doc: str) -> onnx.ModelProto:
    model = _empty_model(doc)
    model.graph.CopyFrom(graph)
    return model


def _require(ok: bool, key: str, rule: str) -> None:
    if not ok:
        raise ConfigError(f"example model option {key} {rule}")


def _positive(**values: int) -> None:
    for key, value in values.items():
        _require(
            isinstance(value, int) and value >= 1, key, f"must be an integer >= 1, got {value!r}"
        )


def _normal(rng: np.random.Generator, *shape: int, scale: float = _WEIGHT_SCALE) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(np.float32)


def _scalar(value: float) -> np.ndarray:
    return np.array(value, dtype=np.float32)


def _ints(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def _float_info(name: str, shape: Sequence[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


# --- transformer ----------------------------------------------------------------------------------


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
    _positive(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab, ffn=ffn)
    _require(hidden % heads == 0, "hidden", f"must be divisible by heads ({heads}), got {hidden}")
    _require(
        (isinstance(batch, str) and batch != "") or (isinstance(batch, int) and batch >= 1),
        "batch",
        f"must be a dim name or an integer >= 1, got {batch!r}",
    )
    rng = np.random.default_rng(seed)
    g = _Graph(name_nodes=name_nodes)

    embedding = g.weight("embeddings.word_embeddings.weight", _normal(rng, vocab, hidden))
    x = g.op("Gather", "/embeddings/Gather", embedding, "input_ids", axis=0)
    x = g.op(
        "Add",
        "/embeddings/Add",
        x,
        g.weight("embeddings.position_embeddings.weight", _normal(rng, seq, hidden)),
    )
    x = _layer_norm(g, rng, "/embeddings/LayerNorm", "embeddings.LayerNorm", x, hidden)
    for i in range(layers):
        x = _encoder_layer(g, rng, i, x, hidden=hidden, heads=heads, seq=seq, ffn=ffn)

    if tied_embeddings:
        head = g.op("Transpose", "/lm_head/Transpose", embedding, perm=[1, 0])
    else:
        head = g.weight("lm_head.weight", _normal(rng, hidden, vocab))
    g.op("MatMul", "/lm_head/MatMul", x, head, out="logits")

    ids = [
        helper.make_tensor_value_info(n, TensorProto.INT64, [batch, seq])
        for n in ("input_ids", "attention_mask")
    ]
    graph = g.to_graph("transformer", ids, [_float_info("logits", [batch, seq, vocab])])
    return _model(
        graph, f"BERT-like encoder: {layers} layers, hidden {hidden}, {heads} heads, seq {seq}"
    )


def _layer_norm(
    g: _Graph, rng: np.random.Generator, node: str, param: str, x: str, hidden: int
) -> str:
    scale = g.weight(f"{param}.weight", 1.0 + _normal(rng, hidden, scale=0.1))
    bias = g.weight(f"{param}.bias", _normal(rng, hidden))
    return g.op("LayerNormalization", node, x, scale, bias, axis=-1, epsilon=1e-12)


def _linear(
    g: _Graph, rng: np.random.Generator, node: str, param: str, x: str, fan_in: int, fan_out: int
) -> str:
    y = g.op(
        "MatMul", f"{node}/MatMul", x, g.weight(f"{param}.weight", _normal(rng, fan_in, fan_out))
    )
    return g.op("Add", f"{node}/Add", y, g.weight(f"{param}.bias", _normal(rng, fan_out)))


def _encoder_layer(
    g: _Graph,
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
    split_heads = g.weight(f"{param}.attention.split_heads_shape", _ints(0, seq, heads, head_dim))

    def project(which: str, perm: list[int]) -> str:
        y = _linear(g, rng, f"{node}/attn/{which}", f"{param}.attention.{which}", x, hidden, hidden)
        y = g.op("Reshape", f"{node}/attn/{which}/Reshape", y, split_heads)
        return g.op("Transpose", f"{node}/attn/{which}/Transpose", y, perm=perm)

    q = project("query", [0, 2, 1, 3])  # [b, heads, seq, head_dim]
    k = project("key", [0, 2, 3, 1])  # [b, heads, head_dim, seq]: K^T
    v = project("value", [0, 2, 1, 3])

    mask = g.op("Cast", f"{node}/attn/mask/Cast", "attention_mask", to=TensorProto.FLOAT)
    mask = g.op(
        "Sub", f"{node}/attn/mask/Sub", g.weight(f"{param}.attention.mask_one", _scalar(1.0)), mask
    )
    mask = g.op(
        "Mul",
        f"{node}/attn/mask/Mul",
        mask,
        g.weight(f"{param}.attention.mask_fill", _scalar(-10000.0)),
    )
    mask = g.op(
        "Unsqueeze",
        f"{node}/attn/mask/Unsqueeze",
        mask,
        g.weight(f"{param}.attention.mask_axes", _ints(1, 2)),
    )

    scores = g.op("MatMul", f"{node}/attn/MatMul_qk", q, k)
    scale = g.weight(f"{param}.attention.scale", _scalar(1.0 / math.sqrt(head_dim)))
    scores = g.op("Mul", f"{node}/attn/Mul_scale", scores, scale)
    scores = g.op("Add", f"{node}/attn/Add_mask", scores, mask)
    probs = g.op("Softmax", f"{node}/attn/Softmax", scores, axis=-1)
    context = g.op("MatMul", f"{node}/attn/MatMul_v", probs, v)
    context = g.op("Transpose", f"{node}/attn/Transpose_merge", context, perm=[0, 2, 1, 3])
    merge = g.weight(f"{param}.attention.merge_heads_shape", _ints(0, seq, hidden))
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


def _gelu(g: _Graph, node: str, param: str, x: str) -> str:
    """x * 0.5 * (1 + erf(x / sqrt 2)): the five-op pattern torch exports before opset 20."""
    y = g.op("Div", f"{node}/Div", x, g.weight(f"{param}.sqrt2", _scalar(math.sqrt(2.0))))
    y = g.op("Erf", f"{node}/Erf", y)
    y = g.op("Add", f"{node}/Add", y, g.weight(f"{param}.one", _scalar(1.0)))
    y = g.op("Mul", f"{node}/Mul", x, y)
    return g.op("Mul", f"{node}/Mul_half", y, g.weight(f"{param}.half", _scalar(0.5)))


# --- cnn ------------------------------------------------------------------------------------------


def cnn(
    *,
    blocks: int = 4,
    channels: int = 32,
    image: int = 64,
    classes: int = 10,
    batch: int = 1,
    name_nodes: bool = True,
    seed: int = 0,
) -> onnx.ModelProto:
    """A ResNet-like classifier: branchy residual blocks, stride-2 projections, BatchNorm unfused.

    Every second block halves the image and doubles the channels (capped at 8x ``channels``, as in
    ResNet-18's 64 → 512), so deep variants stay a sensible size.
    """
    _positive(blocks=blocks, channels=channels, image=image, classes=classes, batch=batch)
    rng = np.random.default_rng(seed)
    g = _Graph(name_nodes=name_nodes)

    x = _conv_bn(g, rng, "/stem", "stem", "image", 3, channels, kernel=7, stride=2)
    x = g.op("Relu", "/stem/Relu", x)
    x = g.op("MaxPool", "/stem/MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    width = channels
    for i in range(blocks):
        downsample = i % 2 == 1
        out = min(2 * width, 8 * channels) if downsample else width
        x = _residual_block(g, rng, i, x, width, out, stride=2 if downsample else 1)
        width = out

    x = g.op("GlobalAveragePool", "/head/GlobalAveragePool", x)
    x = g.op("Flatten", "/head/Flatten", x, axis=1)
    weight = g.weight("fc.weight", _normal(rng, classes, width, scale=1.0 / math.sqrt(width)))
    g.op(
        "Gemm",
        "/head/Gemm",
        x,
        weight,
        g.weight("fc.bias", _normal(rng, classes)),
        transB=1,
        out="logits",
    )

    graph = g.to_graph(
        "cnn",
        [_float_info("image", [batch, 3, image, image])],
        [_float_info("logits", [batch, classes])],
    )
    return _model(graph, f"ResNet-like CNN: {blocks} blocks, {channels} channels, {image}px")


def _conv_bn(
    g: _Graph,
    rng: np.random.Generator,
    node: str,
    param: str,
    x: str,
    cin: int,
    cout: int,
    *,
    kernel: int,
    stride: int,
) -> str:
    fan_in = cin * kernel * kernel
    weight = g.weight(
        f"{param}.conv.weight",
        _normal(rng, cout, cin, kernel, kernel, scale=math.sqrt(2.0 / fan_in)),
    )
    pad = kernel // 2
    x = g.op(
        "Conv",
        f"{node}/Conv",
        x,
        weight,
        kernel_shape=[kernel, kernel],
        strides=[stride, stride],
        pads=[pad] * 4,
    )
    stats = {
        "weight": 1.0 + _normal(rng, cout, scale=0.1),
        "bias": _normal(rng, cout, scale=0.1),
        "running_mean": _normal(rng, cout, scale=0.1),
        "running_var": 1.0 + np.abs(_normal(rng, cout, scale=0.1)),
    }
    names = [g.weight(f"{param}.bn.{k}", v) for k, v in stats.items()]
    return g.op("BatchNormalization", f"{node}/BatchNormalization", x, *names, epsilon=1e-5)


def _residual_block(
    g: _Graph, rng: np.random.Generator, i: int, x: str, cin: int, cout: int, *, stride: int
) -> str:
    node, param = f"/block{i}", f"layer.{i}"
    y = _conv_bn(g, rng, f"{node}/conv1", f"{param}.conv1", x, cin, cout, kernel=3, stride=stride)
    y = g.op("Relu", f"{node}/conv1/Relu", y)
    y = _conv_bn(g, rng, f"{node}/conv2", f"{param}.conv2", y, cout, cout, kernel=3, stride=1)
    skip = x
    if stride != 1 or cin != cout:
        skip = _conv_bn(
            g,
            rng,
            f"{node}/downsample",
            f"{param}.downsample",
            x,
            cin,
            cout,
            kernel=1,
            stride=stride,
        )
    y = g.op("Add", f"{node}/Add", y, skip)
    return g.op("Relu", f"{node}/Relu", y)


# --- small graphs with one awkward feature each ----------------------------------------------------


def shared_weights(
    *, layers: int = 6, hidden: int = 128, batch: int = 2, name_nodes: bool = True, seed: int = 0
) -> onnx.ModelProto:
    """An MLP whose first, middle and last MatMuls read the same initializer ``W_shared``.

    A sharder must place that weight on every stage that uses it and count its bytes once per device,
    not once per node.
    """
    _positive(layers=layers, hidden=hidden, batch=batch)
    _require(layers >= 3, "layers", f"must be >= 3 so first, middle and last differ, got {layers}")
    rng = np.random.default_rng(seed)
    g = _Graph(name_nodes=name_nodes)
    shared = g.weight("W_shared", _normal(rng, hidden, hidden, scale=1.0 / math.sqrt(hidden)))
    uses_shared = {0, layers // 2, layers - 1}
    x = "x"
    for i in range(layers):
        node = f"/layer{i}"
        if i in uses_shared:
            weight = shared
        else:
            weight = g.weight(
                f"layer{i}.weight", _normal(rng, hidden, hidden, scale=1.0 / math.sqrt(hidden))
            )
        x = g.op("MatMul", f"{node}/MatMul", x, weight)
        last = i == layers - 1
        bias = g.weight(f"layer{i}.bias", _normal(rng, hidden))
        x = g.op("Add", f"{node}/Add", x, bias, out="y" if last else None)
        if not last:
            x = g.op("Relu", f"{node}/Relu", x)
    graph = g.to_graph(
        "shared_weights", [_float_info("x", [batch, hidden])], [_float_info("y", [batch, hidden])]
    )
    return _model(graph, f"MLP of {layers} layers sharing W_shared in layers {sorted(uses_shared)}")


def with_if(
    *, hidden: int = 64, batch: int = 2, name_nodes: bool = True, seed: int = 0
) -> onnx.ModelProto:
    """A model whose weights partly live inside ``If`` branches that read an outer-scope tensor.

    The then-branch holds its weight in a ``Constant`` node, the else-branch as a subgraph initializer;
    both read ``/pre/MatMul_output_0`` without listing it as an input. The sign of ``x`` picks the
    branch (the condition is linear in ``x``), so tests can run both.
    """
    _positive(hidden=hidden, batch=batch)
    rng = np.random.default_rng(seed)
    g = _Graph(name_nodes=name_nodes)

    def square() -> np.ndarray:
        return _normal(rng, hidden, hidden, scale=1.0 / math.sqrt(hidden))

    h = g.op("MatMul", "/pre/MatMul", "x", g.weight("pre.weight", square()))
    total = g.op("ReduceSum", "/pre/ReduceSum", h, keepdims=0)
    cond = g.op("Greater", "/pre/Greater", total, g.weight("pre.zero", _scalar(0.0)))
    branch_out = [batch, hidden]

    then = _Graph(name_nodes=name_nodes)
    constant = numpy_helper.from_array(square(), "if.then.weight")
    w = then.op("Constant", "/if/then/Constant", value=constant)
    y = then.op("MatMul", "/if/then/MatMul", h, w)
    y = then.op("Relu", "/if/then/Relu", y)
    then_graph = then.to_graph("then_branch", [], [_float_info(y, branch_out)])

    other = _Graph(name_nodes=name_nodes)
    y = other.op("MatMul", "/if/else/MatMul", h, other.weight("if.else.weight", square()))
    y = other.op("Tanh", "/if/else/Tanh", y)
    else_graph = other.to_graph("else_branch", [], [_float_info(y, branch_out)])

    x = g.op("If", "/if/If", cond, then_branch=then_graph, else_branch=else_graph)
    x = g.op("MatMul", "/post/MatMul_0", x, g.weight("post.0.weight", square()))
    x = g.op("Relu", "/post/Relu", x)
    g.op("MatMul", "/post/MatMul_1", x, g.weight("post.1.weight", square()), out="y")
    graph = g.to_graph(
        "with_if", [_float_info("x", [batch, hidden])], [_float_info("y", [batch, hidden])]
    )
    return _model(graph, "If with weights in both branches and an implicit outer-scope input")


def multi_io(
    *, hidden: int = 64, batch: int = 2, name_nodes: bool = True, seed: int = 0
) -> onnx.ModelProto:
    """Two inputs and three outputs; ``b`` is read at the start and again near the end.

    ``out_sum`` is a graph output that later nodes also consume, so a stage boundary after it must
    both return it and pass it on.
    """
    _positive(hidden=hidden, batch=batch)
    rng = np.random.default_rng(seed)
    g = _Graph(name_nodes=name_nodes)

    def square(name: str) -> str:
        return g.weight(name, _normal(rng, hidden, hidden, scale=1.0 / math.sqrt(hidden)))

    a = g.op("MatMul", "/a/MatMul", "a", square("a.weight"))
    b = g.op("MatMul", "/b/MatMul", "b", square("b.weight"))
    x = g.op("Add", "/sum/Add", a, "b", out="out_sum")
    g.op("Mul", "/prod/Mul", a, b, out="out_prod")
    for i in range(3):
        x = g.op("MatMul", f"/deep/MatMul_{i}", x, square(f"deep.{i}.weight"))
        x = g.op("Relu", f"/deep/Relu_{i}", x)
    x = g.op("Add", "/deep/Add_b", x, "b")
    g.op("MatMul", "/deep/MatMul_out", x, square("deep.out.weight"), out="out_deep")

    io = [batch, hidden]
    graph = g.to_graph(
        "multi_io",
        [_float_info("a", io), _float_info("b", io)],
        [_float_info(name, io) for name in ("out_sum", "out_prod", "out_deep")],
    )
    return _model(graph, "two inputs, three outputs, b consumed early and late")


def chain(
    *, nodes: int = 100, hidden: int = 64, batch: int = 1, name_nodes: bool = True, seed: int = 0
) -> onnx.ModelProto:
    """Exactly ``nodes`` nodes: units of MatMul, Relu, MatMul, Relu, Add(unit input), repeated.

    Built for planner benchmarks at 1k-100k nodes in linear time and one copy of the weights: the
    protos are filled in place, and every MatMul has its own initializer whose bytes come from a few
    arrays drawn once. Weights total about ``0.4 · nodes · hidden² · 4`` bytes, so pick a small
    ``hidden`` for 100k nodes. Their scale shrinks as ``1/sqrt(units)`` (as in Fixup), so the residual
    sum stays O(1) at any depth and outputs are finite and differ from the input.
    """
    _positive(nodes=nodes, hidden=hidden, batch=batch)
    rng = np.random.default_rng(seed)
    units = -(-nodes // 5)
    scale = min(0.5, 1.0 / math.sqrt(units)) / math.sqrt(hidden)
    pool = [_normal(rng, hidden, hidden, scale=scale).tobytes() for _ in range(4)]
    model = _empty_model(f"MatMul/Relu chain of {nodes} nodes with residual Adds")
    graph = model.graph
    graph.name = "chain"
    graph.input.append(_float_info("x", [batch, hidden]))
    graph.output.append(_float_info("y", [batch, hidden]))
    x = unit_input = "x"
    for k in range(nodes):
        unit, step = divmod(k, 5)
        op_type = _CHAIN_UNIT[step]
        name = f"/unit{unit}/{op_type}_{step // 2}" if step < 4 else f"/unit{unit}/Add"
        if step == 0:
            unit_input = x
        if op_type == "MatMul":
            weight = f"unit{unit}.{step // 2}.weight"
            graph.initializer.add(
                name=weight,
                dims=[hidden, hidden],
                data_type=TensorProto.FLOAT,
                raw_data=pool[k % 4],
            )
            inputs = [x, weight]
        else:
            inputs = [x, unit_input] if op_type == "Add" else [x]
        out = "y" if k == nodes - 1 else f"{name}_output_0"
        graph.node.add(op_type=op_type, name=name if name_nodes else "", input=inputs, output=[out])
        x = out
    return model


_CHAIN_UNIT = ("MatMul", "Relu", "MatMul", "Relu", "Add")


# --- writing --------------------------------------------------------------------------------------


def save(
    model: onnx.ModelProto, path: Path, *, external_data: bool = False, size_threshold: int = 1024
) -> Path:
    """Write ``model`` to ``path``; with ``external_data`` its large tensors go to ``<stem>.data``.

    Initializers of every graph (``If`` branches included) of at least ``size_threshold`` bytes move
    out; ``Constant`` attributes stay inline. ``model`` itself is left untouched (onnx's writer
    empties the tensors it moves, so a copy is written), and a stale data file is replaced, not
    appended to.
    """
    path = Path(path)
    if not external_data:
        onnx.save_model(model, os.fspath(path))
        return path
    data = path.with_name(f"{path.stem}.data")
    data.unlink(missing_ok=True)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for tensor in _initializers(copy.graph):
        if tensor.HasField("raw_data") and len(tensor.raw_data) >= size_threshold:
            onnx.external_data_helper.set_external_data(tensor, data.name)
    onnx.save_model(copy, os.fspath(path))
    if data.exists():  # onnx creates it 0600; give it the same mode as the model file
        data.chmod(path.stat().st_mode & 0o777)
    return path


def _initializers(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs
            for sub in subgraphs:
                yield from _initializers(sub)


def large_external_model(
    path: Path, *, total_bytes: int, layers: int = 8, dtype: DTypeLike = np.float16
) -> Path:
    """A MatMul/Relu chain whose external weights total at least ``total_bytes``, written in O(1) memory.

    Initializers carry only dims, type and (location, offset, length) into ``<stem>.data``, which is
    created sparse with ``os.truncate``: all weights are zero, no byte of them is ever in memory, and
    a 6 GB model takes milliseconds. The model file itself is a few kilobytes; check it with
    ``onnx.checker.check_model(path)``, which accepts models over 2 GB.
    """
    _positive(total_bytes=total_bytes, layers=layers)
    dt = np.dtype(dtype)
    elem = helper.np_dtype_to_tensor_dtype(dt)
    h = math.ceil(math.sqrt(total_bytes / (layers * dt.itemsize)))
    h = -(-h // 64) * 64  # a round width, as real models have
    length = h * h * dt.itemsize
    stride = -(-length // _EXTERNAL_ALIGNMENT) * _EXTERNAL_ALIGNMENT
    path = Path(path)
    data = path.with_name(f"{path.stem}.data")

    g = _Graph(name_nodes=True)
    x = "x"
    for i in range(layers):
        weight = TensorProto(
            name=f"layer{i}.weight", dims=[h, h], data_type=elem, data_location=TensorProto.EXTERNAL
        )
        for key, value in (("location", data.name), ("offset", i * stride), ("length", length)):
            weight.external_data.add(key=key, value=str(value))
        g.initializers.append(weight)
        last = i == layers - 1
        x = g.op("MatMul", f"/layer{i}/MatMul", x, weight.name, out="y" if last else None)
        if not last:
            x = g.op("Relu", f"/layer{i}/Relu", x)
    io: list[int | str] = ["batch", h]
    graph = g.to_graph(
        "large_external",
        [helper.make_tensor_value_info("x", elem, io)],
        [helper.make_tensor_value_info("y", elem, io)],
    )
    model = _model(
        graph, f"{layers} MatMul layers of [{h}, {h}] {dt.name}, weights external and zero"
    )

    with open(data, "wb") as f:
        os.truncate(f.fileno(), (layers - 1) * stride + length)
    path.write_bytes(model.SerializeToString())
    return path


EXAMPLES: Mapping[str, Callable[..., onnx.ModelProto]] = {
    "transformer": transformer,
    "cnn": cnn,
    "shared_weights": shared_weights,
    "with_if": with_if,
    "multi_io": multi_io,
    "chain": chain,
}
"""Builders by name, for ``sharderd example-model <name>``; all take keyword options only."""
