"""Fuzzing the loader, the engine and the config/sidecar parsers: bad input is a SharderdError, never
a crash.

Bytes (random, or a valid model with bit flips, truncations and splices) and random graphs built
field by field go through ``parse_model_bytes`` → ``check_external_data`` → ``analyze`` →
``plan_stages`` in-process; random TOML-ish text goes through ``load_sidecar`` and random tables
through ``config_from_dict``. The only exceptions allowed are ``SharderdError`` (``ConfigError`` for
configs); anything else is a bug, and hypothesis shrinks it to a minimal example.

Bounded for CI: ``max_examples`` per test comes from ``FUZZ_EXAMPLES`` (default 200, the whole file
in under 10 s). Full size, about 15 minutes on 2 cores:

    FUZZ_EXAMPLES=20000 python -m pytest tests/test_fuzz.py -p no:cacheprovider

Bugs found and not yet fixed are listed in ``KNOWN_BUGS`` (tolerated by the properties so the
fuzzer keeps looking for new ones) and each has a strict-xfail test with its minimal example, which
starts failing, as a reminder to drop the entry, the day the bug is fixed.
"""

from __future__ import annotations

import math
import os
import re
import resource
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest
from corpus import small_model, small_model_bytes
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from sharderd.config import DaemonConfig, PlanConfig, config_from_dict
from sharderd.daemon.sidecar import load_sidecar
from sharderd.errors import ConfigError, ModelInvalidError, SharderdError
from sharderd.graph.analyze import analyze
from sharderd.graph.load import LoadedModel, check_external_data, parse_model_bytes
from sharderd.plan.planner import plan_stages
from sharderd.target import BUILTIN_TARGETS

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=EXAMPLES <= 200,  # CI runs are deterministic; long runs explore new seeds
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)
TARGET = BUILTIN_TARGETS["ipu-mk2"]
VALID = small_model_bytes()

KNOWN_BUGS: frozenset[tuple[type[BaseException], str | None]] = frozenset()
"""(exception type, ``module.function`` of the innermost sharderd frame, None: anywhere) of reported
bugs. Two more are recognised by their input rather than where they surface: invalid UTF-8 in a
string field (``_invalid_utf8``), and onnx's data propagation sizing memory by a 1-D dim (the
address-space limit below turns it into a "shape inference failed" warning, counted as an event)."""


def _known(exc: BaseException) -> bool:
    """Whether ``exc`` is a reported bug: matched by where in sharderd it was raised, not by text."""
    where = None
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        module = frame.f_globals.get("__name__", "")
        if module.startswith("sharderd."):
            where = f"{module}.{frame.f_code.co_name}"
    return any(isinstance(exc, kind) and place in (None, where) for kind, place in KNOWN_BUGS)


def _invalid_utf8(message: Message) -> str | None:
    """The first string field holding invalid UTF-8: protobuf parses it and hands back ``bytes``
    (assigning it elsewhere raises ``UnicodeDecodeError``), so it breaks whatever reads it first."""
    for field, value in message.ListFields():
        values = value if field.is_repeated else [value]
        for item in values:
            if field.type == FieldDescriptor.TYPE_STRING and isinstance(item, bytes):
                return field.full_name
            if field.type == FieldDescriptor.TYPE_MESSAGE and (found := _invalid_utf8(item)):
                return found
    return None


def run_engine(data: bytes, base: Path, *, devices: int = 2, name_nodes: bool = False) -> None:
    """Everything the daemon does with a dropped file before compiling, without the file.

    Records how far each example got (``--hypothesis-show-statistics``), to keep the strategies
    honest: examples that all die in the parser would test nothing else.
    """
    stage = "parse"
    try:
        model = parse_model_bytes(data, "fuzz.onnx")
        stage = "external data"
        files = check_external_data(model, base)
        stage = "analyze"
        loaded = LoadedModel(Path("fuzz.onnx"), model, "", len(data), files, 0)
        analysis = analyze(loaded, PlanConfig(name_nodes=name_nodes))
        if any("bad_alloc" in warning for warning in analysis.warnings):
            event("known bug: shape inference ran out of memory")
        stage = "plan"
        plan_stages(analysis, TARGET, devices, safety_margin=1.15)
        stage = "planned"
    except SharderdError as err:
        assert str(err).strip(), "an error needs a message"
    except Exception as exc:
        if not _known(exc):
            raise
        stage = f"known bug in {stage}"
    event(f"stopped at: {stage}")


ADDRESS_SPACE_HEADROOM = 3 * 1024**3


@pytest.fixture(scope="module", autouse=True)
def bounded_memory() -> Iterator[None]:
    """Cap this process's address space while fuzzing: a generated model that makes something
    allocate by its declared dims must fail here, not get the host's OOM killer to pick a victim."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    size = (
        int(
            re.search(r"^VmSize:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)[
                1
            ]
        )
        * 1024
    )
    cap = size + ADDRESS_SPACE_HEADROOM
    resource.setrlimit(
        resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard)
    )
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty model folder: every external reference must be found missing, never read elsewhere."""
    return tmp_path_factory.mktemp("fuzz-model-folder")


# --- bytes ----------------------------------------------------------------------------------------


def _flip(data: bytes, position: int, bit: int) -> bytes:
    if not data:
        return data
    i = position % len(data)
    return data[:i] + bytes([data[i] ^ (1 << bit)]) + data[i + 1 :]


def _truncate(data: bytes, position: int) -> bytes:
    return data[: position % (len(data) + 1)]


def _splice(data: bytes, position: int, start: int, length: int) -> bytes:
    """Insert a slice of the valid model (a real field, so the result often still parses)."""
    i = position % (len(data) + 1)
    j = start % len(VALID)
    return data[:i] + VALID[j : j + length] + data[i:]


def _overwrite(data: bytes, position: int, chunk: bytes) -> bytes:
    i = position % (len(data) + 1)
    return data[:i] + chunk + data[i + len(chunk) :]


_position = st.integers(min_value=0, max_value=len(VALID) * 2)
_mutation = st.one_of(
    st.tuples(st.just("flip"), _position, st.integers(min_value=0, max_value=7)),
    st.tuples(st.just("truncate"), _position),
    st.tuples(st.just("splice"), _position, _position, st.integers(min_value=1, max_value=64)),
    st.tuples(st.just("overwrite"), _position, st.binary(min_size=1, max_size=8)),
)
_APPLY = {"flip": _flip, "truncate": _truncate, "splice": _splice, "overwrite": _overwrite}


@FUZZ
@given(data=st.binary(max_size=4096))
def test_random_bytes_are_refused_cleanly(base: Path, data: bytes) -> None:
    """Random bytes are a ModelInvalidError (or, rarely, a model the engine handles), never a crash."""
    run_engine(data, base)


@FUZZ
@given(mutations=st.lists(_mutation, min_size=1, max_size=6), name_nodes=st.booleans())
def test_mutated_models_fail_only_with_sharderd_errors(
    base: Path, mutations: list[tuple[Any, ...]], name_nodes: bool
) -> None:
    """Bit flips, truncations, splices and overwrites of a valid model never crash the engine."""
    data = VALID
    for op, *args in mutations:
        data = _APPLY[op](data, *args)
    run_engine(data, base, name_nodes=name_nodes)


# --- graphs built field by field ------------------------------------------------------------------

_NAMES = st.sampled_from(["x", "y", "W0", "W1", "h0", "h1", "h2", "t", "", "ghost", "x "])
_DIMS = st.lists(
    st.one_of(
        st.integers(min_value=-2, max_value=4),
        st.sampled_from([2**31, 2**40, 2**62, 2**63 - 1, -(2**63)]),
    ),
    max_size=3,
)
_DTYPES = st.sampled_from(
    [TensorProto.FLOAT, TensorProto.INT64, TensorProto.FLOAT16, TensorProto.UINT4, 0, 99]
)
_OPS = st.sampled_from(
    [
        "Relu",
        "Add",
        "MatMul",
        "Gemm",
        "Conv",
        "Reshape",
        "Concat",
        "Softmax",
        "Transpose",
        "Split",
        "Gather",
        "LayerNormalization",
        "Constant",
        "Loop",
        "If",
        "Scan",
        "Mystery",
    ]
)


def _mostly(draw: st.DrawFn, chaos: int, good: Any, bad: st.SearchStrategy[Any]) -> Any:
    """``good``, or with probability ``chaos``/16 something broken.

    One ``chaos`` level per graph: with a broken choice at every field almost no graph would get
    past validation to the costing and the planner.
    """
    return draw(bad) if draw(st.integers(min_value=0, max_value=15)) < chaos else good


@st.composite
def _tensors(draw: st.DrawFn, name: str, chaos: int) -> TensorProto:
    """A well-formed float tensor, or (chaos) any dims, dtype and payload, external included."""
    if not draw(st.integers(min_value=0, max_value=15)) < chaos:
        dims = draw(st.lists(st.integers(min_value=1, max_value=4), min_size=0, max_size=2))
        count = math.prod(dims)
        return TensorProto(
            name=name, dims=dims, data_type=TensorProto.FLOAT, raw_data=bytes(4 * count)
        )
    tensor = TensorProto(name=name, dims=draw(_DIMS), data_type=draw(_DTYPES))
    payload = draw(st.sampled_from(["none", "raw", "ints", "floats", "external"]))
    if payload == "raw":
        tensor.raw_data = draw(st.binary(max_size=64))
    elif payload == "ints":
        tensor.int64_data.extend(draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4)))
    elif payload == "floats":
        tensor.float_data.extend(draw(st.lists(st.floats(width=32), max_size=4)))
    elif payload == "external":
        tensor.data_location = TensorProto.EXTERNAL
        for key in draw(
            st.lists(st.sampled_from(["location", "offset", "length", "checksum"]), max_size=3)
        ):
            value = draw(
                st.sampled_from(["w.bin", "", "../w.bin", "/etc/passwd", "-1", "12", "x", "\0"])
            )
            tensor.external_data.add(key=key, value=value)
    return tensor


def _body(kind: str) -> onnx.GraphProto:
    """A minimal body: Loop/Scan carry one value through a Relu, If branches read ``x`` from outside."""
    if kind == "If":
        nodes = [helper.make_node("Relu", ["x"], ["b_out"], name="branch_relu")]
        return helper.make_graph(
            nodes, "branch", [], [helper.make_tensor_value_info("b_out", TensorProto.FLOAT, None)]
        )
    nodes = [helper.make_node("Relu", ["carry"], ["carry_out"], name="body_relu")]
    inputs = [helper.make_tensor_value_info("carry", TensorProto.FLOAT, None)]
    if kind == "Loop":
        inputs = [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            *inputs,
        ]
        nodes.append(helper.make_node("Identity", ["cond"], ["cond_out"], name="body_cond"))
        outputs = ["cond_out", "carry_out"]
    else:
        outputs = ["carry_out"]
    return helper.make_graph(
        nodes,
        "body",
        inputs,
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
    )


@st.composite
def _nodes(draw: st.DrawFn, index: int, available: list[str], chaos: int) -> onnx.NodeProto:
    op = draw(_OPS)
    arity = draw(st.integers(min_value=1, max_value=3))
    inputs = [_mostly(draw, chaos, draw(st.sampled_from(available)), _NAMES) for _ in range(arity)]
    outputs = [
        _mostly(
            draw, chaos, f"h{index}", st.sampled_from([f"h{index - 1}", "y", "t", "", "x", "W0"])
        )
    ]
    name = _mostly(draw, chaos, f"n{index}", st.sampled_from(["", "n0", f"n{index - 1}"]))
    node = helper.make_node(
        op, inputs, outputs, name=name, domain="com.example" if op == "Mystery" else ""
    )
    if op in ("Loop", "If", "Scan"):
        attr = "then_branch" if op == "If" else "body"
        node.attribute.append(helper.make_attribute(attr, _body(op)))
        if op == "If":
            node.attribute.append(helper.make_attribute("else_branch", _body(op)))
        if op == "Scan":
            node.attribute.append(
                helper.make_attribute("num_scan_inputs", draw(st.integers(-1, 2)))
            )
    elif op == "Constant":
        node.ClearField("input")
        node.attribute.append(
            helper.make_attribute("value", draw(_tensors(f"const{index}", chaos)))
        )
    elif draw(st.booleans()):
        attr_name = draw(
            st.sampled_from(["axis", "perm", "shape", "group", "transA", "kernel_shape"])
        )
        value = draw(
            st.one_of(st.integers(-3, 3), st.lists(st.integers(-3, 3), min_size=1, max_size=3))
        )
        node.attribute.append(helper.make_attribute(attr_name, value))
    return node


_INPUT_DIMS = st.lists(
    st.one_of(st.integers(min_value=-1, max_value=4), st.sampled_from(["batch", "seq", "", 2**40])),
    max_size=3,
)
_OPSETS = st.dictionaries(
    st.sampled_from(["", "ai.onnx", "com.example", "ai.onnx.ml"]),
    st.sampled_from([1, 3, 7, 13, 17, 99]),
    min_size=1,
    max_size=2,
)


@st.composite
def _models(draw: st.DrawFn) -> onnx.ModelProto:
    chaos = draw(st.integers(min_value=0, max_value=3))
    names = draw(st.lists(st.sampled_from(["W0", "W1", "t"]), max_size=3, unique=chaos == 0))
    initializers = [draw(_tensors(name, chaos)) for name in names]
    input_names = _mostly(
        draw, chaos, ["x"], st.lists(st.sampled_from(["x", "W0", "t"]), max_size=2)
    )
    inputs = [
        helper.make_tensor_value_info(
            name,
            _mostly(draw, chaos, TensorProto.FLOAT, _DTYPES),
            _mostly(
                draw,
                chaos,
                draw(st.sampled_from([[1, 4], ["batch", 4], [2, 2, 4]])),
                st.one_of(_INPUT_DIMS, st.none()),
            ),
        )
        for name in input_names
    ]
    available = [*(i.name for i in inputs), *(t.name for t in initializers)] or ["x"]
    nodes = []
    for i in range(draw(st.integers(min_value=1, max_value=6))):
        nodes.append(draw(_nodes(i, available, chaos)))
        available.extend(o for o in nodes[-1].output if o)
    last = nodes[-1].output[0] if nodes[-1].output else "y"
    outputs = [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
        for name in _mostly(draw, chaos, [last], st.lists(_NAMES, max_size=2))
    ]
    opsets = _mostly(draw, chaos, {"": 17, "com.example": 1}, _OPSETS)
    return small_model(
        nodes=nodes, initializers=initializers, inputs=inputs, outputs=outputs, opsets=opsets
    )


@FUZZ
@given(model=_models(), devices=st.integers(min_value=1, max_value=3), name_nodes=st.booleans())
def test_random_graphs_fail_only_with_sharderd_errors(
    base: Path, model: onnx.ModelProto, devices: int, name_nodes: bool
) -> None:
    """Graphs with any mix of broken names, dims, dtypes, opsets, bodies and external data never crash."""
    run_engine(model.SerializeToString(), base, devices=devices, name_nodes=name_nodes)


# --- sidecars and configs -------------------------------------------------------------------------

_KEYS = st.sampled_from(
    [
        "devices",
        "target",
        "backend",
        "optimal_perf",
        "priority",
        "max_attempts",
        "gpus",
        "",
        "a.b",
        '"q"',
    ]
)
_TOML_VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(
        [
            "0",
            "1",
            "10000",
            "1e9",
            "inf",
            "nan",
            "true",
            "false",
            '"ipu-mk2"',
            '"poprt"',
            '""',
            "[1, 2]",
            "{ a = 1 }",
            "1979-05-27",
            "0o777",
            "0x10",
            "'''x'''",
            "[",
            "{",
            "[[[[[[1]]]]]]",
        ]
    ),
    st.text(max_size=12).map(repr),
    st.integers(min_value=1, max_value=3000).map(lambda n: "[" * n + "]" * n),
    st.integers(min_value=1, max_value=3000).map(lambda n: "{ a = " * n + "1" + " }" * n),
)
_toml_text = st.lists(
    st.one_of(
        st.tuples(_KEYS, _TOML_VALUES).map(lambda kv: f"{kv[0]} = {kv[1]}"),
        st.sampled_from(["[table]", "[[array]]", "# comment", "", "devices", "= 2", "\\", "\t"]),
        st.text(max_size=20),
    ),
    max_size=8,
).map("\n".join)


@FUZZ
@given(text=st.one_of(_toml_text, st.text(max_size=200)))
def test_sidecar_text_fails_only_with_config_errors(base: Path, text: str) -> None:
    """Any text in a sidecar gives job options or a ConfigError naming the sidecar, never a crash."""
    path = base.with_name("job.toml")
    path.write_text(text, encoding="utf-8")
    try:
        options = load_sidecar(path, DaemonConfig(), known_targets=BUILTIN_TARGETS)
    except ConfigError as err:
        assert "sidecar job.toml" in str(err)
    except Exception as exc:
        if not _known(exc):
            raise
    else:
        assert 1 <= options.devices <= 1024


_SECTION_KEYS = {
    "plan": ["batch_size", "dims", "safety_margin", "name_nodes", "cost_model", "nope"],
    "search": ["backend", "max_attempts", "parallel", "attempt_timeout", "amp_fallbacks", "nope"],
    "daemon": ["inbox", "devices", "target", "file_mode", "watch_mode", "runtime_dir", "nope"],
    "poprt": ["num_io_tiles", "available_memory_proportion", "partials_type"],
    "onnxruntime": ["providers", "rtol", "seed"],
    "target": ["name", "nope"],
}
_TARGET_KEYS = ["base", "tiles", "bytes_per_tile", "memory_bytes", "peak_flops", "name", "nope"]
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**65), max_value=2**65),
    st.floats(),
    st.text(max_size=8),
    st.sampled_from(["ipu-mk2", "auto", "half", "/tmp/x", "cpu"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def _config_dicts(draw: st.DrawFn) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for section in draw(
        st.lists(st.sampled_from([*_SECTION_KEYS, "targets", "bogus"]), max_size=3)
    ):
        if section == "targets":
            data[section] = {
                name: draw(
                    st.one_of(
                        _values, st.dictionaries(st.sampled_from(_TARGET_KEYS), _values, max_size=4)
                    )
                )
                for name in draw(st.lists(st.sampled_from(["t", "ipu-mk2", ""]), max_size=2))
            }
        elif section == "bogus":
            data[section] = draw(_values)
        else:
            data[section] = draw(
                st.one_of(
                    _values,
                    st.dictionaries(st.sampled_from(_SECTION_KEYS[section]), _values, max_size=4),
                )
            )
    return data


@FUZZ
@given(data=_config_dicts())
def test_config_tables_fail_only_with_config_errors(data: dict[str, Any]) -> None:
    """Any table of any values is a Config or a ConfigError, never a crash."""
    try:
        config_from_dict(data, "fuzz.toml")
    except ConfigError as err:
        assert str(err).strip()
    except Exception as exc:
        if not _known(exc):
            raise


def test_the_seed_model_is_valid(base: Path) -> None:
    """The mutation seed plans, so mutations start from a model that reaches the planner."""
    model = parse_model_bytes(VALID, "seed.onnx")
    loaded = LoadedModel(
        Path("seed.onnx"), model, "", len(VALID), check_external_data(model, base), 0
    )
    plan = plan_stages(analyze(loaded, PlanConfig()), TARGET, 2, safety_margin=1.15)
    assert plan.devices == 2
    assert sorted(plan.assignment.tolist()) in ([0, 0, 1], [0, 1, 1])


# --- the bugs found, minimal examples -------------------------------------------------------------


def _engine_crash(model: onnx.ModelProto | bytes, base: Path) -> BaseException | None:
    """What ``run_engine`` would raise for ``model`` with no bug tolerated (None: nothing)."""
    data = model if isinstance(model, bytes) else model.SerializeToString()
    try:
        parsed = parse_model_bytes(data, "bug.onnx")
        loaded = LoadedModel(
            Path("bug.onnx"), parsed, "", len(data), check_external_data(parsed, base), 0
        )
        plan_stages(analyze(loaded, PlanConfig()), TARGET, 2, safety_margin=1.15)
    except SharderdError:
        return None
    except Exception as exc:
        return exc
    return None


def _with_constant(dims: list[int]) -> onnx.ModelProto:
    const = helper.make_node(
        "Constant",
        [],
        ["c"],
        name="const",
        value=TensorProto(name="c", dims=dims, data_type=TensorProto.FLOAT),
    )
    nodes = [
        const,
        helper.make_node("MatMul", ["x", "W0"], ["h0"], name="mm0"),
        helper.make_node("Add", ["h0", "c"], ["h1"], name="add_c"),
        helper.make_node("MatMul", ["h1", "W1"], ["y"], name="mm1"),
    ]
    return small_model(nodes=nodes)


def _with_int64_scalar(**data: Any) -> onnx.ModelProto:
    model = small_model()
    model.graph.initializer.append(
        TensorProto(name="M", dims=[], data_type=TensorProto.INT64, **data)
    )
    return model


@pytest.mark.parametrize("data", [{}, {"raw_data": b"abc"}], ids=["no-data", "3-raw-bytes"])
def test_int64_scalar_without_valid_data_is_not_a_crash(base: Path, data: dict[str, Any]) -> None:
    """An unused INT64 scalar initializer holding 0 (or 3) bytes is refused or ignored, not a crash."""
    assert _engine_crash(_with_int64_scalar(**data), base) is None


@pytest.mark.parametrize("dims", [[-(2**63)], [-1000000]], ids=["min-int64", "minus-a-million"])
def test_constant_with_negative_dims_is_not_a_crash(base: Path, dims: list[int]) -> None:
    """A Constant tensor with a negative dim is a ModelInvalidError, not a crash."""
    assert _engine_crash(_with_constant(dims), base) is None


def test_deeply_nested_sidecar_is_a_config_error(base: Path) -> None:
    """A sidecar nesting arrays 1000 deep is a ConfigError naming the sidecar."""
    path = base.with_name("deep.toml")
    path.write_text("devices = " + "[" * 1000 + "]" * 1000 + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"sidecar deep\.toml"):
        load_sidecar(path, DaemonConfig())


@pytest.mark.parametrize(
    "table", [{"base": []}, {"tiles": "x", "bytes_per_tile": 1}], ids=["base-list", "tiles-string"]
)
def test_bad_custom_target_values_are_config_errors(table: dict[str, Any]) -> None:
    """A custom target with a value of the wrong type is a ConfigError naming the key."""
    with pytest.raises(ConfigError, match=r"\[targets\.t\]"):
        config_from_dict({"targets": {"t": table}}, "fuzz.toml")


def test_invalid_utf8_strings_are_model_errors(base: Path) -> None:
    """One flipped bit in the graph name or an op type is refused (ModelInvalidError), not a crash."""
    for position, before, after in ((82, b"corpus", b"\xe3orpus"), (25, b"MatMul", b"\xcdatMul")):
        data = _flip(VALID, position, 7)
        assert (VALID[position : position + 6], data[position : position + 6]) == (before, after)
        with pytest.raises(ModelInvalidError):
            parse_model_bytes(data, "bug.onnx")
