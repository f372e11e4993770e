"""The poprt backend against the fake ``poprt`` (tests/fake_poprt), in-process and as a real worker.

The fake follows poprt-facts.md: its validation texts are PopART's, its OOM text Poplar's, and
its memory truth is its own. End-to-end tests run ``python -m sharderd.backends.worker`` as a
subprocess with the fake on PYTHONPATH, exactly as the parent will.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from sharderd.backends import poprt as backend
from sharderd.backends.poprt_errors import parse_compile_error
from sharderd.backends.protocol import AttemptOutcome, AttemptRequest, OomInfo

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "fake_poprt"
FAKE_VARS = (
    "FAKE_POPRT_TILES",
    "FAKE_POPRT_TILE_BYTES",
    "FAKE_POPRT_TRUTH",
    "FAKE_POPRT_MODE",
    "FAKE_POPRT_COMPILE_SECONDS",
    "FAKE_POPRT_RUNTIME",
    "FAKE_POPRT_LOG",
    "POPLAR_ENGINE_OPTIONS",
)


# --- models -----------------------------------------------------------------------------------


def chain(
    widths: Sequence[int],
    devices: Sequence[int | None] | None = None,
    stages: Sequence[int | None] | None = None,
    *,
    opset: int = 17,
) -> onnx.ModelProto:
    """x[batch, widths[0]] → MatMul_k(w_k[widths[k], widths[k+1]]) → Relu_k ..., annotated per MatMul/Relu pair."""
    nodes, inits = [], []
    prev = "x"
    for k in range(len(widths) - 1):
        inits.append(
            numpy_helper.from_array(np.ones((widths[k], widths[k + 1]), np.float32), f"w{k}")
        )
        nodes.append(helper.make_node("MatMul", [prev, f"w{k}"], [f"m{k}"], name=f"MatMul_{k}"))
        nodes.append(helper.make_node("Relu", [f"m{k}"], [f"r{k}"], name=f"Relu_{k}"))
        prev = f"r{k}"
    pairs = len(widths) - 1
    for k in range(pairs):
        for node in nodes[2 * k : 2 * k + 2]:
            if devices is not None and devices[k] is not None:
                node.attribute.append(helper.make_attribute("__ipu_number", devices[k]))
            if stages is not None and stages[k] is not None:
                node.attribute.append(helper.make_attribute("__pipeline_stage", stages[k]))
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", widths[0]])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def branches() -> onnx.ModelProto:
    """x → A → B → D(B, C) → E, with x → C a parallel branch: the Sharder example shape."""
    w = numpy_helper.from_array(np.ones((8, 8), np.float32), "w")
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="A"),
        helper.make_node("MatMul", ["a", "w"], ["b"], name="B"),
        helper.make_node("Sigmoid", ["x"], ["c"], name="C"),
        helper.make_node("Add", ["b", "c"], ["d"], name="D"),
        helper.make_node("Relu", ["d"], ["e"], name="E"),
    ]
    graph = helper.make_graph(
        nodes,
        "branches",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 8])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def attrs(model: onnx.ModelProto) -> dict[str, tuple[int | None, int | None]]:
    out = {}
    for node in model.graph.node:
        values = {a.name: a for a in node.attribute}
        for a in values.values():
            assert a.type == onnx.AttributeProto.INT
        ipu = values["__ipu_number"].i if "__ipu_number" in values else None
        stage = values["__pipeline_stage"].i if "__pipeline_stage" in values else None
        out[node.name] = (ipu, stage)
    return out


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in FAKE_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.fixture
def poprt(clean_env: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The fake imported in-process; removed from sys.modules afterwards so no other test sees it."""
    clean_env.syspath_prepend(str(FAKE))
    import poprt as fake

    yield fake
    for name in [n for n in sys.modules if n == "poprt" or n.startswith("poprt.")]:
        del sys.modules[name]


def options(poprt: ModuleType, **values: Any) -> Any:
    return poprt.compiler.CompilerOptions.from_dict(values)


def compile_error(poprt: ModuleType, model: onnx.ModelProto, **values: Any) -> str:
    with pytest.raises(RuntimeError) as info:
        poprt.compiler.Compiler.compile(model, None, options(poprt, **values))
    return str(info.value)


def ipu_bytes(poprt: ModuleType, model: onnx.ModelProto, **values: Any) -> list[int]:
    return poprt.compiler.Compiler.compile(model, None, options(poprt, **values)).popef["ipu_bytes"]


PIPELINED = {
    "num_ipus": 2,
    "virtual_graph_mode": "manual",
    "enable_pipelining": True,
    "batches_per_step": 2,
}


# --- the fake: Sharder ------------------------------------------------------------------------


class TestSharder:
    def test_points_take_unassigned_ancestors_and_leftovers_get_max_plus_one(
        self, poprt: ModuleType
    ) -> None:
        """B's shard is {A, B}; C's is {C} (x is no node); D and E go to device/stage max+1."""
        model = branches()
        sharded = poprt.converter.Sharder(
            sharding_info={"C": 1, "B": 0}, pipelining_info={"C": 1, "B": 0}
        ).run(model)
        assert attrs(sharded) == {"A": (0, 0), "B": (0, 0), "C": (1, 1), "D": (2, 2), "E": (2, 2)}
        assert attrs(model) == {name: (None, None) for name in "ABCDE"}

    def test_branch_stops_at_an_assigned_node(self, poprt: ModuleType) -> None:
        """D's traversal stops at B (already on device 0), so A stays on 0 and only C joins D."""
        sharded = poprt.converter.Sharder({"B": 0, "D": 1}).run(branches())
        assert attrs(sharded) == {
            "A": (0, None),
            "B": (0, None),
            "C": (1, None),
            "D": (1, None),
            "E": (2, None),
        }

    def test_points_are_sorted_topologically_not_by_dict_order(self, poprt: ModuleType) -> None:
        """Listing D before B still lets B claim A; D only gets what B did not."""
        sharded = poprt.converter.Sharder({"D": 1, "B": 0}, {"D": 1, "B": 0}).run(branches())
        assert attrs(sharded)["A"] == (0, 0)
        assert attrs(sharded)["C"] == (1, 1)

    def test_unique_names_are_required(self, poprt: ModuleType) -> None:
        """An unnamed or duplicated node name is a ValueError, as the documentation requires."""
        unnamed = branches()
        unnamed.graph.node[2].name = ""
        with pytest.raises(ValueError, match="has no name"):
            poprt.converter.Sharder({"B": 0}).run(unnamed)
        duplicate = branches()
        duplicate.graph.node[2].name = "A"
        with pytest.raises(ValueError, match="duplicate name: A"):
            poprt.converter.Sharder({"B": 0}).run(duplicate)

    def test_unknown_point_is_refused(self, poprt: ModuleType) -> None:
        """A sharding point that names no node is a ValueError naming it."""
        with pytest.raises(ValueError, match="Nope"):
            poprt.converter.Sharder({"Nope": 0}).run(branches())


# --- the fake: compiler options, validation and memory truth -----------------------------------


class TestCompilerOptions:
    def test_defaults_match_the_cxx_struct(self, poprt: ModuleType) -> None:
        """Documented defaults: 1 IPU, auto-detect version, bps 1, half partials, amp 0.6, off."""
        o = poprt.compiler.CompilerOptions()
        assert (o.num_ipus, o.ipu_version, o.batches_per_step, o.partials_type) == (
            1,
            "",
            1,
            "half",
        )
        assert (
            o.available_memory_proportion,
            o.num_io_tiles,
            o.enable_pipelining,
            o.virtual_graph_mode,
        ) == (
            0.6,
            0,
            False,
            "off",
        )

    def test_unknown_attributes_are_refused(self, poprt: ModuleType) -> None:
        """A misspelt option fails loudly, like a pybind object, directly and through from_dict."""
        with pytest.raises(AttributeError):
            poprt.compiler.CompilerOptions().numIpus = 2
        with pytest.raises(AttributeError, match="numIpus"):
            poprt.compiler.CompilerOptions.from_dict({"numIpus": 2})


# Fixed parts of PopART's texts as quoted in poprt-facts.md §1-§2.
VALIDATION_CASES = [
    pytest.param(
        chain([8, 8, 8], [0, None]),
        {"num_ipus": 2, "virtual_graph_mode": "manual"},
        "Either all Ops must have their virtual graph ids set, or none must. Op count per virtual graph id",
        id="mixed-annotation",
    ),
    pytest.param(
        chain([8, 8, 8]),
        {"num_ipus": 2, "virtual_graph_mode": "manual"},
        "SessionOptions flag virtualGraphMode is VirtualGraphMode::Manual, but no Ops have been annotated "
        "with virtual graph information. This is an inconsistent combination.",
        id="manual-without-annotation",
    ),
    pytest.param(
        chain([8, 8, 8], [0, 3]),
        {"num_ipus": 2, "virtual_graph_mode": "manual"},
        "has been assigned to an invalid virtual graph 3. numIPUs = 2.",
        id="invalid-virtual-graph",
    ),
    pytest.param(
        chain([8, 8, 8]),
        {"num_ipus": 2},
        "If virtual graphs are disabled, the replicated graph count (1) needs to be equal to the number of IPUs (2)",
        id="virtual-graphs-off",
    ),
    pytest.param(
        chain([8, 8, 8], [0, 0]),
        {"num_ipus": 1, "virtual_graph_mode": "manual", "enable_pipelining": True},
        "Pipelining requires more than 1 IPU (currently 1) and the 'virtualGraphMode' session option to not be "
        "VirtualGraphMode::Off",
        id="pipelining-one-ipu",
    ),
    pytest.param(
        chain([8, 8, 8], [0, 1], [0, 0]),
        PIPELINED,
        "have the same pipeline stage 0, but different virtual graph ids {0, 1}. All ops with the same "
        "pipeline stage must also have the same virtual graph id",
        id="stage-on-two-ipus",
    ),
    pytest.param(
        chain([8, 8, 8], [0, 1], [0, 2]),
        PIPELINED,
        "The set of pipeline stages for all Ops contains 2 stages, but stage 1 is missing",
        id="missing-stage",
    ),
    pytest.param(
        chain([8, 8, 8], [0, 1], [-1, 1]),
        PIPELINED,
        "Op has bad pipeline stage -1",
        id="bad-stage",
    ),
    pytest.param(
        chain([8, 8, 8, 8], [0, 1, 1], [0, 1, 2]),
        {**PIPELINED, "batches_per_step": 2},
        "For pipelining, depth (batchesPerStep) must equal at least the number of pipeline stages (3)",
        id="depth",
    ),
    pytest.param(
        chain([8, 8, 8], [0, 1]),
        {"num_ipus": 2, "virtual_graph_mode": "manual", "num_io_tiles": 20},
        "20 is an invalid number of IO tiles. Number of IO tiles must be an even number and >= 32.",
        id="io-tiles",
    ),
    pytest.param(
        chain([8, 8, 8], [0, 1]),
        {"num_ipus": 2, "virtual_graph_mode": "manual", "available_memory_proportion": 1.5},
        "availableMemoryProportion must be in (0,1]",
        id="amp-range",
    ),
]


class TestFakeValidation:
    @pytest.mark.parametrize(("model", "values", "expected"), VALIDATION_CASES)
    def test_popart_texts_and_parser_agree(
        self, poprt: ModuleType, model: onnx.ModelProto, values: dict[str, Any], expected: str
    ) -> None:
        """The fake raises PopART's text for each rule, and the parser calls it invalid, not OOM."""
        text = compile_error(poprt, model, **values)
        assert expected in text
        assert parse_compile_error(text, 1472)[:2] == ("invalid", None)

    def test_stream_tensor_on_two_ipus(self, poprt: ModuleType) -> None:
        """A graph input read on IPU 0 and IPU 1 breaks pipelining's single-IPU stream rule."""
        model = branches()
        for node, ipu in zip(model.graph.node, [0, 0, 1, 1, 1], strict=True):
            node.attribute.append(helper.make_attribute("__ipu_number", ipu))
        text = compile_error(poprt, model, **PIPELINED)
        assert (
            text == "For pipelining, stream tensors can only be streamed directly onto a single IPU"
        )

    def test_mixed_annotation_lists_the_unannotated_nodes(self, poprt: ModuleType) -> None:
        """The mixed-annotation text counts ops per virtual graph (-1 = none) and lists the bare ones."""
        text = compile_error(
            poprt, chain([8, 8, 8], [0, None]), num_ipus=2, virtual_graph_mode="manual"
        )
        assert "  -1 : 2\n  0 : 2\n" in text
        assert (
            "Ops with no virtual graph id :  \n" in text
            and "MatMul_1" in text
            and "MatMul_0" not in text
        )

    def test_stages_default_to_the_ipu(self, poprt: ModuleType) -> None:
        """Without __pipeline_stage PopART uses the IPU as the stage, so a 2-IPU chain pipelines."""
        popef = poprt.compiler.Compiler.compile(
            chain([8, 8, 8], [0, 1]), None, options(poprt, **PIPELINED)
        ).popef
        assert len(popef["stage_flops"]) == 2


class TestFakeMemory:
    def test_shared_weight_costs_on_every_ipu_that_reads_it(self, poprt: ModuleType) -> None:
        """Moving one reader of a 4 MiB weight to IPU 1 adds that weight to IPU 1 without freeing IPU 0."""
        w = numpy_helper.from_array(np.ones((1024, 1024), np.float32), "w")
        nodes = [
            helper.make_node("MatMul", ["x", "w"], ["a"], name="A"),
            helper.make_node("MatMul", ["a", "w"], ["b"], name="B"),
        ]
        graph = helper.make_graph(
            nodes,
            "shared",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])],
            [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 1024])],
            [w],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        split = onnx.ModelProto()
        split.CopyFrom(model)
        for node, ipu in zip(model.graph.node, [0, 0], strict=True):
            node.attribute.append(helper.make_attribute("__ipu_number", ipu))
        for node, ipu in zip(split.graph.node, [0, 1], strict=True):
            node.attribute.append(helper.make_attribute("__ipu_number", ipu))
        together = ipu_bytes(poprt, model, num_ipus=2, virtual_graph_mode="manual")
        apart = ipu_bytes(poprt, split, num_ipus=2, virtual_graph_mode="manual")
        weight_per_tile = 4 * 1024 * 1024 / 1472 * 1.25
        assert apart[1] - together[1] > weight_per_tile
        assert together[0] - apart[0] < weight_per_tile / 2

    def test_lower_available_memory_proportion_lowers_temporaries(self, poprt: ModuleType) -> None:
        """A matmul-heavy model needs fewer bytes at amp 0.1 than at 0.6."""
        model = chain([4096, 4096], [0])
        model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 512
        high = ipu_bytes(poprt, model, num_ipus=1, virtual_graph_mode="manual")
        low = ipu_bytes(
            poprt, model, num_ipus=1, virtual_graph_mode="manual", available_memory_proportion=0.1
        )
        assert low[0] < high[0]

    def test_code_cost_depends_on_op_type(self, poprt: ModuleType) -> None:
        """Same weights, different ops: a MatMul costs more code than the Relu beside it."""
        truth = poprt.compiler.Truth()
        assert truth.code_bytes["MatMul"] > truth.code_bytes.get("Relu", truth.code_default)

    def test_oom_names_a_global_tile_on_the_failing_ipu(
        self, poprt: ModuleType, clean_env: pytest.MonkeyPatch
    ) -> None:
        """A 4 MiB weight on IPU 1 of 8-tile IPUs: the text names a tile in [8, 16) and its bytes."""
        clean_env.setenv("FAKE_POPRT_TILES", "8")
        text = compile_error(poprt, chain([64, 64, 1024, 1024], [0, 1, 1]), **PIPELINED)
        outcome, oom, _ = parse_compile_error(text, 8)
        assert outcome == "oom" and oom is not None
        assert oom.kind == "tile" and oom.device == 1 and 8 <= (oom.tile or 0) < 16
        assert (oom.bytes_used or 0) > 638976 and oom.tile_bytes == 638976

    def test_harsher_truth_by_env(self, poprt: ModuleType, clean_env: pytest.MonkeyPatch) -> None:
        """FAKE_POPRT_TRUTH scales the truth: a model that fits stops fitting."""
        model = chain([256, 256, 256], [0, 1])
        poprt.compiler.Compiler.compile(model, None, options(poprt, **PIPELINED))
        clean_env.setenv("FAKE_POPRT_TRUTH", json.dumps({"weight_factor": 5000}))
        assert "Out of memory on tile" in compile_error(poprt, model, **PIPELINED)

    def test_profiling_engine_options_hide_the_tile(
        self, poprt: ModuleType, clean_env: pytest.MonkeyPatch
    ) -> None:
        """With autoReport.all in POPLAR_ENGINE_OPTIONS the fake, like Poplar, names no tile."""
        clean_env.setenv("FAKE_POPRT_TILES", "8")
        clean_env.setenv(
            "POPLAR_ENGINE_OPTIONS",
            json.dumps({"autoReport.all": "true", "autoReport.directory": "/r"}),
        )
        text = compile_error(poprt, chain([64, 64, 1024, 1024], [0, 1, 1]), **PIPELINED)
        assert (
            text
            == "Out of memory: Cannot fit all variable data onto one or more tiles. Profile saved to: /r/profile.pop"
        )


class TestFakeRuntimeAndProfile:
    def test_runner_fills_outputs_and_checks_inputs(
        self, poprt: ModuleType, tmp_path: Path
    ) -> None:
        """The Runner reads the exported PopEF, fills preallocated outputs and rejects a wrong shape."""
        popef = tmp_path / "m.popef"
        opts = options(
            poprt, **PIPELINED, ipu_version=poprt.runtime.DeviceManager().ipu_hardware_version()
        )
        poprt.compiler.Compiler.compile_and_export(
            chain([8, 8, 4], [0, 1]).SerializeToString(), None, str(popef), opts
        )
        runner = poprt.runtime.Runner(str(popef))
        (inp,), (out,) = runner.get_execute_inputs(), runner.get_execute_outputs()
        assert (inp.name, inp.shape, inp.numpy_data_type()) == ("x", [1, 8], "float32")
        assert (out.name, out.shape) == ("r1", [1, 4])
        result = {out.name: np.full(out.shape, 7, out.numpy_data_type())}
        runner.execute_async({"x": np.ones((1, 8), np.float32)}, result).wait()
        assert not result["r1"].any()
        with pytest.raises(RuntimeError, match="expects float32"):
            runner.execute({"x": np.ones((2, 8), np.float32)}, result)

    def test_profiler_returns_a_callable_for_any_op_and_empty_shapes(
        self, poprt: ModuleType
    ) -> None:
        """Unknown ops and unknown shapes count 0; a MatMul counts 2·M·N·K."""
        profiler = poprt.profile.Profiler()
        node = helper.make_node("NoSuchOp", ["a"], ["b"])
        assert profiler.get_profiler("NoSuchOp")(node, [np.array([])], [np.array([])]) == 0
        matmul = helper.make_node("MatMul", ["a", "b"], ["c"])
        assert profiler.get_profiler("MatMul")(matmul, [np.array([])], [np.array([])]) == 0
        assert (
            profiler.get_profiler("MatMul")(
                matmul, [np.array([3, 5]), np.array([5, 7])], [np.array([3, 7])]
            )
            == 210
        )


# --- the backend, in-process -------------------------------------------------------------------


def request_for(tmp_path: Path, model: onnx.ModelProto, **values: Any) -> AttemptRequest:
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    fields: dict[str, Any] = {
        "backend": "poprt",
        "model": str(path),
        "artifact": str(tmp_path / "model.popef"),
        "num_devices": 2,
        "tiles_per_device": 1472,
    }
    fields.update(values)
    return AttemptRequest(**fields)


class TestRunAttempt:
    def test_available_only_with_poprt_on_the_path(self, clean_env: pytest.MonkeyPatch) -> None:
        """available() finds the package without importing it."""
        assert not backend.available()
        clean_env.syspath_prepend(str(FAKE))
        assert backend.available()
        assert "poprt" not in sys.modules

    def test_missing_poprt_is_invalid_with_advice(
        self, clean_env: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        """Without the SDK the attempt is invalid and says what to do."""
        outcome = backend.run_attempt(request_for(tmp_path, chain([8, 8, 8], [0, 1])))
        assert outcome == AttemptOutcome("invalid", message=backend.NOT_INSTALLED)

    @pytest.mark.parametrize(
        ("mode", "kind"),
        [
            ("variables", "variables"),
            ("code", "code"),
            ("exchange", "exchange"),
            ("stream", "stream"),
        ],
    )
    def test_every_oom_mode_becomes_oom(
        self, poprt: ModuleType, clean_env: pytest.MonkeyPatch, tmp_path: Path, mode: str, kind: str
    ) -> None:
        """Each forced failure form comes back as ``oom`` of its kind; tile forms name the device."""
        clean_env.setenv("FAKE_POPRT_MODE", mode)
        outcome = backend.run_attempt(request_for(tmp_path, chain([8, 8, 8], [0, 1])))
        assert outcome.outcome == "oom" and outcome.oom is not None and outcome.oom.kind == kind
        if kind in ("code", "exchange"):
            assert outcome.oom.device == outcome.oom.tile // 1472  # type: ignore[operator]
        assert not Path(outcome.artifact or tmp_path / "model.popef").exists()

    def test_unknown_error_is_invalid_with_the_text(
        self, poprt: ModuleType, clean_env: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        """A failure no parser knows is ``invalid`` and carries the compiler's text."""
        clean_env.setenv("FAKE_POPRT_MODE", "unknown_error")
        outcome = backend.run_attempt(request_for(tmp_path, chain([8, 8, 8], [0, 1])))
        assert outcome.outcome == "invalid" and "internal compiler error" in outcome.message

    def test_options_reach_the_compiler(
        self, poprt: ModuleType, clean_env: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        """Request options become CompilerOptions; batches_per_step is raised to the stage count."""
        log = tmp_path / "compiles.jsonl"
        clean_env.setenv("FAKE_POPRT_LOG", str(log))
        request = request_for(
            tmp_path,
            chain([8, 8, 8, 8], [0, 1, 1], [0, 1, 2]),
            options={
                "batches_per_step": 2,
                "available_memory_proportion": 0.3,
                "partials_type": "float",
                "num_io_tiles": 32,
                "ipu_version": "ipu2",
            },
        )
        outcome = backend.run_attempt(request)
        assert outcome.outcome == "ok", outcome.message
        assert "batches_per_step raised from 2 to 3" in outcome.message
        (record,) = [json.loads(line) for line in log.read_text().splitlines()]
        got = record["options"]
        assert (
            got["num_ipus"],
            got["virtual_graph_mode"],
            got["enable_pipelining"],
            got["batches_per_step"],
        ) == (
            2,
            "manual",
            True,
            3,
        )
        assert (got["available_memory_proportion"], got["partials_type"], got["num_io_tiles"]) == (
            0.3,
            "float",
            32,
        )
        assert got["ipu_version"] == "ipu2"

    def test_simulated_compile_time(
        self, poprt: ModuleType, clean_env: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        """FAKE_POPRT_COMPILE_SECONDS makes the compile take at least that long."""
        clean_env.setenv("FAKE_POPRT_COMPILE_SECONDS", "0.2")
        started = time.monotonic()
        outcome = backend.run_attempt(request_for(tmp_path, chain([8, 8, 8], [0, 1])))
        assert outcome.outcome == "ok" and time.monotonic() - started >= 0.2

    def test_single_device_compiles_without_pipelining(
        self, poprt: ModuleType, clean_env: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        """PopART refuses pipelining on one IPU, so the backend turns it off and says so."""
        outcome = backend.run_attempt(
            request_for(tmp_path, chain([8, 8, 8], [0, 0]), num_devices=1)
        )
        assert outcome.outcome == "ok", outcome.message
        assert "pipelining is off on a single IPU" in outcome.message


# --- the worker, as a real subprocess ----------------------------------------------------------


def run_worker(
    tmp_path: Path, request: AttemptRequest, env: dict[str, str] | None = None, *, fake: bool = True
) -> tuple[subprocess.CompletedProcess[str], AttemptOutcome | None]:
    req, res = tmp_path / "request.json", tmp_path / "result.json"
    request.write(req)
    environ = {k: v for k, v in os.environ.items() if k not in FAKE_VARS}
    environ["PYTHONPATH"] = f"{FAKE}{os.pathsep}{ROOT}" if fake else str(ROOT)
    environ.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "sharderd.backends.worker", str(req), str(res)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    outcome = AttemptOutcome.from_json(json.loads(res.read_text())) if res.exists() else None
    return proc, outcome


class TestWorker:
    def test_ok_with_benchmark(self, tmp_path: Path) -> None:
        """A valid 2-IPU pipelined model compiles to a PopEF and is timed: latency one batch at a
        time, throughput with batches queued, so two equal stages deliver about twice the rate a
        lone batch's latency implies (each fake stage takes 3 ms here, far above sleep jitter).
        A sleep is never shorter than asked but a loaded machine stretches it, so the latency's
        lower edge is tight and its upper one only rules out counting the runs or the batch."""
        request = request_for(
            tmp_path, chain([16, 16, 16], [0, 1]), benchmark=True, warmup=2, runs=12, batch_size=4
        )
        runtime = {"FAKE_POPRT_RUNTIME": json.dumps({"stage_base_s": 3e-3, "stage_cap_s": 1.0})}
        proc, outcome = run_worker(tmp_path, request, env=runtime)
        assert proc.returncode == 0, proc.stderr
        assert outcome is not None and outcome.outcome == "ok", outcome
        assert outcome.artifact == request.artifact and Path(request.artifact).is_file()
        bench = outcome.benchmark
        assert bench is not None and bench.runs == 12 and bench.spread_s >= 0
        assert 6e-3 * 0.95 <= bench.latency_s < 6e-3 * 4
        assert bench.in_flight >= 4  # two stages, each filled twice over
        assert bench.throughput_per_s > 1.5 * 4 / bench.latency_s
        assert outcome.duration_s > 0

    def test_ok_without_benchmark(self, tmp_path: Path) -> None:
        """Without benchmark=True nothing is run after the compile."""
        proc, outcome = run_worker(tmp_path, request_for(tmp_path, chain([16, 16, 16], [0, 1])))
        assert proc.returncode == 0, proc.stderr
        assert outcome is not None and outcome.outcome == "ok" and outcome.benchmark is None

    def test_the_benchmark_step_cannot_attach_to_ipus_another_runner_holds(
        self, tmp_path: Path, poprt: ModuleType, clean_env: pytest.MonkeyPatch
    ) -> None:
        """The benchmark step runs the compiled PopEF alone; while another runner holds the
        host's 2 IPUs it fails as PopRT's runtime does, and runs once they are detached."""
        devices = tmp_path / "ipus"
        devices.mkdir()
        env = {"FAKE_POPRT_IPUS": "2", "FAKE_POPRT_DEVICE_DIR": str(devices)}
        for key, value in env.items():
            clean_env.setenv(key, value)
        request = request_for(tmp_path, chain([16, 16, 16], [0, 1]), warmup=1, runs=3)
        proc, compiled = run_worker(tmp_path, request, env=env)
        assert compiled is not None and compiled.outcome == "ok", proc.stderr
        assert compiled.ipus_on_host == 2 and compiled.benchmark is None
        step = dataclasses.replace(request, benchmark_only=True)
        holder = poprt.runtime.Runner(request.artifact)  # this process attaches both IPUs
        _, refused = run_worker(tmp_path, step, env=env)
        assert refused is not None and refused.outcome == "invalid" and refused.benchmark is None
        assert "Failed to attach to a device with 2 IPUs" in refused.message
        del holder  # detaches
        _, ran = run_worker(tmp_path, step, env=env)
        assert ran is not None and ran.outcome == "ok" and ran.benchmark is not None, ran
        events = [
            json.loads(line)["event"] for line in (devices / "attach.log").read_text().splitlines()
        ]
        assert events == ["attach", "attach_failed", "detach", "attach", "detach"]

    def test_oom_on_ipu_1_and_engine_options_unset(self, tmp_path: Path) -> None:
        """Too big on IPU 1: ``oom`` on device 1, with POPLAR_ENGINE_OPTIONS removed so the tile is named."""
        log = tmp_path / "compiles.jsonl"
        env = {
            "FAKE_POPRT_TILES": "8",
            "FAKE_POPRT_LOG": str(log),
            "POPLAR_ENGINE_OPTIONS": json.dumps({"autoReport.all": "true"}),
        }
        request = request_for(tmp_path, chain([64, 64, 1024, 1024], [0, 1, 1]), tiles_per_device=8)
        proc, outcome = run_worker(tmp_path, request, env)
        assert proc.returncode == 0, proc.stderr
        assert outcome is not None and outcome.outcome == "oom", outcome
        oom = outcome.oom
        assert oom is not None and (oom.kind, oom.device, oom.tile_bytes) == ("tile", 1, 638976)
        assert 8 <= (oom.tile or 0) < 16
        assert "POPLAR_ENGINE_OPTIONS was unset" in outcome.message
        (record,) = [json.loads(line) for line in log.read_text().splitlines()]
        assert record["poplar_engine_options"] is None
        assert record["ipu_bytes"][1] == oom.bytes_used and record["ipu_bytes"][0] <= 638976
        assert not Path(request.artifact).exists()

    def test_mixed_annotation_is_invalid(self, tmp_path: Path) -> None:
        """A node without __ipu_number beside annotated ones is ``invalid`` with a clear summary."""
        proc, outcome = run_worker(tmp_path, request_for(tmp_path, chain([8, 8, 8], [0, None])))
        assert proc.returncode == 0, proc.stderr
        assert outcome is not None and outcome.outcome == "invalid" and outcome.oom is None
        assert outcome.message.startswith("mixed annotation") and "MatMul_1" in outcome.message

    def test_segfault_kills_the_worker_without_a_result(self, tmp_path: Path) -> None:
        """A compiler crash ends the subprocess by SIGSEGV and leaves no result file."""
        proc, outcome = run_worker(
            tmp_path,
            request_for(tmp_path, chain([8, 8, 8], [0, 1])),
            {"FAKE_POPRT_MODE": "segfault"},
        )
        assert proc.returncode == -signal.SIGSEGV
        assert outcome is None and not (tmp_path / "result.json.tmp").exists()

    def test_hang_mode_blocks_until_a_signal(self, tmp_path: Path) -> None:
        """In ``hang`` mode the compile logs its call, then blocks until SIGTERM ends the worker."""
        fifo = tmp_path / "log.fifo"
        os.mkfifo(fifo)
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # the fake's open needs a reader
        req, res = tmp_path / "request.json", tmp_path / "result.json"
        request_for(tmp_path, chain([8, 8, 8], [0, 1])).write(req)
        environ = {k: v for k, v in os.environ.items() if k not in FAKE_VARS}
        environ |= {
            "PYTHONPATH": f"{FAKE}{os.pathsep}{ROOT}",
            "FAKE_POPRT_MODE": "hang",
            "FAKE_POPRT_LOG": str(fifo),
        }
        argv = [sys.executable, "-m", "sharderd.backends.worker", str(req), str(res)]
        with subprocess.Popen(argv, env=environ, stderr=subprocess.PIPE) as proc:
            try:
                ready, _, _ = select.select([reader], [], [], 180)  # a loaded machine's start-up
                assert ready, "the fake never logged its compile"
                record = json.loads(os.read(reader, 65536).decode().splitlines()[0])
                assert record["result"] == "hang"
                assert proc.poll() is None
            finally:
                proc.terminate()
                os.close(reader)
            assert proc.wait(timeout=30) == -signal.SIGTERM
        assert not res.exists()

    def test_unknown_backend_exits_2(self, tmp_path: Path) -> None:
        """An unknown backend name is a usage error on stderr, exit code 2, no result."""
        proc, outcome = run_worker(tmp_path, request_for(tmp_path, chain([8, 8]), backend="tpu"))
        assert proc.returncode == 2 and outcome is None
        assert "unknown backend 'tpu'" in proc.stderr

    def test_without_poprt_the_worker_reports_invalid(self, tmp_path: Path) -> None:
        """Without the SDK on the path the worker still writes a result: ``invalid`` with advice."""
        proc, outcome = run_worker(
            tmp_path, request_for(tmp_path, chain([8, 8, 8], [0, 1])), fake=False
        )
        assert proc.returncode == 0, proc.stderr
        assert outcome is not None and (outcome.outcome, outcome.message) == (
            "invalid",
            backend.NOT_INSTALLED,
        )

    def test_oom_info_round_trips(self, tmp_path: Path) -> None:
        """The written result reads back to the same OomInfo the backend built."""
        request = request_for(tmp_path, chain([8, 8, 8], [0, 1]))
        _, outcome = run_worker(tmp_path, request, {"FAKE_POPRT_MODE": "code"})
        assert (
            outcome is not None and isinstance(outcome.oom, OomInfo) and outcome.oom.kind == "code"
        )


class TestConversion:
    def test_an_int64_hf_export_is_converted_as_poprt_does_and_keeps_its_plan(
        self, poprt: ModuleType, clean_env: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        """A real BERT export (int64 input_ids, symbolic batch/sequence) planned on 2 IPUs goes
        through Converter + int64_to_int32 (which drop the annotations and add Casts) and compiles:
        every planned node gets its stage back by name, each added Cast sits on its readers'
        stage, and the message says what changed."""
        from sharderd.config import PlanConfig
        from sharderd.engine import analyze_file, make_plan, write_shard_files
        from sharderd.shard.annotate import read_annotation
        from sharderd.target import BUILTIN_TARGETS

        config = PlanConfig(dims={"sequence": 32})
        analysis = analyze_file(
            ROOT / "tests" / "data" / "models" / "tiny_bert" / "model.onnx", config
        )
        plan = make_plan(analysis, BUILTIN_TARGETS["ipu-mk2"], 2, config)
        files = write_shard_files(analysis, plan, tmp_path, "bert")
        request = AttemptRequest(
            backend="poprt",
            model=str(files.model),
            artifact=str(tmp_path / "bert.popef"),
            num_devices=2,
            tiles_per_device=1472,
            options={"ipu_version": "ipu2"},
        )
        outcome = backend.run_attempt(request)
        assert outcome.outcome == "ok", outcome.message
        assert "re-annotated by name" in outcome.message and "3 added" in outcome.message
        sharded = onnx.load(str(files.model))
        converted = onnx.load(f"{request.artifact}.converted.onnx")
        assert {i.type.tensor_type.elem_type for i in converted.graph.input} == {
            onnx.TensorProto.INT32
        }
        planned, got = read_annotation(sharded), read_annotation(converted)
        assert all(got[name] == stages for name, stages in planned.items())
        casts = [n for n in converted.graph.node if n.name not in planned]
        assert len(casts) == 3 and all(n.op_type == "Cast" for n in casts)
        readers = {n.name: n for n in converted.graph.node}
        for cast in casts:
            stages = {got[r.name] for r in readers.values() if cast.output[0] in r.input}
            assert got[cast.name] == min(stages)
