"""Which activation tensors reuse an input's memory instead of taking new memory of their own.

PopART replaces an op by its in-place variant when the input it would overwrite is read by nobody
else (``popart/graphcoreoperators.hpp`` lists the variants: ``ReshapeInplace``, ``ReluInplace``,
``SoftmaxInplace``, ``AddLhsInplace``/``AddRhsInplace`` ...), and the view-changing ones
(reshape, squeeze, flatten, identity) are Poplar views of the input's memory. The model here is
one rule, applied by every liveness computation of the planner: node ``q``'s output ``y`` shares
the memory of its input ``x`` when

- ``q``'s op type is in ``INPLACE_INPUTS`` and ``x`` is at one of the input slots listed for it;
- ``x`` is an activation made by a node (not a weight, not a graph input: the host's stream buffer
  is left as it is), read by ``q`` alone and at that one slot (so it dies at ``q`` in every order
  and every split), and not a graph output (the host still reads it);
- ``x`` and ``y`` have the same number of bytes (a broadcasting ``Add`` that grows its input,
  a ``Slice`` that keeps part of a larger buffer alive, are not in place);
- ``q`` is compiled (a folded node has no activations).

``Transpose`` (PopART has ``TransposeInplace``) is left out on purpose: the matmul or conv that
reads a transposed view rearranges it into a layout of its own, so the bytes are spent anyway; so
are ``Slice``, ``Pad``, ``Expand`` and ``Concat`` (different sizes or several inputs). Ops whose
PopART op has no in-place variant (``Sub``, ``Div``, ``Tanh``, ``Sqrt``, ``Cast``, ``Erf`` ...) take
new memory.
"""

from __future__ import annotations

import numpy as np
import onnx

from sharderd.graph.dataflow import Dataflow

__all__ = ["INPLACE_INPUTS", "alias_sources", "new_bytes", "node_new_bytes"]

_VIEWS = ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity")
_UNARY = (
    "Relu",
    "LeakyRelu",
    "Elu",
    "Selu",
    "Sigmoid",
    "HardSigmoid",
    "Softplus",
    "Softsign",
    "ThresholdedRelu",
    "Shrink",
    "Gelu",
    "Exp",
    "Clip",
    "Ceil",
    "Floor",
    "Round",
    "Sign",
    "Sinh",
    "Asin",
    "Atan",
    "Softmax",
    "LogSoftmax",
)

INPLACE_INPUTS: dict[str, tuple[int, ...]] = {
    **{op: (0,) for op in _VIEWS + _UNARY},
    "Add": (0, 1),
    "Mul": (0, 1),
    "Pow": (0,),
    "Where": (1, 2),
}
"""Op type → the input slots whose memory its output may take over (PopART's in-place variants
and Poplar's views; see the module docstring for the conditions)."""


def alias_sources(
    graph: onnx.GraphProto, flow: Dataflow, tensor_bytes: np.ndarray, compiled: np.ndarray
) -> np.ndarray:
    """int64 [T]: for each tensor, the input tensor whose memory it takes over, or -1."""
    source = np.full(flow.num_tensors, -1, dtype=np.int64)
    ids = {name: t for t, name in enumerate(flow.tensor_names)}
    counts = np.diff(flow.cons_ptr)
    for q, node in enumerate(graph.node):
        slots = INPLACE_INPUTS.get(node.op_type)
        if slots is None or node.domain not in ("", "ai.onnx") or not compiled[q]:
            continue
        outs = flow.outputs(q)
        if len(outs) != 1 or tensor_bytes[outs[0]] <= 0:
            continue
        y = int(outs[0])
        for slot in slots:
            if slot >= len(node.input) or not node.input[slot]:
                continue
            name = node.input[slot]
            x = ids.get(name)
            if (
                x is None
                or list(node.input).count(name) != 1
                or flow.producer[x] < 0
                or counts[x] != 1
                or flow.is_graph_output[x]
                or tensor_bytes[x] != tensor_bytes[y]
            ):
                continue
            source[y] = x
            break
    return source


def new_bytes(tensor_bytes: np.ndarray, source: np.ndarray | None) -> np.ndarray:
    """int64 [T]: the memory each tensor adds when it is made: its bytes, or for a tensor that takes
    over an input's memory only what it has beyond that input's bytes (0 at the sizes the rule
    admits; more only if a correction grew it past its input)."""
    tb = tensor_bytes.astype(np.int64)
    if source is None:
        return tb
    aliased = source >= 0
    out = tb.copy()
    out[aliased] = np.maximum(tb[aliased] - tb[source[aliased]], 0)
    return out


def node_new_bytes(
    flow: Dataflow, tensor_bytes: np.ndarray, source: np.ndarray | None
) -> np.ndarray:
    """int64 [N]: the memory each node's outputs add while it runs (its inputs aside)."""
    out = np.zeros(flow.num_nodes, dtype=np.int64)
    fresh = new_bytes(tensor_bytes, source)
    np.add.at(out, np.repeat(np.arange(flow.num_nodes), np.diff(flow.out_ptr)), fresh[flow.out_idx])
    return out
