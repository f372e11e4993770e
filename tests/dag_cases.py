"""Small random DAGs and a brute force over every valid split of one, straight from the cost
model's definition: the oracle for the planner's DP tests (tests/plan/)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from sharderd.graph.analyze import Analysis
from sharderd.graph.load import LoadedModel
from sharderd.plan.order import candidate_orders
from sharderd.plan.ordered_costs import calibrated_compute_s
from sharderd.target import BUILTIN_TARGETS, Target

__all__ = [
    "TARGET",
    "branchy_dags",
    "dag_settings",
    "evaluate",
    "evaluate_stages",
    "leximax_key",
    "loaded",
    "splits",
    "valid_assignments",
]

H = 8
TARGET = replace(
    BUILTIN_TARGETS["ipu-mk2"],
    link_bytes_per_s=2e6,
    host_bytes_per_s=4e6,
    op_overhead_s=1e-7,
    code_bytes_per_node=256,
)
MAX_ASSIGNMENTS = 4000


def dag_settings(examples: int) -> settings:
    """Hypothesis settings for a brute-force property: no deadline (a brute force of 4,000 splits
    is slow by design), and draws the brute force rejects (too many splits) are not a health issue."""
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


def loaded(model: onnx.ModelProto) -> LoadedModel:
    return LoadedModel(Path("random.onnx"), model, "0" * 64, model.ByteSize(), (), 0)


@st.composite
def branchy_dags(draw: st.DrawFn) -> onnx.ModelProto:
    """MatMul (shared weights), Add (joins), Identity (free) over [1, H]; reads reach back a few
    tensors, so branches, joins and skip edges all occur."""
    n_inputs = draw(st.integers(1, 2))
    n_nodes = draw(st.integers(2, 12))
    n_weights = draw(st.integers(1, 3))
    tensors = [f"in{i}" for i in range(n_inputs)]
    nodes = []
    for k in range(n_nodes):
        kind = draw(st.sampled_from(["MatMul", "MatMul", "Add", "Identity"]))
        window = tensors[-draw(st.integers(1, 4)) :]
        a = draw(st.sampled_from(window))
        out = f"t{k}"
        if kind == "MatMul":
            nodes.append(
                helper.make_node(
                    "MatMul", [a, f"w{draw(st.integers(0, n_weights - 1))}"], [out], name=f"n{k}"
                )
            )
        elif kind == "Add":
            nodes.append(
                helper.make_node("Add", [a, draw(st.sampled_from(tensors))], [out], name=f"n{k}")
            )
        else:
            nodes.append(helper.make_node("Identity", [a], [out], name=f"n{k}"))
        tensors.append(out)
    rng = np.random.default_rng(0)
    used = {x for node in nodes for x in node.input}
    inits = [
        onnx.numpy_helper.from_array(rng.standard_normal((H, H)).astype(np.float32), f"w{i}")
        for i in range(n_weights)
        if f"w{i}" in used
    ]
    read = {x for node in nodes for x in node.input}
    outputs = [t for t in tensors[n_inputs:] if t not in read] or [tensors[-1]]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info(f"in{i}", TensorProto.FLOAT, [1, H])
            for i in range(n_inputs)
            if f"in{i}" in read
        ],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [1, H]) for o in outputs],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def valid_assignments(analysis: Analysis, k: int) -> list[list[int]] | None:
    """Every assignment with every edge forward and every stage used; None when too many."""
    flow = analysis.flow
    order = flow.topo_order.tolist()
    preds = [
        {int(flow.producer[t]) for t in flow.inputs(q).tolist() if flow.producer[t] >= 0}
        for q in range(flow.num_nodes)
    ]
    out: list[list[int]] = []
    stage = [0] * flow.num_nodes

    def walk(i: int) -> bool:
        if i == len(order):
            if len(set(stage)) == k:
                out.append(list(stage))
            return len(out) <= MAX_ASSIGNMENTS
        q = order[i]
        for s in range(max((stage[p] for p in preds[q]), default=0), k):
            stage[q] = s
            if not walk(i + 1):
                return False
        return True

    return out if walk(0) else None


def evaluate(
    analysis: Analysis, target: Target, assignment: list[int], k: int
) -> tuple[float, list[int]]:
    """(bottleneck, memory per stage) of one split, straight from the model's definition:
    stages run one after the other, each in the reference order."""
    times, mems = evaluate_stages(analysis, target, assignment, k)
    return max(times), mems


def evaluate_stages(
    analysis: Analysis,
    target: Target,
    assignment: list[int],
    k: int,
    measured: np.ndarray | None = None,
) -> tuple[list[float], list[int]]:
    """(time per stage, memory per stage) of one split: ``evaluate``'s, stage by stage;
    ``measured`` (seconds per node) replaces the FLOP model as ``plan_stages``' ``measured_s``."""
    flow, costs = analysis.flow, analysis.costs
    n = flow.num_nodes
    compute = calibrated_compute_s(analysis, target, measured)
    ref = next(iter(candidate_orders(flow).values())).tolist()
    rank = {q: r for r, q in enumerate(ref)}
    order = sorted(range(n), key=lambda q: (assignment[q], rank[q]))
    pos = {q: i for i, q in enumerate(order)}
    nb = costs.tensor_bytes.tolist()
    span = {}
    for t in range(flow.num_tensors):
        readers = [pos[int(c)] for c in flow.consumers(t)]
        p = int(flow.producer[t])
        if p < 0 and not readers:
            continue
        origin = pos[p] if p >= 0 else min(readers)
        span[t] = (origin, max(readers) if readers else origin, p < 0)
    reuses = in_place(
        analysis.model.graph, nb, {flow.tensor_names[t]: t for t in range(flow.num_tensors)}
    )
    times, mems = [], []
    for s in range(k):
        members = [q for q in order if assignment[q] == s]
        start, stop = pos[members[0]], pos[members[-1]] + 1
        t_time = sum(compute[q] for q in members)
        t_time += (
            sum(nb[t] for q in members for t in flow.outputs(q).tolist() if flow.is_graph_output[t])
            / target.host_bytes_per_s
        )
        t_time += (
            sum(nb[t] for t, (o, _, inp) in span.items() if inp and start <= o < stop)
            / target.host_bytes_per_s
        )
        cut_in = sum(nb[t] for t, (o, last, _) in span.items() if o < start <= last)
        cut_out = sum(nb[t] for t, (o, last, _) in span.items() if o < stop <= last)
        times.append(t_time + (cut_in + cut_out) / target.link_bytes_per_s)
        weights = {int(w) for q in members for w in flow.weights(q)}
        peak = 0
        for q in members:
            live = sum(nb[t] for t, (o, last, _) in span.items() if o < pos[q] <= last)
            live += sum(nb[t] for t in flow.outputs(q).tolist() if not reuses[q])
            live += sum(nb[t] for t, (o, _, inp) in span.items() if inp and o == pos[q])
            peak = max(peak, live)
        mems.append(
            int(flow.weight_bytes[list(weights)].sum())
            + peak
            + sum(target.code_bytes_for(flow.op_types[q]) for q in members if analysis.compiled[q])
        )
    return times, mems


def leximax_key(times: list[float], total: float) -> tuple[int, ...]:
    """Stage times slowest first, rounded to 1e-11 of ``total``: splits compare by this tuple
    (the first stage time that differs decides)."""
    return tuple(round(t / (1e-11 * total)) for t in sorted(times, reverse=True))


IN_PLACE = {"Identity": (0,), "Relu": (0,), "Add": (0, 1)}
"""The ops of these DAGs whose output takes over an input's memory (``graph/buffers.py``'s rule,
written again here from the node protos)."""


def in_place(graph: onnx.GraphProto, nb: list[int], ids: dict[str, int]) -> list[bool]:
    """Per node: its output reuses the memory of an input made by a node that only it reads, at
    one slot, of the same size, that is not a graph output."""
    readers: dict[str, set[int]] = {}
    for q, node in enumerate(graph.node):
        for x in node.input:
            readers.setdefault(x, set()).add(q)
    made = {y for node in graph.node for y in node.output}
    outputs = {o.name for o in graph.output}
    out = []
    for q, node in enumerate(graph.node):
        y = node.output[0]
        out.append(
            any(
                i < len(node.input)
                and (x := node.input[i]) in made
                and x not in outputs
                and list(node.input).count(x) == 1
                and readers[x] == {q}
                and nb[ids[x]] == nb[ids[y]]
                for i in IN_PLACE.get(node.op_type, ())
            )
        )
    return out


def splits(
    analysis: Analysis, target: Target, k: int, measured: np.ndarray | None = None
) -> list[tuple[list[float], list[int]]]:
    """(time per stage, memory per stage) of every valid split that gives each stage real work."""
    assignments = valid_assignments(analysis, k)
    assume(assignments is not None)
    assert assignments is not None
    costed = ((analysis.costs.flops > 0) | (np.diff(analysis.flow.nw_ptr) > 0)).tolist()
    require_costed = sum(costed) >= k
    return [
        evaluate_stages(analysis, target, a, k, measured)
        for a in assignments
        if not require_costed
        or all(any(costed[q] for q in range(len(a)) if a[q] == s) for s in range(k))
    ]
