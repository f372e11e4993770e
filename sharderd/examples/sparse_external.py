"""``large_external_model``: multi-gigabyte external weights that are never held in memory."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from numpy.typing import DTypeLike
from onnx import TensorProto, helper

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
