"""Read an ONNX model without its weights, and refuse external data that points anywhere unsafe.

Weights stay on disk, inline or external: the file is read once through a bounded buffer
(``graph.skim``), its large inline tensors becoming references to their place in it
(``graph.in_file``); external files are only ``stat``-ed; sizes come from dims × dtype. A 1.5 GB
inline export or a 6 GB external-data model plans in a few hundred MB of memory.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import onnx
from google.protobuf.message import DecodeError

from sharderd.errors import ModelInvalidError
from sharderd.graph.in_file import point_at
from sharderd.graph.nesting import check_nesting
from sharderd.graph.skim import Skimmed, skim_file
from sharderd.graph.tensors import all_tensors, tensor_nbytes
from sharderd.graph.validate import check_tensors_and_values
from sharderd.graph.wire import check_command, incomplete_error, truncated_field, unparsable_error

__all__ = [
    "ExternalFile",
    "LoadedModel",
    "check_command",
    "load_model",
    "parse_model_bytes",
    "read_structure",
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
    """The model proto; external tensors keep their references and large inline ones refer to
    their place in the file (``graph.in_file``): no weight bytes loaded."""
    sha256: str
    """Of the .onnx file itself (external files are identified by name and size)."""
    file_bytes: int
    external_files: tuple[ExternalFile, ...]
    external_bytes: int
    """Bytes of weights held in external files (from dims × dtype); inline ones are not counted."""


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
    skimmed = _skim(path, st.st_size)
    model = parse_model_bytes(skimmed.data, str(path))
    files = check_external_data(model, path.parent, model_file=path)
    external_bytes = sum(  # before the inline tensors left in the file become references
        tensor_nbytes(t)
        for _, t in all_tensors(model.graph)
        if t.data_location == onnx.TensorProto.EXTERNAL
    )
    _point_at_file(model, skimmed, path)
    check_tensors_and_values(model, str(path))
    return LoadedModel(
        path=path,
        model=model,
        sha256=skimmed.sha256,
        file_bytes=skimmed.size,
        external_files=files,
        external_bytes=external_bytes,
    )


def read_structure(path: Path) -> onnx.ModelProto:
    """A model file sharderd wrote, read as ``load_model`` reads one but without its checks: its
    large inline tensors stay in it (a written model is read back in the memory of its graph)."""
    skimmed = _skim(path, path.stat().st_size)
    model = parse_model_bytes(skimmed.data, str(path))
    _point_at_file(model, skimmed, path)
    return model


def _skim(path: Path, size: int) -> Skimmed:
    try:
        with open(path, "rb") as f:
            return skim_file(f, size, str(path))
    except OSError as exc:
        raise ModelInvalidError(f"cannot read model {path}: {exc.strerror or exc}") from None


def _point_at_file(model: onnx.ModelProto, skimmed: Skimmed, path: Path) -> None:
    source = str(path.absolute())
    for span in skimmed.spans:
        tensor = model.graph.initializer[span.index]
        point_at(tensor, source, span.offset, span.length, span.explicit_default)


def parse_model_bytes(data: bytes, where: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        cut = truncated_field(data)
        if cut is not None:
            raise incomplete_error(where, f"the model's {cut} field", len(data)) from None
        raise unparsable_error(where, str(exc) or "corrupt") from None
    if not model.HasField("graph") or model.ir_version <= 0 or not model.opset_import:
        raise ModelInvalidError(
            f"{where} is not an ONNX model: it parses, but has no graph, IR version or opset imports",
            hint=f"onnx's checker shows the same: {check_command(where)}",
        )
    check_nesting(model.graph, where)
    _check_text(model.graph, where)
    return model


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


def check_external_data(
    model: onnx.ModelProto, base: Path, *, model_file: Path | None = None
) -> tuple[ExternalFile, ...]:
    """Check every external reference stays inside ``base`` and the bytes are there.

    Only ``stat`` is used: nothing is read. Symlinks are resolved, so a link pointing out of the
    model folder is refused like an absolute path or a ``..`` would be; so is a reference into
    ``model_file`` itself (its offset would land inside the model's own fields).
    """
    root = Path(os.path.realpath(base))
    own = os.path.realpath(model_file) if model_file is not None else None
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
        if own is not None and os.path.realpath(target) == own:
            raise ModelInvalidError(
                f"tensor {name!r}: its external data location {location!r} is the model file itself; "
                "its offset would point inside the model's own fields, not at a data file",
                hint="save the model again with onnx.save(..., save_as_external_data=True)",
            )
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
