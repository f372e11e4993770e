"""Tensors whose type is not ONNX's or whose data disagrees with their dims, and values of an unknown
element type, are exit 2 naming them, before planning: through ``sharderd plan`` and
``sharderd.plan()`` alike (issue 40)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from corpus import HIDDEN, small_model
from onnx import TensorProto, helper, numpy_helper

import sharderd
from sharderd.cli import main as cli_main
from sharderd.errors import ModelInvalidError
from sharderd.report.build import _value_info

Edit = Callable[[onnx.ModelProto], None]


def _planned(tmp_path: Path, edit: Edit) -> tuple[int, str | None]:
    """``sharderd plan``'s exit code and ``sharderd.plan()``'s error (None when it planned)."""
    model = small_model()
    edit(model)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    code = cli_main(["plan", str(path), "--devices", "2", "--json"])
    try:
        sharderd.plan(path, devices=2)
    except ModelInvalidError as exc:
        return code, str(exc)
    return code, None


def _refused(tmp_path: Path, edit: Edit, *named: str) -> str:
    code, message = _planned(tmp_path, edit)
    assert code == 2 and message is not None
    for name in named:
        assert name in message, message
    return message


def _weight(model: onnx.ModelProto) -> TensorProto:
    return model.graph.initializer[0]  # W0, [HIDDEN, HIDDEN] float


# --- data types ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [0, -3, 999])
def test_an_initializer_of_an_unknown_data_type_is_refused(tmp_path: Path, dtype: int) -> None:
    def edit(model: onnx.ModelProto) -> None:
        _weight(model).data_type = dtype

    _refused(tmp_path, edit, "'W0'", "data type")


def test_a_constant_of_an_unknown_data_type_is_refused(tmp_path: Path) -> None:
    def edit(model: onnx.ModelProto) -> None:
        value = numpy_helper.from_array(np.ones(HIDDEN, np.float32), "bias")
        value.data_type = 999
        model.graph.node.insert(0, helper.make_node("Constant", [], ["b"], name="c", value=value))
        model.graph.node[-1].output[0] = "y0"
        model.graph.node.append(helper.make_node("Add", ["y0", "b"], ["y"], name="add"))

    _refused(tmp_path, edit, "'bias'", "999")


def test_a_sparse_initializer_of_an_unknown_data_type_is_refused(tmp_path: Path) -> None:
    def edit(model: onnx.ModelProto) -> None:
        values = numpy_helper.from_array(np.ones(2, np.float32), "S")
        values.data_type = 999
        indices = numpy_helper.from_array(np.array([0, 3], np.int64), "")
        model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [4]))

    _refused(tmp_path, edit, "'S'", "999")


def test_a_subgraph_initializer_of_an_unknown_data_type_is_refused(tmp_path: Path) -> None:
    def edit(model: onnx.ModelProto) -> None:
        bad = numpy_helper.from_array(np.ones(1, np.float32), "inner")
        bad.data_type = 999

        def branch(name: str) -> onnx.GraphProto:
            return helper.make_graph(
                [helper.make_node("Identity", ["inner"], [f"{name}_out"], name=f"{name}_id")],
                name,
                [],
                [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [1])],
                [bad],
            )

        cond = numpy_helper.from_array(np.array(True), "cond")
        model.graph.initializer.append(cond)
        model.graph.node.append(
            helper.make_node(
                "If", ["cond"], ["z"], name="if", then_branch=branch("a"), else_branch=branch("b")
            )
        )
        model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1]))

    _refused(tmp_path, edit, "'inner'", "999")


# --- dims against data -----------------------------------------------------------------------------


def test_raw_data_of_exactly_the_dims_plans(tmp_path: Path) -> None:
    """Just inside: the unedited model, raw_data of dims × dtype bytes, plans."""
    assert _planned(tmp_path, lambda model: None) == (0, None)


def test_one_extra_dim_is_refused(tmp_path: Path) -> None:
    """Dims [8, 8, 2] over the bytes of [8, 8]: the data holds half of what the dims say."""

    def edit(model: onnx.ModelProto) -> None:
        _weight(model).dims.append(2)

    message = _refused(tmp_path, edit, "'W0'", "raw_data holds 256 bytes", "512 bytes")
    assert "[8, 8, 2]" in message


def test_one_dim_too_few_is_refused(tmp_path: Path) -> None:
    def edit(model: onnx.ModelProto) -> None:
        del _weight(model).dims[-1]

    _refused(tmp_path, edit, "'W0'", "raw_data holds 256 bytes", "32 bytes")


def test_typed_values_one_short_or_one_over_are_refused(tmp_path: Path) -> None:
    for extra in (-1, 1):

        def edit(model: onnx.ModelProto, extra: int = extra) -> None:
            weight = _weight(model)
            values = np.frombuffer(weight.raw_data, np.float32).tolist()
            weight.ClearField("raw_data")
            weight.float_data.extend(values + [0.0] * extra if extra > 0 else values[:extra])

        _refused(tmp_path, edit, "'W0'", f"holds {HIDDEN * HIDDEN + extra} value(s) in float_data")


def test_typed_values_of_exactly_the_dims_plan(tmp_path: Path) -> None:
    def edit(model: onnx.ModelProto) -> None:
        weight = _weight(model)
        values = np.frombuffer(weight.raw_data, np.float32).tolist()
        weight.ClearField("raw_data")
        weight.float_data.extend(values)

    assert _planned(tmp_path, edit) == (0, None)


def test_values_in_another_types_field_are_refused(tmp_path: Path) -> None:
    def edit(model: onnx.ModelProto) -> None:
        weight = _weight(model)
        weight.ClearField("raw_data")
        weight.int64_data.extend([0] * HIDDEN * HIDDEN)

    _refused(tmp_path, edit, "'W0'", "int64_data", "float_data")


@pytest.mark.parametrize(("extra", "ok"), [(0, True), (4, False)])
def test_an_external_length_other_than_the_dims_is_refused(
    tmp_path: Path, extra: int, ok: bool
) -> None:
    """External data whose declared length is 4 bytes over dims × dtype is refused (under is
    refused by the loader already); exactly the dims' bytes plans."""

    def edit(model: onnx.ModelProto) -> None:
        weight = _weight(model)
        (tmp_path / "w.bin").write_bytes(weight.raw_data + bytes(extra))
        size = len(weight.raw_data) + extra
        weight.ClearField("raw_data")
        weight.data_location = TensorProto.EXTERNAL
        for key, value in (("location", "w.bin"), ("offset", "0"), ("length", str(size))):
            weight.external_data.add(key=key, value=value)

    if ok:
        assert _planned(tmp_path, edit) == (0, None)
    else:
        _refused(tmp_path, edit, "'W0'", "external length is 260", "256 bytes")


def test_a_tensor_without_data_is_sized_by_its_dims(tmp_path: Path) -> None:
    """A stub (no data field at all, as weight-stripping tools write) is not a disagreement."""

    def edit(model: onnx.ModelProto) -> None:
        _weight(model).ClearField("raw_data")

    assert _planned(tmp_path, edit) == (0, None)


# --- value types -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["graph output", "graph input", "value_info"])
def test_a_value_of_an_unknown_element_type_is_refused(tmp_path: Path, kind: str) -> None:
    def edit(model: onnx.ModelProto) -> None:
        if kind == "graph output":
            model.graph.output[0].type.tensor_type.elem_type = 999
        elif kind == "graph input":
            model.graph.input[0].type.tensor_type.elem_type = 999
        else:
            model.graph.value_info.append(
                helper.make_tensor_value_info("h0", 999, [1, HIDDEN])  # type: ignore[arg-type]
            )

    name = {"graph output": "'y'", "graph input": "'x'", "value_info": "'h0'"}[kind]
    _refused(tmp_path, edit, kind, name, "999")


def test_report_values_of_any_element_type_do_not_crash() -> None:
    """The report's value description copes with a type onnx does not name (written by hand)."""
    value = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    value.type.tensor_type.elem_type = 999
    assert _value_info(value)["dtype"] == "unknown (999)"
    value.type.tensor_type.elem_type = 0
    assert _value_info(value)["dtype"] == "unknown"
