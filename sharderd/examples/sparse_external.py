"""``large_external_model``: multi-gigabyte external weights that are never held in memory."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from numpy.typing import DTypeLike
from onnx import TensorProto, helper, numpy_helper

from sharderd.examples.builder import (
    Graph,
    graph_model,
    positive,
)

_EXTERNAL_ALIGNMENT = 4096
"""Tensors in a data file start on page boundaries, as memory-mapping loaders prefer."""


def large_external_model(
    path: Path, *, total_bytes: int, layers: int = 8, dtype: DTypeLike = np.float16
) -> Path:
    """A MatMul/Relu chain whose external weights total at least ``total_bytes``, written in O(1) memory.

    Initializers carry only dims, type and (location, offset, length) into ``<stem>.data``, which is
    created sparse with ``os.truncate``: all weights are zero, no byte of them is ever in memory, and
    a 6 GB model takes milliseconds. The model file itself is a few kilobytes; check it with
    ``onnx.checker.check_model(path)``, which accepts models over 2 GB.
    """
    positive(total_bytes=total_bytes, layers=layers)
    dt = np.dtype(dtype)
    elem = helper.np_dtype_to_tensor_dtype(dt)
    h = math.ceil(math.sqrt(total_bytes / (layers * dt.itemsize)))
    h = -(-h // 64) * 64  # a round width, as real models have
    length = h * h * dt.itemsize
    stride = -(-length // _EXTERNAL_ALIGNMENT) * _EXTERNAL_ALIGNMENT
    path = Path(path)
    data = path.with_name(f"{path.stem}.data")

    g = Graph(name_nodes=True)
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
    model = graph_model(
        graph, f"{layers} MatMul layers of [{h}, {h}] {dt.name}, weights external and zero"
    )

    with open(data, "wb") as f:
        os.truncate(f.fileno(), (layers - 1) * stride + length)
    path.write_bytes(model.SerializeToString())
    return path


def big_embedding_model(
    path: Path, *, vocab: int = 256 * 1024, hidden: int = 1024, hit_ids: tuple[int, ...] = ()
) -> Path:
    """A decoder (``ids`` → embedding Gather → MatMul → Relu → MatMul) whose fp32 embedding table
    is ``vocab × hidden`` (1 GiB by default, more than one ipu-mk2) in a sparse external file.

    The table is zero except the rows ``hit_ids``, filled with distinct values (row r holds
    ``r + column / hidden``), so a lookup checked on them tells rows apart; the file is
    created with ``os.truncate`` and those rows written with ``seek``, taking a few pages of disk.
    """
    positive(vocab=vocab, hidden=hidden)
    path = Path(path)
    data = path.with_name(f"{path.stem}.data")
    row_bytes = hidden * 4
    table_bytes = vocab * row_bytes
    stride = -(-table_bytes // _EXTERNAL_ALIGNMENT) * _EXTERNAL_ALIGNMENT
    rng = np.random.default_rng(0)
    small = {
        "w1": rng.standard_normal((hidden, 64)).astype(np.float32) / 32,
        "w2": rng.standard_normal((64, 64)).astype(np.float32) / 8,
    }
    g = Graph(name_nodes=True)
    table = TensorProto(
        name="embed.weight", dims=[vocab, hidden], data_type=TensorProto.FLOAT,
        data_location=TensorProto.EXTERNAL,
    )  # fmt: skip
    for key, value in (("location", data.name), ("offset", 0), ("length", table_bytes)):
        table.external_data.add(key=key, value=str(value))
    g.initializers.append(table)
    for name, array in small.items():
        g.initializers.append(numpy_helper.from_array(array, name))
    x = g.op("Gather", "/embed/Gather", table.name, "ids")
    x = g.op("MatMul", "/mlp/MatMul", x, "w1")
    x = g.op("Relu", "/mlp/Relu", x)
    g.op("MatMul", "/head/MatMul", x, "w2", out="y")
    graph = g.to_graph(
        "big_embedding",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 64])],
    )
    model = graph_model(
        graph, f"embedding [{vocab}, {hidden}] fp32 external and sparse, then an MLP"
    )
    with open(data, "wb") as f:
        os.truncate(f.fileno(), stride)
        for r in sorted(set(hit_ids)):
            f.seek(r * row_bytes)
            f.write((r + np.arange(hidden, dtype=np.float32) / hidden).astype(np.float32).tobytes())
    path.write_bytes(model.SerializeToString())
    return path
