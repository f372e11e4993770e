"""Fake ``poprt.compiler``: PopART's validation, then a memory truth of its own.

The compile checks what PopART checks, in PopART's order and with its texts (poprt-facts.md §1),
then costs every IPU the way a tiled machine fills up: weights on every IPU that reads them,
activations by a liveness walk over that IPU's schedule (with matmul/conv temporaries that
shrink with ``available_memory_proportion``: the op's own ``__available_memory`` FLOAT attribute
when it has one, as PopART reads it, else the session option; a MatMul serialized by
``__serialize_matmul_mode``/``__serialize_matmul_factor`` k has 1/k of them: the fake's own model
of PopART computing it as k pieces one after the other, not a fact), code per op type, exchange buffers for tensors
crossing IPUs and host streams. The worst tile is the mean per-tile load × an imbalance factor
plus a fixed per-tile overhead; over the limit raises Poplar's "Out of memory on tile" text for
the lowest-numbered failing IPU. Three further families make the worst tile something else than a
uniform share (``op_tiles``: the biggest op's tile; ``exchange_by_op``: per-op-type exchange;
``noise``: per-split scatter), so a correction that only fits a ratio is put to the test. The truth deliberately differs from any weights-only estimate
so the search must learn from the compiler. Knobs: see the package docstring.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from poprt.converter import IPU_ATTR, STAGE_ATTR, int_attribute, producer_indices, topological_order
from poprt.profile import Profiler

__all__ = ["Compiler", "CompilerOptions", "Executable"]

DEFAULT_TILES = 1472
DEFAULT_TILE_BYTES = 638_976
_VGRAPH_MODES = {
    "off": "VirtualGraphMode::Off",
    "manual": "VirtualGraphMode::Manual",
    "auto": "VirtualGraphMode::Auto",
}
_VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
_PLANNED_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose"})
AMP_ATTR = "__available_memory"
SERIAL_MODE_ATTR = "__serialize_matmul_mode"
SERIAL_FACTOR_ATTR = "__serialize_matmul_factor"
_SERIAL_MODES = frozenset({"none", "input_channels", "reducing_dim", "output_channels"})
_KEEP_INIT_BYTES = 4096
_SCRATCH_OPS = frozenset(
    {"Softmax", "LayerNormalization", "ReduceMean", "ReduceSum", "ReduceMax", "TopK"}
)


@dataclass(slots=True)
class CompilerOptions:
    """PopRT's options (snake_case Python names, C++ defaults). Unknown attributes are refused."""

    num_ipus: int = 1
    ipu_version: str = ""
    batches_per_step: int = 1
    partials_type: str = "half"
    available_memory_proportion: float = 0.6
    num_io_tiles: int = 0
    enable_pipelining: bool = False
    virtual_graph_mode: str = "off"
    virtual_graph_split_ratios: list[float] = field(default_factory=list)
    enable_engine_caching: bool = False
    cache_path: str = ""
    engine_options: dict[str, str] = field(default_factory=dict)
    stream_buffering_depth: int = 1
    enable_prefetch_datastreams: bool = True
    group_host_sync: bool = False
    rearrange_anchors_on_host: bool = True
    rearrange_streams_on_host: bool = False
    enable_outlining: bool = True
    outline_threshold: float = 1.0
    enable_fast_reduce: bool = False
    enable_multi_stage_reduce: bool = True
    use_128bit_conv_unit_load: bool = False
    constant_weights: bool = True
    time_limit_scheduler: float = 1e9
    swap_limit_scheduler: int = 16
    transitive_closure_optimization_threshold: int = 100_000
    show_compilation_progress_bar: bool = True
    custom_patterns: list[str] = field(default_factory=list)
    custom_transform_applier_settings: dict[str, str] = field(default_factory=dict)
    opaque_blobs: bool = True
    enable_model_fusion: bool = False
    enable_non_stable_softmax: bool = False
    serialize_ir: bool = False

    @staticmethod
    def from_dict(values: Mapping[str, Any]) -> CompilerOptions:
        options = CompilerOptions()
        for key, value in values.items():
            if key not in CompilerOptions.__dataclass_fields__:
                raise AttributeError(f"'CompilerOptions' object has no attribute '{key}'")
            setattr(options, key, value)
        return options


class Executable:
    """What ``Compiler.compile`` returns; ``runtime.Runner`` accepts it like a PopEF path."""

    def __init__(self, popef: Mapping[str, Any]) -> None:
        self.popef = dict(popef)


class Compiler:
    """Static entry points, as in PopRT."""

    @staticmethod
    def compile(
        model: Any, outputs: Sequence[str] | None, options: CompilerOptions | None = None
    ) -> Executable:
        return Executable(_compile(model, outputs, options or CompilerOptions()))

    @staticmethod
    def compile_and_export(
        model: Any,
        outputs: Sequence[str] | None,
        filename: str,
        options: CompilerOptions | None = None,
    ) -> None:
        popef = _compile(model, outputs, options or CompilerOptions())
        Path(filename).write_text(json.dumps(popef, indent=1), encoding="utf-8")

    @staticmethod
    def compile_and_get_summary_report(
        model: Any,
        outputs: Sequence[str] | None,
        options: CompilerOptions | None = None,
        reset_profile: bool = True,
    ) -> str:
        popef = _compile(model, outputs, options or CompilerOptions())
        lines = [
            f"Target: {popef['num_ipus']} x {popef['ipu_version']}, {popef['tiles_per_ipu']} tiles per IPU"
        ]
        lines += [f"  IPU {i}: worst tile {b} bytes" for i, b in enumerate(popef["ipu_bytes"])]
        return "\n".join(lines) + "\n"


# --- knobs -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Truth:
    """The fake's memory model; FAKE_POPRT_TRUTH (JSON) overrides any field."""

    imbalance: float = 1.25
    tile_overhead: int = 24 * 1024
    weight_factor: float = 1.0
    activation_factor: float = 1.0
    temp_factor: float = 2.0
    """Planner temporaries of a matmul/conv relative to its operands, at the default amp 0.6."""
    scratch_factor: float = 0.25
    exchange_factor: float = 1.0
    stream_factor: float = 1.0
    code_default: int = 12 * 1024
    code_bytes: Mapping[str, int] = field(
        default_factory=lambda: {
            "Conv": 96 * 1024,
            "ConvTranspose": 96 * 1024,
            "MatMul": 64 * 1024,
            "Gemm": 64 * 1024,
            "Softmax": 24 * 1024,
            "LayerNormalization": 32 * 1024,
            "BatchNormalization": 16 * 1024,
            "Reshape": 512,
            "Flatten": 512,
            "Squeeze": 512,
            "Unsqueeze": 512,
            "Identity": 256,
            "Constant": 0,
        }
    )

    op_tiles: float = 0.0
    """Largest-op family (0: off): the biggest op on an IPU (its weights, operands and temporaries)
    is laid out over only this share of the compute tiles, as a big matmul's partials or an
    embedding's rows are on real Poplar, so its tile is the worst when that beats the uniform one."""
    exchange_by_op: Mapping[str, float] = field(default_factory=dict)
    """Per-op-type exchange: this factor × the op's non-weight operand bytes of exchange buffers on
    its IPU (e.g. a Gather's row exchange), on top of the crossing-tensor buffers."""
    noise: float = 0.0
    """Each IPU's worst tile × (1 + noise·u), u in [-1, 1] fixed by the IPU's node names and the
    AMP: the same split always measures the same, different contents scatter."""

    @staticmethod
    def from_env(text: str | None) -> Truth:
        if not text:
            return Truth()
        values = json.loads(text)
        known = {f.name for f in dataclasses.fields(Truth)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(
                f"FAKE_POPRT_TRUTH: unknown keys {sorted(unknown)} (known: {sorted(known)})"
            )
        if "code_bytes" in values:
            values["code_bytes"] = {**Truth().code_bytes, **values["code_bytes"]}
        return Truth(**values)


@dataclass(frozen=True, slots=True)
class Knobs:
    tiles: int
    tile_bytes: int
    truth: Truth
    mode: str
    compile_seconds: float
    log: Path | None

    @staticmethod
    def from_env() -> Knobs:
        env = os.environ
        mode = env.get("FAKE_POPRT_MODE", "normal")
        modes = (
            "normal",
            "variables",
            "code",
            "exchange",
            "stream",
            "segfault",
            "hang",
            "unknown_error",
        )
        if mode not in modes:
            raise ValueError(f"FAKE_POPRT_MODE={mode!r}; known: {', '.join(modes)}")
        return Knobs(
            tiles=int(env.get("FAKE_POPRT_TILES", DEFAULT_TILES)),
            tile_bytes=int(env.get("FAKE_POPRT_TILE_BYTES", DEFAULT_TILE_BYTES)),
            truth=Truth.from_env(env.get("FAKE_POPRT_TRUTH")),
            mode=mode,
            compile_seconds=float(env.get("FAKE_POPRT_COMPILE_SECONDS", "0")),
            log=Path(env["FAKE_POPRT_LOG"]) if env.get("FAKE_POPRT_LOG") else None,
        )


# --- compile -----------------------------------------------------------------------------------


def _compile(model: Any, outputs: Sequence[str] | None, options: CompilerOptions) -> dict[str, Any]:
    knobs = Knobs.from_env()
    record: dict[str, Any] = {
        "pid": os.getpid(),
        "options": dataclasses.asdict(options),
        "poplar_engine_options": os.environ.get("POPLAR_ENGINE_OPTIONS"),
        "mode": knobs.mode,
        "ipu_bytes": None,
    }
    try:
        popef = _compile_logged(model, outputs, options, knobs, record)
    except RuntimeError as exc:
        record.update(result="error", error=str(exc))
        _log(knobs, record)
        raise
    record.update(result="ok", error=None)
    _log(knobs, record)
    return popef


def _log(knobs: Knobs, record: Mapping[str, Any]) -> None:
    if knobs.log is not None:
        with open(knobs.log, "a", encoding="utf-8") as stream:
            stream.write(json.dumps(record, sort_keys=True) + "\n")


def _compile_logged(
    model: Any,
    outputs: Sequence[str] | None,
    options: CompilerOptions,
    knobs: Knobs,
    record: dict[str, Any],
) -> dict[str, Any]:
    proto = _load(model)
    if not 0 < options.available_memory_proportion <= 1:
        raise RuntimeError("availableMemoryProportion must be in (0,1]")
    graph = _Graph(proto)
    record["op_amps"] = sorted(set(graph.amps.values()))
    record["serialized_matmuls"] = {graph.nodes[k].name: f for k, f in sorted(graph.pieces.items())}
    for value in graph.amps.values():
        if not 0 < value <= 1:
            raise RuntimeError("availableMemoryProportion must be in (0,1]")
    anchors = list(outputs) if outputs else [o.name for o in proto.graph.output]
    for anchor in anchors:
        if anchor not in graph.tensors:
            raise RuntimeError(f"Anchor tensor `{anchor}' not in Ir Tensors. ")
    ipus, stages = _validate(graph, options)

    if knobs.mode in ("segfault", "hang"):
        record["result"] = knobs.mode
        _log(knobs, record)
        if knobs.mode == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        while True:  # a wedged compile: only a signal ends it
            signal.pause()
    if knobs.compile_seconds > 0:
        time.sleep(knobs.compile_seconds)  # noqa: TID251 - a real compile blocks the process too
    if knobs.mode == "unknown_error":
        raise RuntimeError(
            "poplar_error: Failed to compile the graph: internal compiler error (fake unknown_error mode)"
        )

    ipu_bytes = _worst_tile_bytes(graph, ipus, options, knobs)
    record["ipu_bytes"] = [int(b) for b in ipu_bytes]
    _raise_if_out_of_memory(graph, ipus, ipu_bytes, options, knobs)
    return _popef(graph, anchors, ipus, stages, ipu_bytes, options, knobs)


def _load(model: Any) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, bytes | bytearray):
        return onnx.load_model_from_string(bytes(model))
    if isinstance(model, str | os.PathLike):
        if not Path(model).is_file():
            raise RuntimeError(f"Model file {model} does not exist")
        return onnx.load(os.fspath(model), load_external_data=False)
    raise TypeError(
        f"model must be ONNX bytes, a path or an onnx.ModelProto, not {type(model).__name__}"
    )


class _Graph:
    """The model with everything the checks and the memory truth read, computed once."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.nodes = list(model.graph.node)
        self.order = topological_order(model.graph)
        self.producers = producer_indices(model.graph)
        self.made_by = {out: i for i, node in enumerate(self.nodes) for out in node.output if out}
        self.consumers: dict[str, list[int]] = {}
        for index, node in enumerate(self.nodes):
            for name in dict.fromkeys(node.input):
                if name:
                    self.consumers.setdefault(name, []).append(index)
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        self.opset = opset
        init_names = {init.name for init in model.graph.initializer}
        self.stream_inputs = [v for v in model.graph.input if v.name not in init_names]
        self.weights: dict[str, int] = {
            init.name: _proto_bytes(init) for init in model.graph.initializer
        }
        for node in self.nodes:
            if node.op_type == "Constant" and node.output:
                value = next(
                    (a.t for a in node.attribute if a.name == "value" and a.HasField("t")), None
                )
                self.weights[node.output[0]] = _proto_bytes(value) if value is not None else 0
        self.shapes, self.dtypes = _infer(model)
        self.tensors = set(self.shapes) | set(self.weights) | set(self.made_by)
        self.amps = {
            k: float(a.f)
            for k, node in enumerate(self.nodes)
            if node.op_type in _PLANNED_OPS
            for a in node.attribute
            if a.name == AMP_ATTR and a.type == onnx.AttributeProto.FLOAT
        }
        """Node index → its own ``__available_memory`` (PopART reads it on conv/matmul ops)."""
        self.pieces = _serialized(self.nodes)
        """MatMul index → the pieces ``__serialize_matmul_*`` cut it into (only those above 1)."""

    def amp(self, index: int, options: CompilerOptions) -> float:
        """The cap on this op's temporaries: its own attribute, else the session's option."""
        return self.amps.get(index, options.available_memory_proportion)

    def temp_share(self, index: int) -> float:
        """The share of its temporaries an op needs at a time: 1/k for a MatMul in k pieces."""
        return 1.0 / self.pieces.get(index, 1)

    def bytes_of(self, name: str) -> int:
        if name in self.weights:
            return self.weights[name]
        shape = self.shapes.get(name)
        if shape is None:
            return 0
        return int(np.prod(shape, dtype=np.int64)) * self.dtypes[name].itemsize

    def operand_bytes(self, index: int) -> int:
        """A node's non-weight inputs and outputs: what its temporaries and exchange scale with."""
        node = self.nodes[index]
        return sum(
            self.bytes_of(n) for n in [*node.input, *node.output] if n and n not in self.weights
        )

    def debug_name(self, index: int) -> str:
        node = self.nodes[index]
        opid = f"ai.onnx.{node.op_type}:{self.opset}"
        head = f"{node.name} ({opid})" if node.name else opid
        return f"Op({head}, outputs=[{', '.join(node.output)}])"


def _serialized(nodes: Sequence[onnx.NodeProto]) -> dict[int, int]:
    """MatMul index → its serialization factor, when its mode is not ``none`` and the factor is
    above 1; an unknown mode or a factor below 1 is refused (the fake's own text)."""
    out: dict[int, int] = {}
    for k, node in enumerate(nodes):
        attrs = {a.name: a for a in node.attribute}
        if node.op_type != "MatMul" or SERIAL_MODE_ATTR not in attrs:
            continue
        mode = attrs[SERIAL_MODE_ATTR].s.decode()
        factor = attrs[SERIAL_FACTOR_ATTR].i if SERIAL_FACTOR_ATTR in attrs else 1
        if mode not in _SERIAL_MODES or factor < 1:
            raise RuntimeError(
                f"Invalid matmul serialization on {node.name}: mode {mode!r}, factor {factor}"
            )
        if mode != "none" and factor > 1:
            out[k] = int(factor)
    return out


def _proto_bytes(tensor: onnx.TensorProto) -> int:
    itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize


def _infer(model: onnx.ModelProto) -> tuple[dict[str, list[int]], dict[str, np.dtype]]:
    """Shapes of every value with symbolic dims read as 1, as the IPU needs static shapes."""
    light = onnx.ModelProto()
    light.CopyFrom(model)
    for init in light.graph.initializer:
        if _proto_bytes(init) <= _KEEP_INIT_BYTES:
            continue  # small ones (Reshape targets, axes) carry values inference needs
        # large ones only need dims: drop their bytes before inference copies them
        init.ClearField("raw_data")
        init.ClearField("float_data")
        init.ClearField("int64_data")
        init.ClearField("int32_data")
        init.ClearField("double_data")
        del init.external_data[:]
        init.data_location = onnx.TensorProto.DEFAULT
    for value in light.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if not dim.HasField("dim_value"):
                dim.dim_value = 1
    try:
        inferred = onnx.shape_inference.infer_shapes(light)
    except onnx.shape_inference.InferenceError as exc:
        raise RuntimeError(f"ONNX shape inference failed: {exc}") from None
    shapes: dict[str, list[int]] = {}
    dtypes: dict[str, np.dtype] = {}
    graph = inferred.graph
    for value in [*graph.input, *graph.value_info, *graph.output]:
        tensor_type = value.type.tensor_type
        if not tensor_type.HasField("shape") or tensor_type.elem_type == 0:
            continue
        shapes[value.name] = [
            d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1
            for d in tensor_type.shape.dim
        ]
        dtypes[value.name] = np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
    return shapes, dtypes


# --- PopART's validation, in PopART's order ------------------------------------------------------


def _validate(graph: _Graph, options: CompilerOptions) -> tuple[list[int], list[int]]:
    """Return (IPU, stage) per node, or raise PopART's text for the first rule broken."""
    mode = str(options.virtual_graph_mode).lower()
    if mode not in _VGRAPH_MODES:
        raise RuntimeError(
            f"Unknown virtual graph mode '{options.virtual_graph_mode}' (off, manual, auto)"
        )
    count = len(graph.nodes)
    ipu: list[int | None] = [int_attribute(n, IPU_ATTR) for n in graph.nodes]
    stage: list[int | None] = [int_attribute(n, STAGE_ATTR) for n in graph.nodes]
    if mode == "off":
        ipu = [None] * count  # PopART drops the annotations when virtual graphs are off
    elif mode == "auto" and all(i is None for i in ipu):
        ipu = [0] * count
        for position, index in enumerate(graph.order):
            ipu[index] = position * options.num_ipus // max(count, 1)

    if mode != "off":
        _check_virtual_graph_ids(graph, ipu)
    if options.enable_pipelining:
        stage = _check_pipeline(graph, options, mode, ipu, stage)
    else:
        stage = [None] * count

    if mode != "off":
        io_tiles = options.num_io_tiles
        if io_tiles and (io_tiles < 32 or io_tiles % 2):
            raise RuntimeError(
                f"{io_tiles} is an invalid number of IO tiles. Number of IO tiles must be an even number and >= 32."
            )
        for index in graph.order:
            vgraph = ipu[index]
            if vgraph is not None and not 0 <= vgraph < options.num_ipus:
                raise RuntimeError(
                    f"{graph.debug_name(index)} has been assigned to an invalid virtual graph {vgraph}. "
                    f"numIPUs = {options.num_ipus}."
                )
    elif options.num_ipus > 1:
        raise RuntimeError(
            "If virtual graphs are disabled, the replicated graph count (1) needs to be equal to "
            f"the number of IPUs ({options.num_ipus})"
        )
    ipus = [0 if i is None else i for i in ipu]
    return ipus, [ipus[k] if s is None else s for k, s in enumerate(stage)]


def _check_virtual_graph_ids(graph: _Graph, ipu: list[int | None]) -> None:
    missing = [k for k, i in enumerate(ipu) if i is None]
    if missing and len(missing) < len(ipu):
        counts: dict[int, int] = {}
        for i in ipu:
            counts[-1 if i is None else i] = counts.get(-1 if i is None else i, 0) + 1
        text = "Either all Ops must have their virtual graph ids set, or none must. Op count per virtual graph id\n"
        text += "".join(f"  {vgraph} : {n}\n" for vgraph, n in sorted(counts.items()))
        text += "Ops with no virtual graph id :  \n"
        text += "".join(f"  {graph.debug_name(k)}\n" for k in missing)
        raise RuntimeError(text)
    if ipu and not len(missing) < len(ipu):
        raise RuntimeError(
            "SessionOptions flag virtualGraphMode is VirtualGraphMode::Manual, but no Ops have been "
            "annotated with virtual graph information. This is an inconsistent combination."
        )


def _check_pipeline(
    graph: _Graph,
    options: CompilerOptions,
    mode: str,
    ipu: list[int | None],
    stage: list[int | None],
) -> list[int | None]:
    vgraphs = {i for i in ipu if i is not None}
    if mode == "off" or len(vgraphs) <= 1:
        raise RuntimeError(
            f"Pipelining requires more than 1 IPU (currently {len(vgraphs)}) and the 'virtualGraphMode' "
            f"session option to not be VirtualGraphMode::Off (currently {_VGRAPH_MODES[mode]})."
        )
    staged = [s is not None for s in stage]
    if any(staged) and not all(staged):
        raise RuntimeError(
            "Only some ops have had their pipeline stage set. Ops missing the pipeline stage:"
            + "".join(f"\n  {graph.debug_name(k)}" for k, s in enumerate(staged) if not s)
        )
    if all(staged):
        for ps in sorted({s for s in stage if s is not None}):
            members = [k for k, s in enumerate(stage) if s == ps]
            on = sorted({-1 if ipu[k] is None else ipu[k] for k in members})
            if len(on) > 1:
                names = ", ".join(graph.debug_name(k) for k in members)
                ids = ", ".join(str(i) for i in on)
                raise RuntimeError(
                    f"Ops [{names}] have the same pipeline stage {ps}, but different virtual graph ids "
                    f"{{{ids}}}. All ops with the same pipeline stage must also have the same virtual graph id"
                )
    else:
        stage = list(ipu)  # InferPipelineStages: the IPU is the stage
    for s in stage:
        if s is not None and s < 0:
            raise RuntimeError(f"Op has bad pipeline stage {s}")
    for value in graph.stream_inputs:
        consumers = {ipu[k] for k in graph.consumers.get(value.name, [])}
        if len(consumers) > 1:
            raise RuntimeError(
                "For pipelining, stream tensors can only be streamed directly onto a single IPU"
            )
    present = {s for s in stage if s is not None}
    for k in range(len(present)):
        if k not in present:
            raise RuntimeError(
                f"The set of pipeline stages for all Ops contains {len(present)} stages, but stage {k} is missing"
            )
    if options.batches_per_step < len(present):
        raise RuntimeError(
            "For pipelining, depth (batchesPerStep) must equal at least the number of pipeline "
            f"stages ({len(present)})"
        )
    return stage


# --- the memory truth ----------------------------------------------------------------------------


def _worst_tile_bytes(
    graph: _Graph, ipus: list[int], options: CompilerOptions, knobs: Knobs
) -> np.ndarray:
    """Bytes on the fullest tile of each IPU."""
    truth = knobs.truth
    n_ipus = max(options.num_ipus, 1)
    io_tiles = options.num_io_tiles if options.virtual_graph_mode != "off" else 0
    compute_tiles = max(knobs.tiles - io_tiles, 1)
    weights = np.zeros(n_ipus)
    code = np.zeros(n_ipus)
    exchange = np.zeros(n_ipus)
    streams = np.zeros(n_ipus)
    for index, node in enumerate(graph.nodes):
        code[ipus[index]] += truth.code_bytes.get(node.op_type, truth.code_default)
        factor = truth.exchange_by_op.get(node.op_type, 0.0)
        if factor:
            exchange[ipus[index]] += factor * graph.operand_bytes(index)
    for name, users in graph.consumers.items():
        size = graph.bytes_of(name)
        producer = graph.made_by.get(name)
        for device in {ipus[k] for k in users}:
            if name in graph.weights:  # a weight read on several IPUs lives on each
                weights[device] += truth.weight_factor * size
            elif producer is None:  # a graph input streamed from the host
                streams[device] += truth.stream_factor * size * options.stream_buffering_depth
            elif ipus[producer] != device:  # copied between IPUs: buffers on both ends
                exchange[device] += truth.exchange_factor * size
                exchange[ipus[producer]] += 0.5 * truth.exchange_factor * size
    for value in graph.model.graph.output:
        if value.name in graph.made_by:
            device = ipus[graph.made_by[value.name]]
            streams[device] += (
                truth.stream_factor * graph.bytes_of(value.name) * options.stream_buffering_depth
            )
    activations = np.array(
        [_activation_peak(graph, ipus, d, options, knobs, compute_tiles) for d in range(n_ipus)]
    )

    compute = weights + activations + code + exchange
    if io_tiles:
        worst_compute = compute / compute_tiles * truth.imbalance + truth.tile_overhead
        worst_io = streams / io_tiles * truth.imbalance + truth.tile_overhead
        worst = np.maximum(worst_compute, worst_io)
    else:
        worst = (compute + streams) / compute_tiles * truth.imbalance + truth.tile_overhead
    if truth.op_tiles > 0:
        worst = np.maximum(
            worst, _largest_op_tile(graph, ipus, compute, options, knobs, compute_tiles)
        )
    if truth.noise > 0:
        worst = worst * (1.0 + truth.noise * _noise(graph, ipus, n_ipus, options))
    return np.ceil(worst).astype(np.int64)


def _largest_op_tile(
    graph: _Graph,
    ipus: list[int],
    compute: np.ndarray,
    options: CompilerOptions,
    knobs: Knobs,
    compute_tiles: int,
) -> np.ndarray:
    """Each IPU's worst tile when its biggest op sits on ``op_tiles`` of the tiles and the rest of
    the load is spread evenly (uniform rest, concentrated op)."""
    truth = knobs.truth
    partials = 2.0 if str(options.partials_type).lower() == "float" else 1.0
    biggest = np.zeros(len(compute))
    for k, node in enumerate(graph.nodes):
        operands = graph.operand_bytes(k)
        weights = sum(graph.weights.get(n, 0) for n in node.input if n) * truth.weight_factor
        temp = (
            truth.temp_factor
            * partials
            * operands
            * graph.amp(k, options)
            / 0.6
            * graph.temp_share(k)
            if node.op_type in _PLANNED_OPS
            else 0.0
        )
        biggest[ipus[k]] = max(biggest[ipus[k]], operands + weights + temp)
    op_tiles = max(truth.op_tiles * compute_tiles, 1.0)
    rest = np.maximum(compute - biggest, 0.0) / compute_tiles
    return biggest / op_tiles + rest + truth.tile_overhead


def _noise(graph: _Graph, ipus: list[int], n_ipus: int, options: CompilerOptions) -> np.ndarray:
    """u in [-1, 1] per IPU, a pure function of what the IPU holds and the AMP its conv/matmul
    ops are planned with (the session's when it has none)."""
    names: list[list[str]] = [[] for _ in range(n_ipus)]
    amps: list[set[float]] = [set() for _ in range(n_ipus)]
    for k in graph.order:
        names[ipus[k]].append(graph.nodes[k].name)
        if graph.nodes[k].op_type in _PLANNED_OPS:
            amps[ipus[k]].add(graph.amp(k, options))
    keys = [
        "/".join(f"{a:.3f}" for a in sorted(a or {options.available_memory_proportion}))
        for a in amps
    ]
    return np.array(
        [
            zlib.crc32(("/".join(n) + key).encode()) / 0xFFFFFFFF * 2.0 - 1.0
            for n, key in zip(names, keys, strict=True)
        ]
    )


def _activation_peak(
    graph: _Graph,
    ipus: list[int],
    device: int,
    options: CompilerOptions,
    knobs: Knobs,
    compute_tiles: int,
) -> float:
    """Peak live activation bytes over this IPU's schedule, plus the running op's temporaries."""
    schedule = [
        k for k in graph.order if ipus[k] == device and graph.nodes[k].op_type != "Constant"
    ]
    if not schedule:
        return 0.0
    truth = knobs.truth
    position = {k: p for p, k in enumerate(schedule)}
    last = len(schedule) - 1
    outputs = {o.name for o in graph.model.graph.output}
    live = np.zeros(len(schedule))
    first_use: dict[str, int] = {}
    last_use: dict[str, int] = {}
    for k in schedule:
        for name in graph.nodes[k].input:
            if name and name not in graph.weights:
                first_use.setdefault(name, position[k])
                last_use[name] = position[k]
    for k in schedule:
        node = graph.nodes[k]
        if node.op_type in _VIEW_OPS:
            continue  # a view aliases its input
        for name in node.output:
            leaves = name in outputs or any(
                ipus[c] != device for c in graph.consumers.get(name, [])
            )
            end = last if leaves else last_use.get(name, position[k])
            live[position[k] : end + 1] += graph.bytes_of(name)
    for name, start in first_use.items():
        producer = graph.made_by.get(name)
        if producer is None or ipus[producer] != device:  # received from the host or another IPU
            live[start : last_use[name] + 1] += graph.bytes_of(name)

    partials = 2.0 if str(options.partials_type).lower() == "float" else 1.0
    temp = np.zeros(len(schedule))
    for k in schedule:
        node = graph.nodes[k]
        operands = graph.operand_bytes(k)
        if node.op_type in _PLANNED_OPS:
            amp = graph.amp(k, options)
            planned = truth.temp_factor * partials * operands * amp / 0.6 * graph.temp_share(k)
            temp[position[k]] = min(planned, amp * knobs.tile_bytes * compute_tiles)
        elif node.op_type in _SCRATCH_OPS:
            temp[position[k]] = truth.scratch_factor * operands
    return float(np.max(live * truth.activation_factor + temp))


def _raise_if_out_of_memory(
    graph: _Graph, ipus: list[int], ipu_bytes: np.ndarray, options: CompilerOptions, knobs: Knobs
) -> None:
    over = [d for d, b in enumerate(ipu_bytes) if b > knobs.tile_bytes]
    forced = knobs.mode in ("variables", "code", "exchange", "stream")
    allow_oom = _allow_out_of_memory()
    if not over and not forced:
        return
    device = over[0] if over else int(np.argmax(ipu_bytes))
    io_tiles = options.num_io_tiles if options.virtual_graph_mode != "off" else 0
    names = (
        "/".join(graph.nodes[k].name for k in graph.order if ipus[k] == device) or f"ipu{device}"
    )
    local = io_tiles + zlib.crc32(names.encode()) % max(knobs.tiles - io_tiles, 1)
    tile = device * knobs.tiles + local
    used = int(ipu_bytes[device])
    if knobs.mode == "variables" or (allow_oom is not None and not forced):
        saved = f" Profile saved to: {allow_oom}/profile.pop" if allow_oom else ""
        raise RuntimeError(
            f"Out of memory: Cannot fit all variable data onto one or more tiles.{saved}"
        )
    if knobs.mode == "code":
        raise RuntimeError(
            f"tile {tile} _poplar_start must be 0 not {used} bytes from the start of memory. "
            "Typically this error occurs when there is too much code to fit in code memory."
        )
    if knobs.mode == "exchange":
        raise RuntimeError(
            f"Tile {tile} receives more data than it has total memory in exchange 'IpuCopy/ipu{device}'"
        )
    if knobs.mode == "stream":
        raise RuntimeError(f"Out of memory. Single stream of length {used} in bufferIndex {device}")
    raise RuntimeError(
        f"Out of memory on tile {tile}: {used} bytes used but tiles only have {knobs.tile_bytes} bytes of memory"
    )


def _allow_out_of_memory() -> str | None:
    """With ``debug.allowOutOfMemory`` in POPLAR_ENGINE_OPTIONS Poplar names no tile.

    Returns the profile directory ("" when none is set), or None when the option is off.
    """
    raw = os.environ.get("POPLAR_ENGINE_OPTIONS")
    if not raw:
        return None
    try:
        values = json.loads(raw)
    except json.JSONDecodeError:
        return None
    if not isinstance(values, dict):
        return None
    profiling = str(values.get("autoReport.all", "")).lower() == "true"
    allow = str(values.get("debug.allowOutOfMemory", "true" if profiling else "")).lower() == "true"
    return str(values.get("autoReport.directory", "")) if allow else None


def _popef(
    graph: _Graph,
    anchors: list[str],
    ipus: list[int],
    stages: list[int],
    ipu_bytes: np.ndarray,
    options: CompilerOptions,
    knobs: Knobs,
) -> dict[str, Any]:
    profiler = Profiler()
    n_stages = max(stages, default=0) + 1
    stage_flops = [0] * n_stages
    for k, node in enumerate(graph.nodes):
        in_shapes = [np.array(graph.shapes.get(n, []), np.int64) for n in node.input]
        out_shapes = [np.array(graph.shapes.get(n, []), np.int64) for n in node.output]
        stage_flops[stages[k]] += int(
            profiler.get_profiler(node.op_type)(node, in_shapes, out_shapes)
        )

    stage_send_bytes = [0] * n_stages  # activations a stage hands to later stages, per batch
    for name, users in graph.consumers.items():
        producer = graph.made_by.get(name)
        if producer is None:
            continue
        receivers = {stages[k] for k in users} - {stages[producer]}
        stage_send_bytes[stages[producer]] += graph.bytes_of(name) * len(receivers)

    def desc(name: str) -> dict[str, Any]:
        dtype = graph.dtypes.get(name, np.dtype(np.float32))
        return {"name": name, "shape": graph.shapes.get(name, []), "dtype": dtype.name}

    from poprt.runtime import DeviceManager  # the hardware the compile auto-detects

    return {
        "format": "fake-popef",
        "version": 1,
        "ipu_version": options.ipu_version or DeviceManager().ipu_hardware_version(),
        "num_ipus": options.num_ipus,
        "tiles_per_ipu": knobs.tiles,
        "batches_per_step": options.batches_per_step,
        "enable_pipelining": options.enable_pipelining,
        "inputs": [desc(v.name) for v in graph.stream_inputs],
        "outputs": [desc(name) for name in anchors],
        "ipu_bytes": [int(b) for b in ipu_bytes],
        "stage_flops": stage_flops,
        "stage_send_bytes": stage_send_bytes,
        "per_tile_limit": knobs.tile_bytes,
        "amp_limit": math.floor(options.available_memory_proportion * knobs.tile_bytes),
    }
