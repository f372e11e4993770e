"""``save``: write an example, optionally with its large tensors in an external data file."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import onnx
from onnx import TensorProto


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
