"""Inline weights stay in the file: the loader reads the structure, large tensors become references
to their bytes (``graph.skim``, ``graph.in_file``), and writing the model back gives protobuf's own
bytes. Damaged files are refused naming the tensor, through ``sharderd plan`` and ``shard``."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from sharderd.cli import main as cli_main
from sharderd.errors import ModelInvalidError
from sharderd.graph.evaluate import VALUE_BYTES
from sharderd.graph.in_file import in_file, in_file_tensors
from sharderd.graph.load import load_model, read_structure
from sharderd.graph.skim import IN_FILE_MIN_BYTES
from sharderd.graph.wire import encode_varint
from sharderd.shard.write import write_model

REAL = sorted((Path(__file__).resolve().parents[1] / "data" / "models").glob("*/model.onnx"))


def _model(weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """x → MatMul by each weight in turn (square float32 weights of the given sizes)."""
    names = list(weights)
    nodes, current = [], "x"
    for i, name in enumerate(names):
        out = "y" if i == len(names) - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [current, name], [out], name=f"mm{i}"))
        current = out
    side = next(iter(weights.values())).shape[0]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, side])],
        [numpy_helper.from_array(w, n) for n, w in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _weights(side: int, count: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {f"W{k}": rng.standard_normal((side, side)).astype(np.float32) for k in range(count)}


def _save(tmp_path: Path, model: onnx.ModelProto, name: str = "m.onnx") -> Path:
    path = tmp_path / name
    path.write_bytes(model.SerializeToString())
    return path


def _rewrite_graph(model: onnx.ModelProto, edit: Callable[[bytes], bytes]) -> bytes:
    """The model's bytes with its graph field's body replaced by ``edit(body)``."""
    data = model.SerializeToString()
    size = model.graph.ByteSize()
    head = b"\x3a" + encode_varint(size)  # ModelProto.graph, length-delimited
    start = data.index(head) + len(head)
    body = edit(data[start : start + size])
    return (
        data[: data.index(head)] + b"\x3a" + encode_varint(len(body)) + body + data[start + size :]
    )


def _raw_field(data: bytes, tensor: onnx.TensorProto) -> tuple[int, int]:
    """(position of the raw_data length varint, data offset) of ``tensor`` in ``data``."""
    start = data.index(tensor.raw_data)
    prefix = b"\x4a" + encode_varint(len(tensor.raw_data))
    assert data[start - len(prefix) : start] == prefix
    return start - len(prefix) + 1, start


# --- what the loader holds ------------------------------------------------------------------------


def test_the_threshold_is_the_largest_value_the_engine_reads() -> None:
    """Tensors the constant evaluator may read (up to VALUE_BYTES) are never left in the file."""
    assert IN_FILE_MIN_BYTES == VALUE_BYTES


def test_tensors_over_the_threshold_refer_to_their_bytes_and_the_rest_stay_inline(
    tmp_path: Path,
) -> None:
    """1024 floats (4096 bytes, at the threshold) stay inline; 1025 become a reference whose
    offset and length are exactly the tensor's bytes in the file."""
    at = np.arange(1024, dtype=np.float32).reshape(32, 32)
    over = np.arange(1025, dtype=np.float32)
    model = _model({"W": np.eye(32, dtype=np.float32)})
    model.graph.initializer.extend(
        [numpy_helper.from_array(at, "at"), numpy_helper.from_array(over, "over")]
    )
    path = _save(tmp_path, model)
    loaded = load_model(path).model
    tensors = {t.name: t for t in loaded.graph.initializer}
    assert tensors["at"].raw_data == at.tobytes() and in_file(tensors["at"]) is None
    where = in_file(tensors["over"])
    assert where is not None and not tensors["over"].raw_data
    assert where.source == str(path.absolute()) and where.length == over.nbytes
    assert path.read_bytes()[where.offset : where.offset + where.length] == over.tobytes()


def test_the_file_is_hashed_whole(tmp_path: Path) -> None:
    """sha256 and size are of every byte of the file, the skipped weights included."""
    path = _save(tmp_path, _model(_weights(64, 3)))
    loaded = load_model(path)
    assert loaded.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert loaded.file_bytes == path.stat().st_size
    assert loaded.external_bytes == 0 and loaded.external_files == ()


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.parent.name)
def test_real_exports_are_written_back_byte_for_byte(path: Path, tmp_path: Path) -> None:
    """Loaded without its weights and written, each real export is protobuf's serialization of
    the whole model (the streamed bytes land exactly where SerializeToString puts them)."""
    loaded = load_model(path)
    out = tmp_path / "out.onnx"
    write_model(loaded.model, out)
    assert out.read_bytes() == onnx.load(str(path)).SerializeToString()


def test_an_explicit_default_data_location_is_written_again(tmp_path: Path) -> None:
    """A tensor whose data_location is written as DEFAULT (onnx writes it after loading external
    data) comes back with the field; one without it comes back without."""
    model = _model(_weights(64, 2))
    model.graph.initializer[0].data_location = TensorProto.DEFAULT
    path = _save(tmp_path, model)
    loaded = load_model(path).model
    assert len(list(in_file_tensors(loaded))) == 2
    out = tmp_path / "out.onnx"
    write_model(loaded, out)
    assert out.read_bytes() == path.read_bytes()
    written = onnx.load(str(out))
    assert [t.HasField("data_location") for t in written.graph.initializer] == [True, False]


def test_read_structure_reads_a_written_model_without_its_weights(tmp_path: Path) -> None:
    path = _save(tmp_path, _model(_weights(64, 2)))
    model = read_structure(path)
    assert [t.raw_data for t in model.graph.initializer] == [b"", b""]
    assert [n.name for n in model.graph.node] == ["mm0", "mm1"]


def test_a_tensor_with_its_data_twice_keeps_protobufs_reading(tmp_path: Path) -> None:
    """Two raw_data fields in one tensor (protobuf keeps the last) are not a plain inline tensor:
    the loader keeps both as they are, and the model is what protobuf reads."""
    model = _model(_weights(64, 1))
    tensor = model.graph.initializer[0]
    record = tensor.SerializeToString()
    second = bytes(reversed(tensor.raw_data))
    doubled = record + b"\x4a" + encode_varint(len(second)) + second
    field = b"\x2a" + encode_varint(len(record)) + record  # GraphProto.initializer
    rebuilt = _rewrite_graph(
        model, lambda body: body.replace(field, b"\x2a" + encode_varint(len(doubled)) + doubled)
    )
    path = tmp_path / "m.onnx"
    path.write_bytes(rebuilt)
    loaded = load_model(path).model
    assert in_file(loaded.graph.initializer[0]) is None
    assert loaded.graph.initializer[0].raw_data == second
    assert loaded == onnx.load(str(path))


# --- damaged files ---------------------------------------------------------------------------------


def _refused(path: Path, tmp_path: Path) -> str:
    """The loader's message; ``sharderd plan`` and ``sharderd shard`` exit 2 and write nothing."""
    with pytest.raises(ModelInvalidError) as info:
        load_model(path)
    assert cli_main(["plan", str(path), "--devices", "2", "--json"]) == 2
    out = tmp_path / "out"
    assert cli_main(["shard", str(path), "-n", "2", "-b", "none", "-q", "-o", str(out)]) == 2
    assert not out.exists()
    return str(info.value)


def test_a_file_cut_inside_a_tensors_data_names_the_tensor(tmp_path: Path) -> None:
    model = _model(_weights(64, 3))
    data = model.SerializeToString()
    _, start = _raw_field(data, model.graph.initializer[1])
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: start + 100])
    message = _refused(path, tmp_path)
    assert "looks incomplete" in message and "'W1'" in message and str(path) in message


def test_every_cut_of_a_model_with_large_weights_is_refused(tmp_path: Path) -> None:
    """Cut at any of a spread of offsets (inside weights, between them, in the nodes after), the
    file is refused naming it; a cut inside a weight's data names that weight."""
    model = _model(_weights(64, 2))
    data = model.SerializeToString()
    spans = {t.name: _raw_field(data, t)[1] for t in model.graph.initializer}
    path = tmp_path / "cut.onnx"
    for cut in range(1, len(data), 211):
        path.write_bytes(data[:cut])
        with pytest.raises(ModelInvalidError) as info:
            load_model(path)
        assert str(path) in str(info.value), cut
        inside = [n for n, s in spans.items() if s < cut < s + 64 * 64 * 4]
        if inside:
            assert f"{inside[0]!r}" in str(info.value), cut


def test_a_tensor_whose_bytes_run_past_the_end_of_the_file_is_refused(tmp_path: Path) -> None:
    """A raw_data length far past the end of the file (the records around it intact) is refused
    naming the tensor, not read."""
    model = _model(_weights(64, 2))
    data = bytearray(model.SerializeToString())
    length_at, _ = _raw_field(bytes(data), model.graph.initializer[0])
    width = len(encode_varint(64 * 64 * 4))
    data[length_at : length_at + width] = encode_varint(2**21 - 1)  # the same three bytes, 2 MiB
    path = tmp_path / "long.onnx"
    path.write_bytes(bytes(data))
    message = _refused(path, tmp_path)
    assert "'W0'" in message and "past the end of the file" in message


def test_a_tensor_whose_bytes_run_into_the_next_field_is_refused(tmp_path: Path) -> None:
    """A raw_data length that ends inside the fields after the tensor (an offset inside another
    field) is refused naming the tensor; one byte shorter than the record end still loads."""
    model = _model(_weights(64, 2))
    data = bytearray(model.SerializeToString())
    length_at, _ = _raw_field(bytes(data), model.graph.initializer[0])
    data[length_at : length_at + 3] = encode_varint(64 * 64 * 4 + 8)
    path = tmp_path / "overlap.onnx"
    path.write_bytes(bytes(data))
    message = _refused(path, tmp_path)
    assert "'W0'" in message and "into the fields after it" in message


def test_external_data_pointing_into_the_model_file_itself_is_refused(tmp_path: Path) -> None:
    """A tensor whose external data is the .onnx file itself would read the model's own fields as
    weights: refused naming the tensor."""
    model = _model(_weights(64, 2))
    tensor = model.graph.initializer[1]
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "m.onnx"), ("offset", "0"), ("length", str(64 * 64 * 4))):
        tensor.external_data.add(key=key, value=value)
    data = model.SerializeToString()
    path = tmp_path / "m.onnx"
    path.write_bytes(data + bytes(max(0, 64 * 64 * 4 - len(data))))  # long enough for the bytes
    message = _refused(path, tmp_path)
    assert "'W1'" in message and "the model file itself" in message


def test_a_group_in_the_graph_leaves_the_graph_to_protobuf(tmp_path: Path) -> None:
    """An unknown field written as a group (valid protobuf, never ONNX's) is kept as it is: the model
    is what protobuf reads, weights included."""
    model = _model(_weights(64, 1))
    group = encode_varint(99 << 3 | 3) + b"\x08\x05" + encode_varint(99 << 3 | 4)
    rebuilt = _rewrite_graph(model, lambda body: group + body)
    path = tmp_path / "group.onnx"
    path.write_bytes(rebuilt)
    loaded = load_model(path).model
    assert loaded.graph.initializer[0].raw_data == model.graph.initializer[0].raw_data


def test_examples_saved_inline_plan_as_before(model_path: Callable[..., Path]) -> None:
    """An example with weights over the threshold plans with every one of them a reference."""
    path = model_path("transformer", hidden=64, vocab=100)
    loaded = load_model(path)
    refs = list(in_file_tensors(loaded.model))
    assert refs and all(not t.raw_data for t, _ in refs)
    assert cli_main(["plan", str(path), "--devices", "2", "--json"]) == 0


# --- the skim agrees with protobuf -----------------------------------------------------------------

_DAMAGE = settings(max_examples=150, deadline=None, derandomize=True, database=None)
_SOURCE = _model(_weights(40, 2)).SerializeToString()  # two 6400-byte weights: both skimmed


def _protobufs_reading(data: bytes) -> onnx.ModelProto | None:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception:
        return None
    return model


@_DAMAGE
@given(
    cut=st.just(len(_SOURCE)) | st.integers(min_value=1, max_value=len(_SOURCE)),
    flips=st.lists(st.tuples(st.integers(0, len(_SOURCE) - 1), st.integers(1, 255)), max_size=3),
)
def test_a_damaged_file_loads_as_protobuf_reads_it_or_is_refused(
    tmp_path_factory: pytest.TempPathFactory, cut: int, flips: list[tuple[int, int]]
) -> None:
    """Cut and byte-flipped copies: the loader either refuses them (ModelInvalidError, never another
    exception) or holds what protobuf parses from the whole file, skimmed weights read back."""
    data = bytearray(_SOURCE[:cut])
    for at, xor in flips:
        if at < len(data):
            data[at] ^= xor
    path = tmp_path_factory.mktemp("damaged") / "m.onnx"
    path.write_bytes(bytes(data))
    try:
        loaded = load_model(path).model
    except ModelInvalidError:
        event("refused")
        return
    event(f"loaded, {len(list(in_file_tensors(loaded)))} weight(s) skimmed")
    for tensor, where in list(in_file_tensors(loaded)):
        tensor.raw_data = bytes(data[where.offset : where.offset + where.length])
        tensor.ClearField("data_location")
        if where.explicit_default:
            tensor.data_location = TensorProto.DEFAULT
        del tensor.external_data[:]
    assert loaded == _protobufs_reading(bytes(data))
