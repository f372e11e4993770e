"""The DP over the ideals of the contracted graph (plan/group_ideals.py, plan/contract.py,
plan/stage_memory.py): exact against a brute force over every valid split when nothing is
contracted, exact over the group-respecting splits when something is, and the one memory model
however a split is read."""

from __future__ import annotations

import math
from dataclasses import replace

import dag_cases
import numpy as np
import onnx
import pytest
from dag_cases import TARGET, branchy_dags, dag_settings, evaluate, loaded, valid_assignments
from hypothesis import event, given
from hypothesis import strategies as st
from onnx import TensorProto, helper
from real_exports import export_analysis

from sharderd.config import PlanConfig
from sharderd.graph.analyze import Analysis, analyze
from sharderd.plan import group_ideals
from sharderd.plan.contract import Groups, contract
from sharderd.plan.group_ideals import solve_groups
from sharderd.plan.neighbourhood import search_near
from sharderd.plan.order import candidate_orders
from sharderd.plan.ordered_costs import calibrated_compute_s, ordered_costs
from sharderd.plan.planner import plan_stages
from sharderd.plan.problem import Problem
from sharderd.plan.stage_memory import StageMemory


def _problem(analysis: Analysis, target, caps, measured=None) -> Problem:
    costed = (analysis.costs.flops > 0) | (np.diff(analysis.flow.nw_ptr) > 0)
    return Problem(
        analysis,
        target,
        calibrated_compute_s(analysis, target, measured),
        next(iter(candidate_orders(analysis.flow).values())),
        np.asarray(caps, dtype=np.float64),
        int(costed.sum()) >= len(caps),
    )


def _solve(analysis: Analysis, target, caps, groups: Groups, upper: float = np.inf, measured=None):
    return solve_groups(_problem(analysis, target, caps, measured), groups, upper_bound=upper)


def _respects(assignment: list[int], groups: Groups) -> bool:
    stage_of: dict[int, int] = {}
    return all(
        stage_of.setdefault(int(g), s) == s for g, s in zip(groups.of_node, assignment, strict=True)
    )


@dag_settings(120)
@given(
    model=branchy_dags(),
    k=st.integers(1, 4),
    cap_fraction=st.floats(0.0, 1.0),
    contracted=st.booleans(),
    pinned=st.integers(-1, 11),
    times=st.lists(st.integers(1, 20), min_size=12, max_size=12),
)
def test_dp_equals_the_brute_force_over_its_splits(
    model: onnx.ModelProto,
    k: int,
    cap_fraction: float,
    contracted: bool,
    pinned: int,
    times: list[int],
) -> None:
    """Caps from below "some split fits" to "the fastest fits", so the memory bounds and the exact
    measurements both decide. Without contraction: the optimum over every valid split; with it,
    the optimum over the splits that keep each group on one stage. Optimal lexicographically
    (the slowest stage, then the next slowest ...). With ``pinned`` >= 0 node times are measured
    (1-20 µs), one of them a second: the slowest stage is the same in many splits, so the rest
    decides."""
    analysis = analyze(loaded(model), PlanConfig())
    k = min(k, analysis.flow.num_nodes)
    measured = None
    if pinned >= 0:
        measured = np.array([t * 1e-6 for t in times[: analysis.flow.num_nodes]])
        measured[pinned % len(measured)] = 1.0
    groups = contract(analysis, enabled=contracted)
    assignments = valid_assignments(analysis, k)
    if assignments is None:
        return
    costed = ((analysis.costs.flops > 0) | (np.diff(analysis.flow.nw_ptr) > 0)).tolist()
    cases = [
        (dag_cases.evaluate_stages(analysis, TARGET, a, k, measured), a)
        for a in assignments
        if _respects(a, groups)
        and (
            sum(costed) < k
            or all(any(costed[q] for q, s in enumerate(a) if s == t) for t in range(k))
        )
    ]
    if not cases:
        found = _solve(analysis, TARGET, [TARGET.memory_bytes] * k, groups, measured=measured)
        assert found is not None and found.assignment is None
        return
    need = sorted(max(mems) for (_, mems), _ in cases)
    memory = need[0] * 0.9 + cap_fraction * (need[-1] - need[0] * 0.9)
    target = replace(TARGET, memory_bytes=max(math.ceil(memory), 1))
    fitting = [times for (times, mems), _ in cases if max(mems) <= target.memory_bytes]
    caps = [target.memory_bytes] * k
    found = _solve(analysis, target, caps, groups, measured=measured)
    assert found is not None
    if not fitting:
        assert found.assignment is None
        return
    total = sum(fitting[0])
    expected = min(fitting, key=lambda t: dag_cases.leximax_key(t, total))
    optimum = max(expected)
    assert found.assignment is not None
    assert found.bottleneck_s == pytest.approx(optimum, rel=1e-9)
    times, mems = dag_cases.evaluate_stages(
        analysis, target, found.assignment.tolist(), k, measured
    )
    assert max(times) == pytest.approx(optimum, rel=1e-9) and max(mems) <= target.memory_bytes
    assert dag_cases.leximax_key(times, total) == dag_cases.leximax_key(expected, total)
    assert _respects(found.assignment.tolist(), groups)
    # The order search's bound only prunes: at the optimum it finds it, below it nothing.
    again = _solve(analysis, target, caps, groups, upper=optimum, measured=measured)
    assert again is not None and again.bottleneck_s == pytest.approx(optimum, rel=1e-9)
    assert again.assignment is not None
    again_times, _ = dag_cases.evaluate_stages(
        analysis, target, again.assignment.tolist(), k, measured
    )
    assert dag_cases.leximax_key(again_times, total) == dag_cases.leximax_key(expected, total)
    below = _solve(analysis, target, caps, groups, upper=optimum * 0.999, measured=measured)
    assert below is not None and below.assignment is None


def test_strategy_draws_contractible_graphs() -> None:
    """The property above means something only if contraction happens in some drawn graphs: an
    Identity of a graph input is shape-free bookkeeping under 4 KiB."""
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["x"], ["i"], name="i"),
            helper.make_node("MatMul", ["i", "w"], ["y"], name="m"),
        ],
        "g",
        [helper.make_tensor_value_info("x", f, [1, 8])],
        [helper.make_tensor_value_info("y", f, [1, 8])],
        [onnx.numpy_helper.from_array(np.ones((8, 8), np.float32), "w")],
    )
    analysis = analyze(loaded(helper.make_model(graph)), PlanConfig())
    assert contract(analysis).merged == 1
    assert contract(analysis, enabled=False).merged == 0


@pytest.mark.parametrize("name", ["tiny_bert", "tiny_gpt2", "tiny_unet"])
def test_stage_memory_is_the_canonical_orders(name: str) -> None:
    """For random valid splits of real exports, the O(N + E) stage memory equals the memory the
    plan reports (``OrderedCosts`` on the split's canonical order), byte for byte."""
    analysis = export_analysis(name)
    flow, n = analysis.flow, analysis.flow.num_nodes
    ref = next(iter(candidate_orders(flow).values()))
    memory = StageMemory.build(analysis, TARGET, ref)
    rank = np.empty(n, dtype=np.int64)
    rank[ref] = np.arange(n)
    preds = [
        [int(flow.producer[t]) for t in flow.inputs(q) if flow.producer[t] >= 0] for q in range(n)
    ]
    rng = np.random.default_rng(7)
    for _ in range(8):
        k = int(rng.integers(2, 6))
        stage = np.zeros(n, dtype=np.int64)
        for q in flow.topo_order.tolist():
            base = max((int(stage[p]) for p in preds[q]), default=0)
            stage[q] = min(k - 1, base + int(rng.random() < 2.5 * k / n))
        oc = ordered_costs(analysis, TARGET, np.lexsort((rank, stage)))
        bounds = np.concatenate([[0], np.cumsum(np.bincount(stage, minlength=k))])
        for s in range(k):
            if bounds[s + 1] > bounds[s]:
                want = sum(oc.stage_memory(int(bounds[s]), int(bounds[s + 1])))
                assert memory.bytes(stage < s, stage == s) == want


@pytest.mark.parametrize("name", ["tiny_bert", "tiny_gpt2", "tiny_vit", "ppocr_cls"])
def test_contraction_makes_real_exports_solvable(name: str) -> None:
    """Exporter bookkeeping multiplies the ideals past any limit; after contraction the DP runs,
    the group graph is acyclic and only bookkeeping or constant-only nodes share a group."""
    analysis = export_analysis(name)
    assert group_ideals.enumerate_ideals(contract(analysis, enabled=False)) is None
    groups = contract(analysis)
    ideals = group_ideals.enumerate_ideals(groups)
    assert ideals is not None and len(ideals) < group_ideals.MAX_GROUP_IDEALS
    # Acyclic: every predecessor group of a group comes before it in some order (Kahn's drains).
    indegree = [bin(p).count("1") for p in groups.pred]
    ready = [g for g, d in enumerate(indegree) if d == 0]
    seen = 0
    while ready:
        g = ready.pop()
        seen += 1
        for c in groups.succ[g]:
            indegree[c] -= 1
            if indegree[c] == 0:
                ready.append(c)
    assert seen == groups.count
    plan = plan_stages(analysis, TARGET, 4, safety_margin=1.0)
    assert "solve.contracted" in plan.timings_s
    assert f"{groups.count} groups" in plan.claim or plan.method == "neighbourhood"
    # something is contracted: optimal over every split only where the plan meets the bound
    assert groups.merged and plan.proven_optimal == (plan.ratio_to_bound <= 1 + 1e-9)


def _shape_tail(moves: int) -> onnx.ModelProto:
    """x → MatMul → ``moves`` Transposes (no FLOPs, a few bytes: contracted into the MatMul's
    group) → MatMul → y. A chain, so the file order's plan is the best split; it cuts inside the
    Transposes, and the slow link keeps it off the bound."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["t0"], name="mm0")]
    for k in range(moves):
        nodes.append(helper.make_node("Transpose", [f"t{k}"], [f"t{k + 1}"], name=f"move{k}"))
    nodes.append(helper.make_node("MatMul", [f"t{moves}", "w1"], ["y"], name="mm1"))
    graph = helper.make_graph(
        nodes,
        "shape_tail",
        [helper.make_tensor_value_info("x", f, [1, 16])],
        [helper.make_tensor_value_info("y", f, [1, 16])],
        [onnx.numpy_helper.from_array(np.ones((16, 16), np.float32), f"w{k}") for k in (0, 1)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_plan_is_not_proven_optimal_over_splits_that_keep_groups_together() -> None:
    """Past the bit-mask DP (72 nodes), the DP over the contracted graph (2 groups) finds nothing
    faster, but it never looked at a cut inside a group: the order plan is not proven optimal
    (it does not meet the bound either), and the claim says what was searched."""
    analysis = analyze(loaded(_shape_tail(70)), PlanConfig())
    groups = contract(analysis)
    assert analysis.flow.num_nodes == 72 and groups.count == 2
    target = replace(TARGET, op_overhead_s=1e-6, link_bytes_per_s=1e6)
    plan = plan_stages(analysis, target, 2, safety_margin=1.0)
    assert plan.method == "orders" and plan.ratio_to_bound > 1.01
    assert not plan.proven_optimal
    assert "keep the 2 groups of the contracted graph together" in plan.claim


def _uneven_branches(prefix: int) -> onnx.ModelProto:
    """``prefix`` Relus, then a short dear branch (2 MatMuls) beside a long cheap one (4): the best
    2-stage split takes the dear branch's first half and the cheap one's first two, a cut no
    topological order the planner tries makes contiguous."""
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Relu", [f"p{i}" if i else "x"], [f"p{i + 1}"], name=f"r{i}")
        for i in range(prefix)
    ]
    top = f"p{prefix}"
    nodes += [
        helper.make_node("MatMul", [top, "wa1"], ["a1"], name="a1"),
        helper.make_node("MatMul", ["a1", "wa2"], ["a2"], name="a2"),
        helper.make_node("MatMul", [top, "wb1"], ["b1"], name="b1"),
    ]
    nodes += [
        helper.make_node("MatMul", [f"b{i}", f"wb{i + 1}"], [f"b{i + 1}"], name=f"b{i + 1}")
        for i in range(1, 4)
    ]
    nodes.append(helper.make_node("Concat", ["a2", "b4"], ["y"], name="join", axis=1))
    rng = np.random.default_rng(0)
    weights = {"wa1": (64, 64), "wa2": (64, 64), "wb1": (64, 21)}
    weights |= {f"wb{i}": (21, 21) for i in range(2, 5)}
    graph = helper.make_graph(
        nodes,
        "uneven",
        [helper.make_tensor_value_info("x", f, [1, 64])],
        [helper.make_tensor_value_info("y", f, [1, 85])],
        [
            onnx.numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), k)
            for k, s in weights.items()
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_large_graph_gets_a_split_no_order_has() -> None:
    """74 nodes (past the bit-mask DP): the DP over the whole graph beats every candidate order
    and proves its split optimal over every valid split."""
    analysis = analyze(loaded(_uneven_branches(66)), PlanConfig())
    assert analysis.flow.num_nodes > 63
    target = replace(TARGET, op_overhead_s=0.0, link_bytes_per_s=1e12, host_bytes_per_s=1e12)
    plan = plan_stages(analysis, target, 2, safety_margin=1.0)
    orders = [v for name, v in plan.orders_tried.items() if name not in ("ideals", "contracted")]
    assert plan.method == "ideals" and plan.proven_optimal
    assert plan.claim.startswith("optimal over every valid split (DP over all ")
    assert plan.bottleneck_s < min(v for v in orders if v is not None) * 0.99
    stage_of = dict(zip(analysis.flow.node_names, plan.assignment.tolist(), strict=True))
    assert stage_of["a1"] == 0 and stage_of["a2"] == 1  # the dear branch is cut in half,
    assert stage_of["b1"] == 0 and stage_of["b4"] == 1  # the cheap one elsewhere


def _branchy_blocks(blocks: int) -> onnx.ModelProto:
    """``blocks`` × (four parallel MatMul chains of uneven cost and length, concatenated and
    projected back): 4 · 8 · 7 · 6 ideals per block, far past the whole-graph DP's limit."""
    f = TensorProto.FLOAT
    rng = np.random.default_rng(1)
    nodes, inits = [], []
    x = "x"
    branches = ((64, 3), (21, 7), (21, 6), (32, 5))

    def matmul(a: str, shape: tuple[int, int], name: str) -> str:
        inits.append(
            onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), f"w_{name}")
        )
        nodes.append(helper.make_node("MatMul", [a, f"w_{name}"], [name], name=name))
        return name

    for b in range(blocks):
        ends = []
        for r, (width, length) in enumerate(branches):
            t = matmul(x, (64, width), f"b{b}r{r}m0")
            for i in range(1, length):
                t = matmul(t, (width, width), f"b{b}r{r}m{i}")
            ends.append(t)
        nodes.append(helper.make_node("Concat", ends, [f"b{b}cat"], name=f"b{b}cat", axis=1))
        x = matmul(f"b{b}cat", (sum(w for w, _ in branches), 64), f"b{b}proj")
    graph = helper.make_graph(
        nodes,
        "blocks",
        [helper.make_tensor_value_info("x", f, [1, 64])],
        [helper.make_tensor_value_info(x, f, [1, 64])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("devices", [3, 4])
def test_past_the_limits_the_neighbourhood_of_the_order_plan_is_searched(devices: int) -> None:
    """16 blocks of four branches (21,505 ideals): the whole-graph DP gives up, the DP over the
    cuts near the order plan's cuts runs, never loses to the orders, and says what it proved."""
    analysis = analyze(loaded(_branchy_blocks(16)), PlanConfig())
    target = replace(TARGET, op_overhead_s=0.0, link_bytes_per_s=1e12, host_bytes_per_s=1e12)
    assert group_ideals.enumerate_ideals(contract(analysis)) is None
    plan = plan_stages(analysis, target, devices, safety_margin=1.0)
    assert "solve.neighbourhood" in plan.timings_s
    orders = [v for k, v in plan.orders_tried.items() if k in ("file", "depth_first", "level")]
    assert plan.bottleneck_s <= min(v for v in orders if v is not None)
    worst, _ = evaluate(analysis, target, plan.assignment.tolist(), devices)
    assert worst == pytest.approx(plan.bottleneck_s, rel=1e-9)
    if plan.method == "neighbourhood":
        assert "of the previous plan's cuts" in plan.claim and "not proven" in plan.claim
    else:
        assert "of this plan's cuts is 1% faster" in plan.claim


@dag_settings(80)
@given(model=branchy_dags(), k=st.integers(2, 4), pick=st.integers(0, 10**6))
def test_neighbourhood_never_loses_and_is_never_below_the_optimum(
    model: onnx.ModelProto, k: int, pick: int
) -> None:
    """From a random valid split, every round's split is valid, costs what the brute force says
    it costs, beats the start or reports nothing, and is no faster than the true optimum."""
    analysis = analyze(loaded(model), PlanConfig())
    k = min(k, analysis.flow.num_nodes)
    assignments = valid_assignments(analysis, k)
    if assignments is None or k < 2:
        return
    costed = (analysis.costs.flops > 0) | (np.diff(analysis.flow.nw_ptr) > 0)
    require = int(costed.sum()) >= k
    usable = [
        a
        for a in assignments
        if not require or all(costed[np.asarray(a) == s].any() for s in range(k))
    ]
    if not usable:
        return
    first = np.asarray(usable[pick % len(usable)])
    caps = np.full(k, float(TARGET.memory_bytes))
    ref = next(iter(candidate_orders(analysis.flow).values()))
    rank = np.empty(len(ref), dtype=np.int64)
    rank[ref] = np.arange(len(ref))
    start_s = evaluate(analysis, TARGET, first.tolist(), k)[0]
    problem = _problem(analysis, TARGET, caps)
    assert problem.require_costed == require
    near = search_near(
        problem,
        contract(analysis),
        np.lexsort((rank, first)),
        (0, *np.cumsum(np.bincount(first, minlength=k)).tolist()),
        upper_bound=start_s,
    )
    event(f"improved: {near is not None and near.assignment is not None}")
    if near is None or near.assignment is None:
        return
    optimum = min(evaluate(analysis, TARGET, a, k)[0] for a in usable)
    worst, mems = evaluate(analysis, TARGET, near.assignment.tolist(), k)
    assert worst == pytest.approx(near.bottleneck_s, rel=1e-9)
    assert optimum * (1 - 1e-9) <= near.bottleneck_s < start_s
    assert max(mems) <= TARGET.memory_bytes
    producer = analysis.flow.producer
    for q in range(analysis.flow.num_nodes):
        for t in analysis.flow.inputs(q):
            if producer[t] >= 0:
                assert near.assignment[producer[t]] <= near.assignment[q]
