"""Read an ONNX model without its weights, and refuse external data that points anywhere unsafe.

Weights stay on disk: ``load_external_data=False`` semantics, sizes come from dims × dtype, and
external files are only ``stat``-ed, so a 6 GB model plans in a few hundred MB of memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import onnx
from google.protobuf.message import DecodeError

from sharderd.errors import ModelInvalidError
from sharderd.graph.nesting import check_nesting
from sharderd.graph.tensors import all_tensors, tensor_nbytes

__all__ = [
    "ExternalFile",
    "LoadedModel",
    "check_command",
    "load_model",
    "parse_model_bytes",
    "truncated_field",
]

_MAX_MODEL_FILE = 2**31  # protobuf's own limit; bigger weights must be external


@dataclass(frozen=True, slots=True)
class ExternalFile:
    location: str
    """As written in the model, relative to its folder."""
    size: int
    tensors: int


@dataclass(frozen=True, slots=True)
class LoadedModel:
    path: Path
    model: onnx.ModelProto
    """The model proto; external tensors keep their references, no weight bytes loaded."""
    sha256: str
    """Of the .onnx file itself (external files are identified by name and size)."""
    file_bytes: int
    external_files: tuple[ExternalFile, ...]
    external_bytes: int
    """Bytes of weights held in external files (from dims × dtype)."""


def load_model(path: Path) -> LoadedModel:
    """Load ``path``; every failure is a ``ModelInvalidError`` naming the file and the cause."""
    try:
        st = path.stat()
    except OSError as exc:
        raise ModelInvalidError(f"cannot read model {path}: {exc.strerror or exc}") from None
    if not path.is_file():
        raise ModelInvalidError(f"model {path} is not a regular file")
    if st.st_size == 0:
        raise ModelInvalidError(f"model {path} is empty (0 bytes)")
    if st.st_size >= _MAX_MODEL_FILE:
        raise ModelInvalidError(
            f"model {path} is {st.st_size} bytes; ONNX protobuf files must be < 2 GiB",
            hint="save large weights as external data (onnx.save(..., save_as_external_data=True))",
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelInvalidError(f"cannot read model {path}: {exc.strerror or exc}") from None
    model = parse_model_bytes(data, str(path))
    files = check_external_data(model, path.parent)
    external_bytes = sum(
        tensor_nbytes(t)
        for _, t in all_tensors(model.graph)
        if t.data_location == onnx.TensorProto.EXTERNAL
    )
    return LoadedModel(
        path=path,
        model=model,
        sha256=hashlib.sha256(data).hexdigest(),
        file_bytes=len(data),
        external_files=files,
        external_bytes=external_bytes,
    )


def check_command(where: str) -> str:
    """A shell command that shows onnx's own verdict on the file (exit 1 and the reason when bad).

    ``python -m onnx.checker`` is not one: that module has no ``__main__`` and exits 0 on any file.
    """
    code = f"import onnx; onnx.checker.check_model({json.dumps(where)})"
    return f"`python3 -c {shlex.quote(code)}`"


def parse_model_bytes(data: bytes, where: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        cut = truncated_field(data)
        if cut is not None:
            raise ModelInvalidError(
                f"{where} looks incomplete: the file ends inside the model's {cut} field ({len(data)} bytes "
                "read); an interrupted copy or download leaves exactly this",
                hint=f"Copy the file again, whole. onnx's checker shows the same: {check_command(where)}",
            ) from None
        raise ModelInvalidError(
            f"{where} is not an ONNX model: the protobuf does not parse ({exc or 'corrupt'})",
            hint=f"onnx's checker shows the same: {check_command(where)}",
        ) from None
    if not model.HasField("graph") or model.ir_version <= 0 or not model.opset_import:
        raise ModelInvalidError(
            f"{where} is not an ONNX model: it parses, but has no graph, IR version or opset imports",
            hint=f"onnx's checker shows the same: {check_command(where)}",
        )
    check_nesting(model.graph, where)
    _check_text(model.graph, where)
    return model


_MODEL_FIELDS: dict[int, tuple[str, int]] = {
    1: ("ir_version", 0),
    2: ("producer_name", 2),
    3: ("producer_version", 2),
    4: ("domain", 2),
    5: ("model_version", 0),
    6: ("doc_string", 2),
    7: ("graph", 2),
    8: ("opset_import", 2),
    14: ("metadata_props", 2),
    20: ("training_info", 2),
    25: ("functions", 2),
}
"""``ModelProto`` fields by number: name and wire type (0 varint, 2 length-delimited)."""


def truncated_field(data: bytes) -> str | None:
    """The ``ModelProto`` field a prefix of a valid model ends in, else None.

    Walks the top-level wire format: every field before the last must be a ModelProto field with
    its own wire type, and the last must run past the end of the file (a length or a varint cut
    short). Random bytes fail the first test within a field or two; a truncated copy passes both.
    """
    pos, complete = 0, 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        if key is None:
            return "field key" if complete else None
        field = _MODEL_FIELDS.get(key >> 3)
        if field is None or field[1] != key & 7:
            return None
        if field[1] == 0:
            value, pos = _varint(data, pos)
            if value is None:
                return field[0] if complete else None
        else:
            length, pos = _varint(data, pos)
            if length is None or pos + length > len(data):
                return field[0] if complete else None
            pos += length
        complete += 1
    return None


def _varint(data: bytes, pos: int) -> tuple[int | None, int]:
    """Decode a protobuf varint at ``pos``: ``(value, next position)``, value None when cut short."""
    value = shift = 0
    while pos < len(data) and shift < 64:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    return None, pos


def _check_text(graph: onnx.GraphProto, where: str) -> None:
    """Protobuf hands back invalid UTF-8 in string fields as bytes; refuse it here, once."""
    names: list[object] = [graph.name]
    for value in (*graph.input, *graph.output, *graph.value_info):
        names.append(value.name)
    names.extend(t.name for t in graph.initializer)
    for node in graph.node:
        names.extend((node.name, node.op_type, node.domain, *node.input, *node.output))
        for attr in node.attribute:
            names.append(attr.name)
            if attr.type == onnx.AttributeProto.GRAPH:
                _check_text(attr.g, where)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    _check_text(sub, where)
    bad = next((n for n in names if not isinstance(n, str)), None)
    if bad is not None:
        raise ModelInvalidError(
            f"{where} is not a valid ONNX model: a name is not valid UTF-8 ({bad!r:.80})"
        )


def check_external_data(model: onnx.ModelProto, base: Path) -> tuple[ExternalFile, ...]:
    """Check every external reference stays inside ``base`` and the bytes are there.

    Only ``stat`` is used: nothing is read. Symlinks are resolved, so a link pointing out of the
    model folder is refused like an absolute path or a ``..`` would be.
    """
    root = Path(os.path.realpath(base))
    files: dict[str, tuple[int, int]] = {}
    for owner, tensor in all_tensors(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        location = info.get("location", "")
        name = tensor.name or owner
        if not location:
            raise ModelInvalidError(f"tensor {name!r} is marked external but has no location")
        _check_location(name, location, root)
        target = root / location
        try:
            st = target.stat()
        except OSError as exc:
            raise ModelInvalidError(
                f"external data of tensor {name!r} is missing: {location!r} ({exc.strerror or exc})",
                hint="move the model together with its data files (a folder job in the daemon)",
            ) from None
        if not target.is_file():
            raise ModelInvalidError(
                f"external data of tensor {name!r} ({location!r}) is not a regular file"
            )
        try:
            offset = int(info.get("offset", "0"))
            length = int(info["length"]) if "length" in info else None
        except ValueError:
            raise ModelInvalidError(
                f"tensor {name!r}: external offset/length are not integers"
            ) from None
        need = tensor_nbytes(tensor)
        if offset < 0 or (length is not None and length < 0):
            raise ModelInvalidError(f"tensor {name!r}: negative external offset or length")
        if length is not None and length < need:
            raise ModelInvalidError(
                f"tensor {name!r}: external length {length} is smaller than its {need} bytes (dims × dtype)"
            )
        end = offset + (length if length is not None else need)
        if end > st.st_size:
            raise ModelInvalidError(
                f"external data of tensor {name!r} is short: {location!r} has {st.st_size} bytes, "
                f"the tensor needs bytes {offset}..{end}; {_short_copy(model, root / location, st.st_size)}",
                hint="Copy the model and its data files again, whole (in the daemon: one folder job, moved in "
                "with one rename once the copy has finished).",
            )
        size, count = files.get(location, (st.st_size, 0))
        files[location] = (size, count + 1)
    return tuple(ExternalFile(loc, size, count) for loc, (size, count) in sorted(files.items()))


def _short_copy(model: onnx.ModelProto, target: Path, size: int) -> str:
    """Why a data file is short: a copy cut off (its tensors would end past it) or a mismatch."""
    target_s = os.path.normcase(os.path.realpath(target))
    declared = 0
    for _, tensor in all_tensors(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        if os.path.normcase(os.path.realpath(target.parent / info.get("location", ""))) != target_s:
            continue
        try:
            declared = max(
                declared,
                int(info.get("offset", "0")) + int(info.get("length", tensor_nbytes(tensor))),
            )
        except ValueError:
            continue
    share = size / declared if declared else 0.0
    return (
        f"the model's tensors declare {declared} bytes in it, {share:.0%} of which are there: "
        "the copy looks incomplete"
    )


def _check_location(name: str, location: str, root: Path) -> None:
    if "\0" in location:
        raise ModelInvalidError(
            f"tensor {name!r}: external data location {location!r} contains a NUL byte"
        )
    pure = PurePosixPath(location.replace("\\", "/"))
    if (
        pure.is_absolute()
        or location.startswith(("/", "\\"))
        or re.match(r"^[A-Za-z]:[\\/]", location)
    ):
        raise ModelInvalidError(
            f"tensor {name!r}: external data location {location!r} is absolute; it must be relative "
            "to the model's folder"
        )
    if ".." in pure.parts:
        raise ModelInvalidError(
            f"tensor {name!r}: external data location {location!r} contains '..'; it must stay inside "
            "the model's folder"
        )
    resolved = Path(os.path.realpath(root / location))
    if resolved != root and root not in resolved.parents:
        raise ModelInvalidError(
            f"tensor {name!r}: external data location {location!r} resolves to {resolved}, outside "
            f"the model's folder {root} (a symlink?)"
        )
