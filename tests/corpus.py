"""The bad-input corpus: each builder writes one hostile or broken input into a folder.

A builder returns ``Case(path, exit_code, fragment)``: what ``sharderd plan`` (or ``load_sidecar``
for sidecars) must answer. A non-zero code means ``fragment`` is in the one error message on stderr;
0 means the input is acceptable and ``fragment`` is in the report on stdout. Fragments name the
file, node, tensor or key, because a message that does not is not clear enough for someone
reading ``failed/`` on a shared host.

Models are built by hand with ``onnx.helper`` so every name is known; nothing is downloaded. A case
whose ``CliCase.bug`` is set exposes a reported bug: its test is a strict xfail, so the fix shows.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from sharderd import examples
from sharderd.errors import EXIT_BAD_INPUT, EXIT_OK

__all__ = [
    "HARD_LINK_SECRET",
    "MODEL_CASES",
    "SIDECAR_CASES",
    "SPARSE_BYTES",
    "Case",
    "CliCase",
    "hard_link_outside",
    "small_model",
    "small_model_bytes",
]

HIDDEN = 8
SPARSE_BYTES = 10 * 1024**3
"""The sparse external file: 10 GiB of weights that planning must never read."""
HARD_LINK_SECRET = "secret.bin"


class Case(NamedTuple):
    """One written input and the answer it must get."""

    path: Path
    exit_code: int
    fragment: str


Builder = Callable[[Path], Case]


@dataclass(frozen=True, slots=True)
class CliCase:
    """A corpus entry and how the CLI is run on it."""

    build: Builder
    args: tuple[str, ...] = ("--devices", "2")
    shard: bool = False
    """Also run ``sharderd shard --backend none`` and expect the same exit code and fragment."""
    bug: str | None = None
    """A reported bug this case exposes (the test is a strict xfail until it is fixed)."""


# --- models ---------------------------------------------------------------------------------------


def _weight(name: str, seed: int = 0) -> TensorProto:
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array(rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32), name)


def _info(name: str, dims: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def small_model(
    *,
    nodes: list[onnx.NodeProto] | None = None,
    initializers: list[TensorProto] | None = None,
    inputs: list[onnx.ValueInfoProto] | None = None,
    outputs: list[onnx.ValueInfoProto] | None = None,
    opsets: Mapping[str, int] | None = None,
) -> onnx.ModelProto:
    """x[1, 8] → MatMul ``mm0`` (W0) → Relu ``relu0`` → MatMul ``mm1`` (W1) → y; parts replaceable."""
    if nodes is None:
        nodes = [
            helper.make_node("MatMul", ["x", "W0"], ["h0"], name="mm0"),
            helper.make_node("Relu", ["h0"], ["h1"], name="relu0"),
            helper.make_node("MatMul", ["h1", "W1"], ["y"], name="mm1"),
        ]
    graph = helper.make_graph(
        nodes,
        "corpus",
        inputs if inputs is not None else [_info("x", [1, HIDDEN])],
        outputs if outputs is not None else [_info("y", [1, HIDDEN])],
        initializers if initializers is not None else [_weight("W0", 0), _weight("W1", 1)],
    )
    opset_map = {"": examples.OPSET} if opsets is None else opsets
    return helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid(domain, version) for domain, version in opset_map.items()
        ],
        ir_version=examples.IR_VERSION,
    )


def small_model_bytes() -> bytes:
    return small_model().SerializeToString()


def _save(folder: Path, name: str, model: onnx.ModelProto) -> Path:
    path = folder / name
    path.write_bytes(model.SerializeToString())
    return path


def _bad(path: Path, fragment: str) -> Case:
    return Case(path, EXIT_BAD_INPUT, fragment)


# --- files that are not models --------------------------------------------------------------------


def empty_file(folder: Path) -> Case:
    path = folder / "empty.onnx"
    path.write_bytes(b"")
    return _bad(path, f"model {path} is empty (0 bytes)")


def random_bytes(folder: Path) -> Case:
    path = folder / "random.onnx"
    path.write_bytes(np.random.default_rng(1234).bytes(4096))
    return _bad(path, f"{path} is not an ONNX model")


def _truncated(percent: int) -> Builder:
    def build(folder: Path) -> Case:
        data = small_model_bytes()
        path = folder / f"truncated-{percent}.onnx"
        path.write_bytes(data[: len(data) * percent // 100])
        return _bad(path, f"{path} looks incomplete: the file ends inside the model's")

    build.__name__ = f"truncated_{percent}"
    return build


def graph_not_model(folder: Path) -> Case:
    """A valid protobuf of another type (a GraphProto saved instead of its model) parses as an
    empty ModelProto."""
    path = folder / "graph.onnx"
    path.write_bytes(small_model().graph.SerializeToString())
    return _bad(path, f"{path} is not an ONNX model: it parses, but has no graph")


def missing_file(folder: Path) -> Case:
    path = folder / "no-such-model.onnx"
    return _bad(path, f"cannot read model {path}: No such file or directory")


def directory(folder: Path) -> Case:
    path = folder / "folder.onnx"
    path.mkdir()
    return _bad(path, f"model {path} is not a regular file")


# --- graphs that break the rules ------------------------------------------------------------------


def no_nodes(folder: Path) -> Case:
    model = small_model(nodes=[], outputs=[_info("x", [1, HIDDEN])], initializers=[])
    return _bad(_save(folder, "no-nodes.onnx", model), "the model has no nodes")


def cycle(folder: Path) -> Case:
    nodes = [
        helper.make_node("Add", ["x", "b"], ["a"], name="add_a"),
        helper.make_node("Relu", ["a"], ["b"], name="relu_b"),
        helper.make_node("Relu", ["a"], ["y"], name="relu_y"),
    ]
    return _bad(
        _save(folder, "cycle.onnx", small_model(nodes=nodes)),
        "the graph has a cycle through 3 node(s), e.g. ['add_a', 'relu_b'",
    )


def dangling_input(folder: Path) -> Case:
    nodes = [
        helper.make_node("MatMul", ["x", "W0"], ["h0"], name="mm0"),
        helper.make_node("Add", ["h0", "ghost"], ["y"], name="add_ghost"),
    ]
    model = small_model(nodes=nodes)
    return _bad(_save(folder, "dangling.onnx", model), "'add_ghost' reads 'ghost'")


def unnamed_nodes(folder: Path) -> Case:
    model = small_model()
    for node in model.graph.node:
        node.name = ""
    return _bad(_save(folder, "unnamed.onnx", model), "3 node(s) have no name: #0 (MatMul -> h0)")


def duplicate_names(folder: Path) -> Case:
    model = small_model()
    model.graph.node[1].name = "mm0"
    return _bad(_save(folder, "duplicates.onnx", model), "used by several nodes: 'mm0'")


def duplicate_output(folder: Path) -> Case:
    model = small_model()
    model.graph.node[1].output[0] = "h0"
    return _bad(
        _save(folder, "produced-twice.onnx", model),
        "tensor 'h0' is produced twice (by node 'relu0'",
    )


def _opset(version: int) -> Builder:
    def build(folder: Path) -> Case:
        model = small_model(opsets={"": version})
        return _bad(
            _save(folder, f"opset-{version}.onnx", model),
            f"unsupported default-domain opset {version}",
        )

    build.__name__ = f"opset_{version}"
    return build


def no_default_opset(folder: Path) -> Case:
    model = small_model(opsets={"com.example": 1})
    return _bad(
        _save(folder, "no-default-opset.onnx", model), "the model imports no default-domain opset"
    )


def ml_only(folder: Path) -> Case:
    """A classical-ML model (like onnxruntime's ``logreg_iris.onnx``): only ``ai.onnx.ml`` ops."""
    node = helper.make_node(
        "LinearClassifier",
        ["x"],
        ["label", "scores"],
        name="linear",
        domain="ai.onnx.ml",
        coefficients=[0.5] * (2 * HIDDEN),
        intercepts=[0.0, 0.1],
        classlabels_ints=[0, 1],
    )
    graph = helper.make_graph(
        [node],
        "logreg",
        [_info("x", [1, HIDDEN])],
        [
            helper.make_tensor_value_info("label", TensorProto.INT64, [1]),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 2]),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("ai.onnx.ml", 1)], ir_version=8
    )
    return _bad(
        _save(folder, "logreg.onnx", model),
        "imports only 'ai.onnx.ml' (ops: LinearClassifier). sharderd splits neural-network graphs",
    )


def unknown_domain(folder: Path) -> Case:
    """A custom op from an unknown domain plans (default cost) with a warning in the report."""
    model = small_model(opsets={"": examples.OPSET, "com.example.custom": 3})
    model.graph.node.insert(
        2, helper.make_node("Mystery", ["h1"], ["h2"], name="mystery", domain="com.example.custom")
    )
    model.graph.node[3].input[0] = "h2"
    path = _save(folder, "unknown-domain.onnx", model)
    return Case(path, EXIT_OK, "custom domain 'com.example.custom' (opset 3)")


def _input_dim(value: int) -> Builder:
    def build(folder: Path) -> Case:
        model = small_model(inputs=[_info("x", [value, HIDDEN])])
        path = _save(folder, f"dim-{value}.onnx", model)
        return _bad(path, f"graph input 'x' has dim 0 = {value}; dims must be >= 1")

    build.__name__ = f"input_dim_{'neg' if value < 0 else value}"
    return build


def absurd_input_dims(folder: Path) -> Case:
    """2**40 × 2**40 floats on an input: the byte count (2**82) overflows int64 and any device."""
    nodes = [
        helper.make_node("Relu", ["x"], ["h0"], name="relu0"),
        helper.make_node("Relu", ["h0"], ["y"], name="relu1"),
    ]
    model = small_model(
        nodes=nodes,
        initializers=[],
        inputs=[_info("x", [2**40, 2**40])],
        outputs=[_info("y", [2**40, 2**40])],
    )
    return _bad(
        _save(folder, "absurd-dims.onnx", model),
        "tensor 'x' declares 4835703278458516698824704 bytes",
    )


def absurd_weight_dims(folder: Path) -> Case:
    """An initializer declaring 2**40 × 2**40 floats (no data): refused before any array is sized."""
    weight = TensorProto(name="W0", dims=[2**40, 2**40], data_type=TensorProto.FLOAT)
    model = small_model(initializers=[weight, _weight("W1", 1)])
    return _bad(
        _save(folder, "absurd-weight.onnx", model), "weight 'W0' declares more than a petabyte"
    )


def input_is_output(folder: Path) -> Case:
    """A graph input listed as a graph output too (a pass-through): legal ONNX, plans."""
    model = small_model(outputs=[_info("y", [1, HIDDEN]), _info("x", [1, HIDDEN])])
    return Case(_save(folder, "input-is-output.onnx", model), EXIT_OK, "## Plan: 2 stage(s)")


def output_is_initializer(folder: Path) -> Case:
    """A graph output that is an initializer (no node produces it): legal ONNX, plans."""
    model = small_model(outputs=[_info("y", [1, HIDDEN]), _info("W1", [HIDDEN, HIDDEN])])
    return Case(_save(folder, "output-is-initializer.onnx", model), EXIT_OK, "## Plan: 2 stage(s)")


# --- external data --------------------------------------------------------------------------------


def _external_model(folder: Path, name: str, location: str, *, length: int | None = None) -> Path:
    """``small_model`` with W0 stored externally at ``location`` (the file is not written here)."""
    model = small_model()
    w0 = model.graph.initializer[0]
    w0.ClearField("raw_data")
    w0.data_location = TensorProto.EXTERNAL
    w0.external_data.add(key="location", value=location)
    if length is not None:
        w0.external_data.add(key="length", value=str(length))
    return _save(folder, name, model)


_W0_BYTES = HIDDEN * HIDDEN * 4


def _job_folder(folder: Path, name: str) -> Path:
    job = folder / name
    job.mkdir()
    return job


def external_missing(folder: Path) -> Case:
    job = _job_folder(folder, "ext-missing")
    path = _external_model(job, "model.onnx", "weights.bin")
    return _bad(path, "external data of tensor 'W0' is missing: 'weights.bin'")


def external_short(folder: Path) -> Case:
    job = _job_folder(folder, "ext-short")
    (job / "weights.bin").write_bytes(b"\0" * (_W0_BYTES - 1))
    path = _external_model(job, "model.onnx", "weights.bin")
    return _bad(
        path, f"external data of tensor 'W0' is short: 'weights.bin' has {_W0_BYTES - 1} bytes"
    )


def external_negative_length(folder: Path) -> Case:
    job = _job_folder(folder, "ext-negative")
    (job / "weights.bin").write_bytes(b"\0" * _W0_BYTES)
    path = _external_model(job, "model.onnx", "weights.bin", length=-4)
    return _bad(path, "tensor 'W0': negative external offset or length")


def external_absolute(folder: Path) -> Case:
    job = _job_folder(folder, "ext-absolute")
    path = _external_model(job, "model.onnx", "/etc/passwd")
    return _bad(path, "tensor 'W0': external data location '/etc/passwd' is absolute")


def external_dotdot(folder: Path) -> Case:
    job = _job_folder(folder, "ext-dotdot")
    (folder / "outside.bin").write_bytes(b"\0" * _W0_BYTES)
    path = _external_model(job, "model.onnx", "../outside.bin")
    return _bad(path, "tensor 'W0': external data location '../outside.bin' contains '..'")


def external_symlink_out(folder: Path) -> Case:
    job = _job_folder(folder, "ext-symlink")
    (folder / "outside.bin").write_bytes(b"\0" * _W0_BYTES)
    (job / "weights.bin").symlink_to(folder / "outside.bin")
    path = _external_model(job, "model.onnx", "weights.bin")
    return _bad(path, "tensor 'W0': external data location 'weights.bin' resolves to")


def external_directory(folder: Path) -> Case:
    job = _job_folder(folder, "ext-dir")
    (job / "weights.bin").mkdir()
    path = _external_model(job, "model.onnx", "weights.bin")
    return _bad(path, "external data of tensor 'W0' ('weights.bin') is not a regular file")


def hard_link_outside(folder: Path) -> Case:
    """External data hard-linked to a file outside the job folder.

    No path check can see it. ``sharderd plan`` run by a user reads with that user's rights, so the
    CLI accepts it (as a daemon must, for links it makes itself); the daemon has to refuse it at
    intake instead (see ``test_corpus.test_daemon_refuses_a_hard_linked_job_file``).
    """
    job = _job_folder(folder, "ext-hardlink")
    secret = folder / HARD_LINK_SECRET
    secret.write_bytes(b"\0" * _W0_BYTES)
    os.link(secret, job / "weights.bin")
    path = _external_model(job, "model.onnx", "weights.bin")
    return Case(path, EXIT_OK, "## Plan: 2 stage(s)")


def sparse_10gb(folder: Path) -> Case:
    """10 GiB of external weights in a sparse file: plans from dims alone (run with --target cpu)."""
    job = _job_folder(folder, "sparse")
    path = examples.large_external_model(job / "big.onnx", total_bytes=SPARSE_BYTES, layers=8)
    return Case(path, EXIT_OK, "## Plan: 2 stage(s)")


# --- names and options ----------------------------------------------------------------------------


def newline_name(folder: Path) -> Case:
    path = _save(folder, "two\nlines.onnx", small_model())
    return Case(path, EXIT_OK, "two\nlines.onnx")


def newline_name_empty(folder: Path) -> Case:
    """An empty file whose name holds a newline: the error must stay on one line."""
    path = folder / "forged\nsharderd: error: nothing.onnx"
    path.write_bytes(b"")
    return _bad(path, "is empty (0 bytes)")


def unicode_name(folder: Path) -> Case:
    path = _save(folder, "modèle-模型-🚀.onnx", small_model())
    return Case(path, EXIT_OK, "modèle-模型-🚀.onnx")


def valid_model(folder: Path) -> Case:
    return Case(_save(folder, "valid.onnx", small_model()), EXIT_OK, "## Plan: 2 stage(s)")


def devices_zero(folder: Path) -> Case:
    return _bad(_save(folder, "devices-0.onnx", small_model()), "--devices must be >= 1, got 0")


def devices_huge(folder: Path) -> Case:
    path = _save(folder, "devices-100000.onnx", small_model())
    return _bad(path, "--devices 100000 is more than the model's 3 node(s)")


def batch_size_zero(folder: Path) -> Case:
    return _bad(_save(folder, "batch-0.onnx", small_model()), "batch_size must be >= 1")


def bad_config(folder: Path) -> Case:
    path = _save(folder, "bad-config.onnx", small_model())
    (folder / "bad-config.toml").write_text("[plan\nbatch_size = 2\n", encoding="utf-8")
    return _bad(path, "bad-config.toml: invalid TOML: Expected ']'")


def fifo_model(folder: Path) -> Case:
    """A named pipe: opening it would block the planner forever, so it must not be opened."""
    path = folder / "pipe.onnx"
    os.mkfifo(path)
    return _bad(path, f"model {path} is not a regular file")


def constant_negative_dim(folder: Path) -> Case:
    """A Constant node's tensor with a negative dim: a negative byte count reaches the planner."""
    const = helper.make_node(
        "Constant",
        [],
        ["c"],
        name="const",
        value=TensorProto(name="c", dims=[-1000000], data_type=TensorProto.FLOAT),
    )
    nodes = [
        const,
        helper.make_node("MatMul", ["x", "W0"], ["h0"], name="mm0"),
        helper.make_node("Add", ["h0", "c"], ["h1"], name="add_c"),
        helper.make_node("MatMul", ["h1", "W1"], ["y"], name="mm1"),
    ]
    return _bad(
        _save(folder, "constant-negative-dim.onnx", small_model(nodes=nodes)), "negative dim"
    )


def loop_body() -> onnx.GraphProto:
    """``(i, cond, carry) -> (cond, relu(carry))``: the smallest well-formed Loop body."""
    return helper.make_graph(
        [
            helper.make_node("Identity", ["cond"], ["cond_out"], name="body_cond"),
            helper.make_node("Relu", ["carry"], ["carry_out"], name="body_relu"),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            _info("carry", [1, HIDDEN]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            _info("carry_out", [1, HIDDEN]),
        ],
    )


def trip_count_without_data(folder: Path) -> Case:
    """A Loop whose INT64 scalar trip count ``M`` declares one element and holds none."""
    nodes = [
        helper.make_node("MatMul", ["x", "W0"], ["h0"], name="mm0"),
        helper.make_node("Loop", ["M", "", "h0"], ["h1"], name="loop", body=loop_body()),
        helper.make_node("MatMul", ["h1", "W1"], ["y"], name="mm1"),
    ]
    trip = TensorProto(name="M", dims=[], data_type=TensorProto.INT64)
    model = small_model(nodes=nodes, initializers=[_weight("W0", 0), _weight("W1", 1), trip])
    return _bad(_save(folder, "trip-count-without-data.onnx", model), "'M'")


def huge_1d_input(folder: Path) -> Case:
    """x: float[2**25] (128 MiB, plausible) into Add: onnx's data propagation sizes a vector by the dim."""
    nodes = [
        helper.make_node("Add", ["x", "x"], ["h0"], name="add_x"),
        helper.make_node("Relu", ["h0"], ["y"], name="relu_y"),
    ]
    model = small_model(
        nodes=nodes, initializers=[], inputs=[_info("x", [2**25])], outputs=[_info("y", [2**25])]
    )
    return Case(_save(folder, "huge-1d-input.onnx", model), EXIT_OK, "## Plan: 2 stage(s)")


def invalid_utf8_graph_name(folder: Path) -> Case:
    """A graph name that is not UTF-8: protobuf parses it, the first read of the field raises."""
    data = small_model_bytes()
    assert data.count(b"corpus") == 1
    path = folder / "invalid-utf8.onnx"
    path.write_bytes(data.replace(b"corpus", b"c\xe3rpus"))
    return _bad(path, str(path))


def _bad_config_file(name: str, text: str, fragment: str) -> Builder:
    def build(folder: Path) -> Case:
        path = _save(folder, f"{name}.onnx", small_model())
        (folder / f"{name}.toml").write_text(text, encoding="utf-8")
        return _bad(path, fragment)

    build.__name__ = name.replace("-", "_")
    return build


def _config_args(name: str) -> tuple[str, ...]:
    return ("--devices", "2", "--config", f"{name}.toml")


MODEL_CASES: dict[str, CliCase] = {
    "empty": CliCase(empty_file, shard=True),
    "random-bytes": CliCase(random_bytes),
    "truncated-10": CliCase(_truncated(10)),
    "truncated-50": CliCase(_truncated(50)),
    "truncated-99": CliCase(_truncated(99), shard=True),
    "graph-not-model": CliCase(graph_not_model),
    "missing-file": CliCase(missing_file),
    "directory": CliCase(directory),
    "no-nodes": CliCase(no_nodes),
    "cycle": CliCase(cycle, shard=True),
    "dangling-input": CliCase(dangling_input),
    "unnamed-nodes": CliCase(unnamed_nodes),
    "duplicate-names": CliCase(duplicate_names),
    "duplicate-output": CliCase(duplicate_output),
    "opset-3": CliCase(_opset(3)),
    "opset-99": CliCase(_opset(99)),
    "no-default-opset": CliCase(no_default_opset),
    "ml-only": CliCase(ml_only),
    "unknown-domain": CliCase(unknown_domain, shard=True),
    "dim-0": CliCase(_input_dim(0)),
    "dim-negative": CliCase(_input_dim(-3)),
    "absurd-input-dims": CliCase(absurd_input_dims),
    "absurd-weight-dims": CliCase(absurd_weight_dims),
    "input-is-output": CliCase(input_is_output, shard=True),
    "output-is-initializer": CliCase(output_is_initializer, shard=True),
    "external-missing": CliCase(external_missing),
    "external-short": CliCase(external_short),
    "external-negative-length": CliCase(external_negative_length),
    "external-absolute": CliCase(external_absolute, shard=True),
    "external-dotdot": CliCase(external_dotdot),
    "external-symlink-out": CliCase(external_symlink_out),
    "external-directory": CliCase(external_directory),
    "external-hard-link": CliCase(hard_link_outside),
    "sparse-10gb": CliCase(sparse_10gb, args=("--devices", "2", "--target", "cpu")),
    "newline-name": CliCase(newline_name, shard=True),
    "unicode-name": CliCase(unicode_name, shard=True),
    "newline-name-empty": CliCase(
        newline_name_empty,
        bug="errors print paths raw (e.g. graph/load.py load_model): a newline in a file name splits "
        "the one-line message, and a name can forge a second 'sharderd: error:' line",
    ),
    "devices-0": CliCase(devices_zero, args=("--devices", "0")),
    "devices-100000": CliCase(devices_huge, args=("--devices", "100000")),
    "batch-size-0": CliCase(batch_size_zero, args=("--devices", "2", "--batch-size", "0")),
    "config-invalid-toml": CliCase(
        bad_config, args=("--devices", "2", "--config", "bad-config.toml")
    ),
    "valid": CliCase(valid_model, shard=True),
    "fifo-model": CliCase(fifo_model),
    "constant-negative-dim": CliCase(
        constant_negative_dim,
    ),
    "trip-count-without-data": CliCase(
        trip_count_without_data,
    ),
    "huge-1d-input": CliCase(
        huge_1d_input,
    ),
    "invalid-utf8-graph-name": CliCase(
        invalid_utf8_graph_name,
    ),
    "config-deep-nesting": CliCase(
        _bad_config_file(
            "config-deep-nesting", "x = " + "[" * 2000 + "]" * 2000 + "\n", ": invalid TOML"
        ),
        args=_config_args("config-deep-nesting"),
    ),
    "config-target-base-list": CliCase(
        _bad_config_file("config-target-base-list", "[targets.t]\nbase = []\n", "[targets.t]"),
        args=_config_args("config-target-base-list"),
    ),
    "config-target-tiles-string": CliCase(
        _bad_config_file(
            "config-target-tiles-string", '[targets.t]\ntiles = "x"\nbytes_per_tile = 1\n', "tiles"
        ),
        args=_config_args("config-target-tiles-string"),
    ),
}
"""Every model-side case, run through ``python -m sharderd.cli plan FILE ARGS`` (cwd: its folder)."""


# --- sidecars (daemon jobs) -----------------------------------------------------------------------


def _sidecar(name: str, text: str | bytes, fragment: str) -> Builder:
    def build(folder: Path) -> Case:
        path = folder / f"{name}.toml"
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8")
        return _bad(path, f"sidecar {path.name}{fragment}")

    build.__name__ = f"sidecar_{name.replace('-', '_')}"
    return build


SIDECAR_CASES: dict[str, Builder] = {
    "invalid-toml": _sidecar("invalid-toml", "devices = = 2\n", ": invalid TOML"),
    "unknown-key": _sidecar("unknown-key", "devices = 2\ngpus = 4\n", ": unknown key 'gpus'"),
    "devices-0": _sidecar(
        "devices-0", "devices = 0\n", ": devices must be between 1 and 1024, got 0"
    ),
    "devices-10000": _sidecar(
        "devices-10000", "devices = 10000\n", ": devices must be between 1 and 1024, got 10000"
    ),
    "devices-string": _sidecar(
        "devices-string", 'devices = "two"\n', " devices: expected an integer, got 'two'"
    ),
    "not-utf8": _sidecar("not-utf8", b"devices = 2\n\xff\xfe\n", ": not UTF-8 text"),
    "table-not-value": _sidecar(
        "table", "[devices]\nn = 2\n", " devices: expected an integer, got {'n': 2}"
    ),
}
"""Every sidecar case, run through ``sharderd.daemon.sidecar.load_sidecar``."""
