"""Realistic ONNX models built locally, so demos, tests and benchmarks need no downloads.

Each builder exercises something a sharder gets wrong easily: a graph input consumed in every
transformer layer, one weight shared by distant nodes, weights inside ``If`` branches that read
outer-scope tensors, graph outputs that are also consumed, 100k-node chains, and multi-gigabyte
external weights that are never held in memory. Models use opset 17 and IR version 8 (onnxruntime
1.17+ loads them); weights come from a seeded generator at a small scale, so two builds with the same
arguments are byte-identical and outputs stay finite.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import onnx

from sharderd.examples.builder import IR_VERSION, OPSET
from sharderd.examples.encoder import transformer
from sharderd.examples.if_branches import with_if
from sharderd.examples.many_io import multi_io
from sharderd.examples.residual_chain import chain
from sharderd.examples.resnet import cnn
from sharderd.examples.shared_mlp import shared_weights
from sharderd.examples.sparse_external import large_external_model
from sharderd.examples.tiled_tail import tiled_tail
from sharderd.examples.wide_head import wide_head
from sharderd.examples.write import save

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
    "tiled_tail",
    "transformer",
    "wide_head",
    "with_if",
]

EXAMPLES: Mapping[str, Callable[..., onnx.ModelProto]] = {
    "transformer": transformer,
    "cnn": cnn,
    "shared_weights": shared_weights,
    "with_if": with_if,
    "multi_io": multi_io,
    "chain": chain,
    "tiled_tail": tiled_tail,
    "wide_head": wide_head,
}
"""Builders by name, for ``sharderd example-model <name>``; all take keyword options only."""
