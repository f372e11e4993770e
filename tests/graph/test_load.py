"""Loading: every broken file is a ``ModelInvalidError`` naming the file (or tensor) and the cause;
external data is checked without reading it, and a > 2 GB model loads in little memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from sharderd import examples
from sharderd.errors import ModelInvalidError
from sharderd.graph.load import load_model

REPO = Path(__file__).resolve().parents[2]


def _load_error(path: Path) -> str:
    with pytest.raises(ModelInvalidError) as info:
        load_model(path)
    return str(info.value)


def _external_model(model_path: Callable[..., Path]) -> tuple[Path, onnx.ModelProto, str]:
    """A small model whose ``W_shared`` (and others) live in ``shared_weights.data``."""
    path = model_path("shared_weights", external_data=True, hidden=32)
    model = onnx.load(str(path), load_external_data=False)
    external = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert {t.name for t in external} >= {"W_shared"}
    return path, model, "W_shared"


def _set_location(path: Path, model: onnx.ModelProto, tensor: str, location: str) -> None:
    for t in model.graph.initializer:
        if t.name == tensor:
            for entry in t.external_data:
                if entry.key == "location":
                    entry.value = location
    path.write_bytes(model.SerializeToString())


# --- files that are not models --------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"\xff" * 64, id="ff-bytes"),
        pytest.param(bytes(range(256)) * 4, id="byte-ramp"),
        pytest.param(b"this is not an onnx model\n", id="text"),
        pytest.param(np.random.default_rng(7).bytes(4096), id="random"),
    ],
)
def test_corrupt_bytes_are_refused_naming_the_file(tmp_path: Path, content: bytes) -> None:
    """Garbage bytes give a ModelInvalidError that names the file and says it is not an ONNX model."""
    path = tmp_path / "garbage.onnx"
    path.write_bytes(content)
    message = _load_error(path)
    assert str(path) in message
    assert "not an ONNX model" in message


def test_empty_file_is_refused(tmp_path: Path) -> None:
    """A 0-byte file is reported as empty."""
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    message = _load_error(path)
    assert str(path) in message and "empty" in message


def test_every_truncation_of_a_model_is_refused(
    model_path: Callable[..., Path], tmp_path: Path
) -> None:
    """Cutting a valid model at any byte offset never loads: each prefix is an error naming the file."""
    data = model_path("shared_weights", layers=3, hidden=4).read_bytes()
    load_model(
        model_path("shared_weights", "whole.onnx", layers=3, hidden=4)
    )  # the whole file loads
    path = tmp_path / "cut.onnx"
    causes = set()
    for offset in range(1, len(data)):
        path.write_bytes(data[:offset])
        message = _load_error(path)
        assert str(path) in message, offset
        causes.add(
            "looks incomplete"
            if "looks incomplete" in message
            else "does not parse"
            if "does not parse" in message
            else "parses, but"
            if "parses, but" in message
            else message
        )
    # both kinds of damage occur: a cut inside a field (said to be an incomplete copy, issue 14.7;
    # "does not parse" only for a cut inside the first field), and a cut between whole fields
    assert causes <= {"looks incomplete", "does not parse", "parses, but"}
    assert {"looks incomplete", "parses, but"} <= causes


def test_truncation_just_before_the_opset_imports_is_refused(
    model_path: Callable[..., Path],
) -> None:
    """A file cut exactly after the graph parses cleanly but lacks opset imports: still refused."""
    path = model_path("shared_weights", layers=3, hidden=4)
    model = onnx.load(str(path))
    without = onnx.ModelProto()
    without.CopyFrom(model)
    del without.opset_import[:]
    prefix = without.SerializeToString()
    data = path.read_bytes()
    assert data.startswith(prefix) and len(prefix) < len(data)
    path.write_bytes(prefix)
    message = _load_error(path)
    assert str(path) in message and "opset" in message


def test_a_serialized_tensor_is_not_a_model(tmp_path: Path) -> None:
    """A valid protobuf of another type (a TensorProto) is refused as not an ONNX model."""
    path = tmp_path / "tensor.onnx"
    path.write_bytes(numpy_helper.from_array(np.ones((3, 4), np.float32), "W").SerializeToString())
    message = _load_error(path)
    assert str(path) in message and "not an ONNX model" in message


def test_a_serialized_graph_is_not_a_model(tmp_path: Path) -> None:
    """A GraphProto parses as a ModelProto with no graph field; it is refused."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="r")],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
    )
    path = tmp_path / "graph.onnx"
    path.write_bytes(graph.SerializeToString())
    message = _load_error(path)
    assert str(path) in message and "not an ONNX model" in message


def test_missing_file_is_refused_with_the_os_reason(tmp_path: Path) -> None:
    """A path that does not exist names the file and says why it cannot be read."""
    path = tmp_path / "nowhere" / "model.onnx"
    message = _load_error(path)
    assert str(path) in message and "No such file" in message


def test_a_directory_is_not_a_model(tmp_path: Path) -> None:
    """A folder given as the model is refused as not a regular file."""
    message = _load_error(tmp_path)
    assert str(tmp_path) in message and "not a regular file" in message


def test_protobuf_file_over_2_gib_is_refused_without_reading(tmp_path: Path) -> None:
    """A .onnx of 2 GiB or more (sparse here) is refused with the external-data hint, not parsed."""
    path = tmp_path / "huge.onnx"
    with open(path, "wb") as f:
        os.truncate(f.fileno(), 2**31 + 1)
    message = _load_error(path)
    assert str(path) in message and "2 GiB" in message and "external" in message


# --- external data ----------------------------------------------------------------------------------


def test_external_data_model_loads_without_weight_bytes(model_path: Callable[..., Path]) -> None:
    """A model with external weights loads: the proto holds references only, sizes come from dims."""
    path, _, _ = _external_model(model_path)
    loaded = load_model(path)
    external = [
        t for t in loaded.model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
    ]
    assert external and all(not t.raw_data for t in external)
    assert loaded.external_bytes == sum(int(np.prod(t.dims)) * 4 for t in external)
    data = path.with_name("shared_weights.data")
    assert [(f.location, f.size, f.tensors) for f in loaded.external_files] == [
        ("shared_weights.data", data.stat().st_size, len(external))
    ]


def test_absolute_external_location_is_refused_naming_the_tensor(
    model_path: Callable[..., Path],
) -> None:
    """An absolute location is refused even when the file exists; the error names the tensor."""
    path, model, tensor = _external_model(model_path)
    _set_location(path, model, tensor, str(path.with_name("shared_weights.data")))
    message = _load_error(path)
    assert repr(tensor) in message and "absolute" in message


def test_dotdot_external_location_is_refused_naming_the_tensor(
    model_path: Callable[..., Path],
) -> None:
    """A location with '..' is refused even when it points at a real file; the error names the tensor."""
    path, model, tensor = _external_model(model_path)
    outside = path.parent.parent / "stolen.data"
    outside.write_bytes(path.with_name("shared_weights.data").read_bytes())
    _set_location(path, model, tensor, "../stolen.data")
    message = _load_error(path)
    assert repr(tensor) in message and "'..'" in message


def test_symlink_out_of_the_model_folder_is_refused(model_path: Callable[..., Path]) -> None:
    """A relative location that is a symlink resolving outside the folder is refused, naming the tensor."""
    path, model, tensor = _external_model(model_path)
    outside = path.parent.parent / "elsewhere.data"
    outside.write_bytes(path.with_name("shared_weights.data").read_bytes())
    (path.parent / "link.data").symlink_to(outside)
    _set_location(path, model, tensor, "link.data")
    message = _load_error(path)
    assert repr(tensor) in message and "outside" in message


def test_symlink_inside_the_model_folder_is_accepted(model_path: Callable[..., Path]) -> None:
    """The symlink rule is about where a link resolves: a link to a file in the folder is fine."""
    path, model, tensor = _external_model(model_path)
    (path.parent / "sub").mkdir()
    (path.parent / "sub" / "alias.data").symlink_to(path.with_name("shared_weights.data"))
    _set_location(path, model, tensor, "sub/alias.data")
    loaded = load_model(path)
    assert {f.location for f in loaded.external_files} == {"shared_weights.data", "sub/alias.data"}


def test_missing_external_file_is_refused_naming_the_tensor(
    model_path: Callable[..., Path],
) -> None:
    """A data file that is not there is an error naming a tensor that needs it and the location."""
    path, model, _ = _external_model(model_path)
    path.with_name("shared_weights.data").unlink()
    message = _load_error(path)
    names = [
        t.name for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
    ]
    assert "missing" in message and "shared_weights.data" in message
    assert any(repr(name) in message for name in names)


def test_short_external_file_is_refused_naming_the_tensor(model_path: Callable[..., Path]) -> None:
    """A data file cut short is an error naming the tensor whose bytes are beyond its end."""
    path, model, _ = _external_model(model_path)
    external = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    last = max(external, key=lambda t: int({e.key: e.value for e in t.external_data}["offset"]))
    data = path.with_name("shared_weights.data")
    os.truncate(data, data.stat().st_size - 1)
    message = _load_error(path)
    assert repr(last.name) in message and "short" in message


def test_external_length_smaller_than_dims_is_refused(model_path: Callable[..., Path]) -> None:
    """An external ``length`` below dims × dtype is an error naming the tensor."""
    path, model, tensor = _external_model(model_path)
    for t in model.graph.initializer:
        if t.name == tensor:
            for entry in t.external_data:
                if entry.key == "length":
                    entry.value = "8"
    path.write_bytes(model.SerializeToString())
    message = _load_error(path)
    assert repr(tensor) in message and "smaller" in message


# --- a model over 2 GB -----------------------------------------------------------------------------

_BIG_SCRIPT = textwrap.dedent(
    """
    import json, resource, sys
    from pathlib import Path
    from sharderd.config import PlanConfig
    from sharderd.engine import analyze_file, make_plan
    from sharderd.graph.load import load_model
    from sharderd.target import BUILTIN_TARGETS

    path = Path(sys.argv[1])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    loaded = load_model(path)
    analysis = analyze_file(path, PlanConfig())
    plan = make_plan(analysis, BUILTIN_TARGETS["ipu-mk2"], 4, PlanConfig())
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({
        "growth_kib": after - before,
        "external_bytes": loaded.external_bytes,
        "files": [[f.location, f.size, f.tensors] for f in loaded.external_files],
        "weights": analysis.total_weight_bytes,
        "stage_weights": [s.weight_bytes for s in plan.stages],
    }))
    """
)


def test_model_over_2_gb_loads_and_plans_without_reading_weights(tmp_path: Path) -> None:
    """A 2.5 GB external-data model (sparse) loads, analyses and plans with < 200 MB peak RSS growth."""
    path = examples.large_external_model(tmp_path / "big.onnx", total_bytes=2_500_000_000)
    data = path.with_name("big.data")
    assert data.stat().st_size >= 2_500_000_000
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _BIG_SCRIPT, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout)
    assert facts["external_bytes"] >= 2_500_000_000
    assert facts["weights"] == facts["external_bytes"]
    assert facts["files"] == [["big.data", data.stat().st_size, 8]]
    assert facts["growth_kib"] < 200 * 1024, f"peak RSS grew by {facts['growth_kib']} KiB"
    assert (
        sum(facts["stage_weights"]) == facts["external_bytes"]
    )  # no weight is shared: each counted once
    assert all(w > 0 for w in facts["stage_weights"])


def test_external_location_with_a_nul_byte_is_refused(model_path: Callable[..., Path]) -> None:
    """A location with an embedded NUL byte is refused as a ModelInvalidError naming the tensor."""
    path, model, tensor = _external_model(model_path)
    _set_location(path, model, tensor, "shared_weights\x00.data")
    message = _load_error(path)
    assert repr(tensor) in message


def test_bad_location_inside_an_if_branch_names_that_tensor(
    model_path: Callable[..., Path],
) -> None:
    """External weights inside If branches are checked too; the error names the branch's tensor."""
    path = model_path("with_if", external_data=True)
    model = onnx.load(str(path), load_external_data=False)
    if_node = next(n for n in model.graph.node if n.op_type == "If")
    branch = next(a.g for a in if_node.attribute if a.name == "else_branch")
    tensor = branch.initializer[0]
    assert tensor.data_location == onnx.TensorProto.EXTERNAL
    for entry in tensor.external_data:
        if entry.key == "location":
            entry.value = "../escape.data"
    path.write_bytes(model.SerializeToString())
    message = _load_error(path)
    assert repr(tensor.name) in message and "'..'" in message
