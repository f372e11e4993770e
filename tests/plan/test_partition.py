"""The partitioner against brute force: on random small DAGs, over the same order, the bottleneck
is optimal, memory caps hold, and the annotation obeys PopART's rules."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from sharderd.config import PlanConfig
from sharderd.graph.analyze import analyze
from sharderd.graph.load import LoadedModel
from sharderd.plan.ordered_costs import ordered_costs
from sharderd.plan.partition import solve
from sharderd.plan.planner import plan_stages
from sharderd.shard.annotate import annotate, check_annotation
from sharderd.target import BUILTIN_TARGETS

H = 16
TARGET = replace(
    BUILTIN_TARGETS["ipu-mk2"], link_bytes_per_s=2e6, host_bytes_per_s=4e6, op_overhead_s=1e-7
)


@st.composite
def random_dags(draw: st.DrawFn) -> onnx.ModelProto:
    """A DAG of MatMul (with possibly shared weights), Add and Relu over [1, H] tensors."""
    n_inputs = draw(st.integers(1, 2))
    n_nodes = draw(st.integers(2, 9))
    n_weights = draw(st.integers(1, 3))
    tensors = [f"in{i}" for i in range(n_inputs)]
    nodes = []
    for k in range(n_nodes):
        kind = draw(st.sampled_from(["MatMul", "Add", "Relu"]))
        a = draw(st.sampled_from(tensors))
        out = f"t{k}"
        if kind == "MatMul":
            w = f"w{draw(st.integers(0, n_weights - 1))}"
            nodes.append(helper.make_node("MatMul", [a, w], [out], name=f"n{k}"))
        elif kind == "Add":
            b = draw(st.sampled_from(tensors))
            nodes.append(helper.make_node("Add", [a, b], [out], name=f"n{k}"))
        else:
            nodes.append(helper.make_node("Relu", [a], [out], name=f"n{k}"))
        tensors.append(out)
    rng = np.random.default_rng(0)
    inits = [
        onnx.numpy_helper.from_array(rng.standard_normal((H, H)).astype(np.float32), f"w{i}")
        for i in range(n_weights)
    ]
    used = {x for node in nodes for x in node.input}
    inits = [t for t in inits if t.name in used]
    outputs = draw(
        st.lists(st.sampled_from(tensors[n_inputs:]), min_size=1, max_size=2, unique=True)
    )
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info(f"in{i}", TensorProto.FLOAT, [1, H])
            for i in range(n_inputs)
        ],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [1, H]) for o in outputs],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _loaded(model: onnx.ModelProto) -> LoadedModel:
    from pathlib import Path

    return LoadedModel(Path("random.onnx"), model, "0" * 64, model.ByteSize(), (), 0)


def _brute(
    model: onnx.ModelProto, order: list[int], node_time: np.ndarray, k: int, cap: float, bw: float
):
    """Independent reference: enumerate every split of ``order`` into k stages."""
    graph = model.graph
    nodes = [graph.node[i] for i in order]
    n = len(nodes)
    nbytes = 4 * H
    weight_bytes = {t.name: 4 * H * H for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    produced = {out: q for q, node in enumerate(nodes) for out in node.output}
    readers: dict[str, list[int]] = {}
    for q, node in enumerate(nodes):
        for name in set(node.input):
            if name not in weight_bytes:
                readers.setdefault(name, []).append(q)
    start = {t: produced.get(t, min(qs) if qs else -1) for t, qs in readers.items()}
    for t in produced:
        start.setdefault(t, produced[t])
    last = {t: max(readers.get(t, [start[t]])) for t in start}

    def cut(c: int) -> int:
        return sum(nbytes for t in start if start[t] < c <= last[t])

    def in_place(q: int) -> bool:
        """Relu/Add over a node's output only it reads, once, that is no graph output (every
        tensor here has the same size): the output takes over that input's memory."""
        node = nodes[q]
        return node.op_type in ("Relu", "Add") and any(
            x in produced
            and x not in outputs
            and list(node.input).count(x) == 1
            and readers.get(x) == [q]
            for x in node.input
        )

    def live(q: int) -> int:
        crossing = sum(nbytes for t in start if start[t] < q <= last[t])
        own = 0 if in_place(q) else nbytes * len(nodes[q].output)
        streamed = sum(nbytes for t in start if t not in produced and start[t] == q)
        return crossing + own + streamed

    def memory(a: int, b: int) -> int:
        ws = {x for q in range(a, b) for x in nodes[q].input if x in weight_bytes}
        return (
            sum(weight_bytes[w] for w in ws)
            + max(live(q) for q in range(a, b))
            + sum(TARGET.code_bytes_for(nodes[q].op_type) for q in range(a, b))
        )

    costed = [
        bool(
            node.op_type == "MatMul"
            or node_time[q] > TARGET.op_overhead_for(node.op_type) * 1.0000001
        )
        for q, node in enumerate(nodes)
    ]
    require_costed = sum(costed) >= k
    best = None
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        stages = list(itertools.pairwise(bounds))
        if require_costed and not all(any(costed[a:b]) for a, b in stages):
            continue
        if any(memory(a, b) > cap for a, b in stages):
            continue
        worst = max(float(node_time[a:b].sum()) + (cut(a) + cut(b)) / bw for a, b in stages)
        best = worst if best is None else min(best, worst)
    return best


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=random_dags(), k=st.integers(1, 4), cap_fraction=st.floats(0.05, 1.2))
def test_bottleneck_equals_brute_force(model: onnx.ModelProto, k: int, cap_fraction: float) -> None:
    """On random DAGs the partitioner's bottleneck is the brute-force optimum over the same order."""
    n = len(model.graph.node)
    k = min(k, n)
    analysis = analyze(_loaded(model), PlanConfig())
    order = analysis.flow.topo_order
    oc = ordered_costs(analysis, TARGET, order)
    total = sum(oc.stage_memory(0, n))
    cap = max(total * cap_fraction, 1.0)
    partition = solve(oc, np.full(k, cap), require_costed=int(oc.costed.sum()) >= k)
    expected = _brute(model, order.tolist(), oc.node_time, k, cap, TARGET.link_bytes_per_s)
    if expected is None:
        assert partition is None
        return
    assert partition is not None
    assert partition.bottleneck_s == pytest.approx(expected, rel=1e-7)
    bounds = partition.bounds
    assert bounds[0] == 0 and bounds[-1] == n and len(bounds) == k + 1
    for a, b in itertools.pairwise(bounds):
        assert a < b
        assert sum(oc.stage_memory(a, b)) <= cap


@settings(max_examples=80, deadline=None)
@given(model=random_dags(), k=st.integers(1, 4))
def test_plans_annotate_by_popart_rules(model: onnx.ModelProto, k: int) -> None:
    """Whatever the DAG, the annotated model satisfies every PopART pipelining rule we check."""
    k = min(k, len(model.graph.node))
    analysis = analyze(_loaded(model), PlanConfig())
    plan = plan_stages(analysis, TARGET, k, safety_margin=1.0)
    assert sorted(set(plan.assignment.tolist())) == list(range(k))
    for stage in plan.stages:
        assert stage.memory_bytes * plan.safety_margin <= TARGET.memory_bytes
    annotated = onnx.ModelProto()
    annotated.CopyFrom(model)
    annotate(annotated, analysis.flow, plan.assignment)
    assert check_annotation(annotated) == []
    onnx.checker.check_model(annotated)
