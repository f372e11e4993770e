"""GPT-2-like graphs written the way the TorchScript exporter writes them, at any size, for benchmarks.

``examples.transformer`` has static shapes: it measures the planner, not shape propagation. A real
``torch.onnx.export`` of GPT-2 has symbolic ``batch``/``sequence`` inputs and, per layer, the shape
subgraphs that compute every Reshape target and mask at run time (compare
``tests/data/models/tiny_gpt2``):

- Conv1D as ``Shape → Gather / Slice → Squeeze → Unsqueeze → Concat → Reshape → Gemm → Reshape``,
- the head split ``Shape → Gather → Unsqueeze → Concat(batch, seq, heads, d) → Reshape →
  Transpose``, and the merge back,
- the causal mask ``Range → Unsqueeze → LessOrEqual → Expand`` with ``ConstantOfShape`` for the
  fill value, applied with ``Where`` before ``Softmax``,
- a ``Constant`` node for every scalar and axes list, LayerNormalization, the tanh GELU.

Weights can go to a sparse external data file (no byte written or held in memory, like
``examples.large_external_model``), so a GPT-2-XL-sized model (48 layers, hidden 1600, 6.5 GB)
is built in a second. Used by ``plan_scale.py --family exporter``.

    python bench/exporter_graph.py out.onnx --nodes 10000
    python bench/exporter_graph.py xl.onnx --layers 48 --hidden 1600 --heads 25 --vocab 50257 --external
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
_ALIGNMENT = 4096
"""External tensors start on page boundaries, as in ``examples.large_external_model``."""
_INT_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Dims:
    layers: int
    hidden: int
    heads: int
    vocab: int
    positions: int = 1024

    def __post_init__(self) -> None:
        if min(self.layers, self.hidden, self.heads, self.vocab, self.positions) < 1:
            raise ValueError(f"every dim must be >= 1: {self}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not a multiple of heads {self.heads}")

    @property
    def weight_bytes(self) -> int:
        """fp32 bytes of all weights (the LM head is its own [hidden, vocab] copy, as exports store it)."""
        h = self.hidden
        per_layer = 12 * h * h + 13 * h
        return 4 * (self.layers * per_layer + (2 * self.vocab + self.positions + 2) * h)


# GPT-2 XL as the exporter writes it: 48 layers, about 9.3k nodes, 6.55 GB of fp32 weights.
GPT2_XL = Dims(layers=48, hidden=1600, heads=25, vocab=50257)


class _Builder:
    """Nodes named like the exporter's (``/h.3/attn/Shape_2``), outputs ``<name>_output_0``."""

    __slots__ = ("constants", "counts", "initializers", "nodes", "scope")

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.counts: dict[tuple[str, str], int] = {}
        self.constants: dict[tuple[str, str, bytes], str] = {}
        self.scope = ""

    def op(
        self, op_type: str, *inputs: str, outputs: int = 1, out: str | None = None, **attrs: object
    ) -> str:
        key = (self.scope, op_type)
        k = self.counts.get(key, 0)
        self.counts[key] = k + 1
        name = f"{self.scope}/{op_type}" + (f"_{k}" if k else "")
        names = [out] if out else [f"{name}_output_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=name, **attrs))
        return names[0]

    def const(self, value: object, dtype: type = np.int64, *, shared: bool = False) -> str:
        """A ``Constant`` node, as the exporter writes every scalar and axes list.

        Each use gets its own node, except ``shared`` ones (the exporter reuses ``Unsqueeze``
        axes within a module): this matches its ~195 nodes per GPT-2 layer.
        """
        array = np.array(value, dtype=dtype)
        key = (self.scope, f"{array.dtype}{array.shape}", array.tobytes())
        if shared and key in self.constants:
            return self.constants[key]
        name = self.op("Constant", value=numpy_helper.from_array(array))
        if shared:
            self.constants[key] = name
        return name

    def weight(self, name: str, *dims: int) -> str:
        tensor = TensorProto(name=name, dims=list(dims), data_type=TensorProto.FLOAT)
        self.initializers.append(tensor)
        return name

    def dim(self, x: str, axis: int) -> str:
        """``Shape → Gather(axis)``: one dim of ``x`` as a scalar."""
        return self.op("Gather", self.op("Shape", x), self.const(axis), axis=0)

    def unsqueeze0(self, scalar: str) -> str:
        return self.op("Unsqueeze", scalar, self.const([0], shared=True))


def _conv1d(b: _Builder, x: str, prefix: str, nf: int, nx: int) -> str:
    """HF GPT-2 ``Conv1D``: ``x.view(-1, nx)`` → addmm → ``view(batch, seq, nf)``."""
    batch, seq = b.dim(x, 0), b.dim(x, 1)
    last = b.op("Slice", b.op("Shape", x), b.const([-1]), b.const([_INT_MAX]), b.const([0]))
    last = b.op("Unsqueeze", b.op("Squeeze", last, b.const([0])), b.const([0]))
    flat = b.op("Reshape", x, b.op("Concat", b.const([-1]), last, axis=0))
    y = b.op("Gemm", flat, b.weight(f"{prefix}.weight", nx, nf), b.weight(f"{prefix}.bias", nf))
    shape = b.op("Concat", b.unsqueeze0(batch), b.unsqueeze0(seq), b.const([nf]), axis=0)
    return b.op("Reshape", y, shape)


def _split_heads(b: _Builder, x: str, heads: int, head_dim: int, perm: list[int]) -> str:
    batch, seq = b.dim(x, 0), b.dim(x, 1)
    shape = b.op(
        "Concat",
        b.unsqueeze0(batch),
        b.unsqueeze0(seq),
        b.const([heads]),
        b.const([head_dim]),
        axis=0,
    )
    return b.op("Transpose", b.op("Reshape", x, shape), perm=perm)


def _causal_mask(b: _Builder, scores: str, q: str) -> str:
    """``Range`` positions → lower-triangular bool → ``Expand`` to [batch, 1, S, S] → ``Where``."""
    seq = b.dim(q, 2)
    positions = b.op("Range", b.const(0), seq, b.const(1))
    allowed = b.op(
        "LessOrEqual",
        b.op("Unsqueeze", positions, b.const([0])),
        b.op("Unsqueeze", positions, b.const([1])),
    )
    seq_1d = b.unsqueeze0(seq)
    shape = b.op("Concat", b.unsqueeze0(b.dim(q, 0)), b.const([1]), seq_1d, seq_1d, axis=0)
    mask = b.op("Expand", allowed, shape)
    fill = numpy_helper.from_array(np.array([np.finfo(np.float32).min], dtype=np.float32))
    return b.op("Where", mask, scores, b.op("ConstantOfShape", shape, value=fill))


def _merge_heads(b: _Builder, ctx: str, hidden: int) -> str:
    ctx = b.op("Transpose", ctx, perm=[0, 2, 1, 3])
    batch, seq = b.dim(ctx, 0), b.dim(ctx, 1)
    return b.op(
        "Reshape",
        ctx,
        b.op("Concat", b.unsqueeze0(batch), b.unsqueeze0(seq), b.const([hidden]), axis=0),
    )


def _gelu_new(b: _Builder, x: str) -> str:
    """``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))``, op by op as the exporter writes it."""
    cube = b.op("Mul", b.op("Pow", x, b.const(3.0, np.float32)), b.const(0.044715, np.float32))
    inner = b.op("Mul", b.op("Add", x, cube), b.const(math.sqrt(2 / math.pi), np.float32))
    one_plus = b.op("Add", b.op("Tanh", inner), b.const(1.0, np.float32))
    return b.op("Mul", b.op("Mul", x, b.const(0.5, np.float32)), one_plus)


def _layer_norm(b: _Builder, x: str, prefix: str, hidden: int) -> str:
    return b.op(
        "LayerNormalization",
        x,
        b.weight(f"{prefix}.weight", hidden),
        b.weight(f"{prefix}.bias", hidden),
        axis=-1,
    )


def _block(b: _Builder, x: str, i: int, dims: Dims) -> str:
    h, heads = dims.hidden, dims.heads
    d = h // heads
    b.scope = f"/h.{i}/ln_1"
    a = _layer_norm(b, x, f"h.{i}.ln_1", h)
    b.scope = f"/h.{i}/attn"
    qkv = _conv1d(b, a, f"h.{i}.attn.c_attn", 3 * h, h)
    b.op("Split", qkv, b.const([h, h, h]), outputs=3, axis=2)
    q, k, v = b.nodes[-1].output
    q = _split_heads(b, q, heads, d, [0, 2, 1, 3])
    k = _split_heads(b, k, heads, d, [0, 2, 3, 1])
    v = _split_heads(b, v, heads, d, [0, 2, 1, 3])
    scores = b.op("Div", b.op("MatMul", q, k), b.const(math.sqrt(d), np.float32))
    probs = b.op("Softmax", _causal_mask(b, scores, q), axis=-1)
    ctx = _merge_heads(b, b.op("MatMul", probs, v), h)
    x = b.op("Add", x, _conv1d(b, ctx, f"h.{i}.attn.c_proj", h, h))
    b.scope = f"/h.{i}/ln_2"
    a = _layer_norm(b, x, f"h.{i}.ln_2", h)
    b.scope = f"/h.{i}/mlp"
    m = _gelu_new(b, _conv1d(b, a, f"h.{i}.mlp.c_fc", 4 * h, h))
    return b.op("Add", x, _conv1d(b, m, f"h.{i}.mlp.c_proj", h, 4 * h))


def exporter_gpt2(dims: Dims) -> onnx.ModelProto:
    """The graph with weights as dims + dtype only: ``save`` gives them inline zeros or sparse external data."""
    b = _Builder()
    b.scope = "/wte"
    tokens = b.op("Gather", b.weight("wte.weight", dims.vocab, dims.hidden), "input_ids", axis=0)
    b.scope = "/wpe"
    positions = b.op("Range", b.const(0), b.dim("input_ids", 1), b.const(1))
    positions = b.op("Unsqueeze", positions, b.const([0]))
    x = b.op(
        "Add",
        tokens,
        b.op("Gather", b.weight("wpe.weight", dims.positions, dims.hidden), positions, axis=0),
    )
    for i in range(dims.layers):
        x = _block(b, x, i, dims)
    b.scope = "/ln_f"
    x = _layer_norm(b, x, "ln_f", dims.hidden)
    b.scope = "/lm_head"
    b.op("MatMul", x, b.weight("lm_head.weight", dims.hidden, dims.vocab), out="logits")
    graph = helper.make_graph(
        b.nodes,
        "exporter_gpt2",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [
            helper.make_tensor_value_info(
                "logits", TensorProto.FLOAT, ["batch", "sequence", dims.vocab]
            )
        ],
        b.initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="bench.exporter_graph"
    )
    model.ir_version = IR_VERSION
    return model


def save(model: onnx.ModelProto, path: Path, *, external: bool) -> Path:
    """Write ``model``; weights become zeros inline, or (``external``) a sparse ``<stem>.data``.

    The sparse file is created with ``os.truncate``: no weight byte is written or held in memory.
    """
    path = Path(path)
    data = path.with_name(f"{path.stem}.data")
    offset = 0
    for tensor in model.graph.initializer:
        length = 4 * math.prod(tensor.dims)
        if external:
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (("location", data.name), ("offset", offset), ("length", length)):
                tensor.external_data.add(key=key, value=str(value))
            offset += -(-length // _ALIGNMENT) * _ALIGNMENT
        else:
            tensor.raw_data = bytes(length)
    if external:
        with open(data, "wb") as f:
            os.truncate(f.fileno(), offset)
    path.write_bytes(model.SerializeToString())
    return path


def hidden_for(data_bytes: int, *, layers: int, heads: int, vocab: int) -> int:
    """The smallest hidden size (a multiple of ``heads``) whose weights reach ``data_bytes``."""
    hidden = heads
    while Dims(layers=layers, hidden=hidden, heads=heads, vocab=vocab).weight_bytes < data_bytes:
        hidden += heads
    return hidden


def nodes_per_layer() -> tuple[int, int]:
    """(per layer, fixed), measured on 1- and 2-layer builds rather than assumed."""
    one = len(exporter_gpt2(Dims(layers=1, hidden=8, heads=2, vocab=8, positions=8)).graph.node)
    two = len(exporter_gpt2(Dims(layers=2, hidden=8, heads=2, vocab=8, positions=8)).graph.node)
    return two - one, 2 * one - two


def layers_for(target_nodes: int) -> int:
    per_layer, fixed = nodes_per_layer()
    return max(1, round((target_nodes - fixed) / per_layer))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--nodes", type=int, help="about this many nodes (sets --layers)")
    size.add_argument("--layers", type=int, default=GPT2_XL.layers)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument(
        "--external", action="store_true", help="weights in a sparse external data file"
    )
    parser.add_argument(
        "--data-gb", type=float, help="pick --hidden so the weights total this (implies --external)"
    )
    args = parser.parse_args()
    layers = layers_for(args.nodes) if args.nodes else args.layers
    hidden = args.hidden
    if args.data_gb:
        hidden = hidden_for(
            int(args.data_gb * 1e9), layers=layers, heads=args.heads, vocab=args.vocab
        )
        args.external = True
    dims = Dims(layers=layers, hidden=hidden, heads=args.heads, vocab=args.vocab)
    model = exporter_gpt2(dims)
    save(model, args.path, external=args.external)
    print(
        f"{args.path}: {len(model.graph.node)} nodes, {layers} layers, {dims.weight_bytes / 1e9:.2f} GB of weights"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
