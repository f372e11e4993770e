"""The bit-mask DP's limits at their edges: which small DAGs it solves over every valid split, and
which it leaves to the order search, on graphs just inside and just outside each limit."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from dag_cases import TARGET, loaded
from onnx import TensorProto, helper

from sharderd.config import PlanConfig
from sharderd.graph.analyze import Analysis, analyze
from sharderd.plan.ideals import solve_ideals
from sharderd.plan.order import candidate_orders
from sharderd.plan.ordered_costs import calibrated_compute_s


def _analysis(nodes: list[onnx.NodeProto], inputs: list[str], outputs: list[str]) -> Analysis:
    info = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 4])  # noqa: E731
    graph = helper.make_graph(
        nodes, "limits", [info(x) for x in inputs], [info(y) for y in outputs]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return analyze(loaded(model), PlanConfig())


def _antichain(reads: list[int]) -> Analysis:
    """One ``Sum`` per entry, each reading that many inputs of its own: independent nodes, so
    every subset is an ideal; tensors = the inputs read + one output per node."""
    nodes, inputs = [], []
    for k, count in enumerate(reads):
        mine = [f"x{k}_{i}" for i in range(count)]
        inputs += mine
        nodes.append(helper.make_node("Sum", mine, [f"y{k}"], name=f"sum{k}"))
    return _analysis(nodes, inputs, [f"y{k}" for k in range(len(reads))])


def _chains(count: int, length: int) -> Analysis:
    """``count`` independent chains of ``length`` Relu nodes: (length + 1) ** count ideals."""
    nodes, outputs = [], []
    for c in range(count):
        x = f"x{c}"
        for k in range(length):
            nodes.append(helper.make_node("Relu", [x], [f"c{c}_{k}"], name=f"c{c}_{k}"))
            x = f"c{c}_{k}"
        outputs.append(x)
    return _analysis(nodes, [f"x{c}" for c in range(count)], outputs)


def _exact(analysis: Analysis) -> bool:
    """Whether the bit-mask DP takes the graph (2 devices, memory no object)."""
    reference = next(iter(candidate_orders(analysis.flow).values()))
    found = solve_ideals(
        analysis,
        TARGET,
        calibrated_compute_s(analysis, TARGET, None),
        reference,
        np.full(2, np.inf),
        require_costed=False,
    )
    return found is not None and found.assignment is not None


def test_twelve_independent_nodes_are_solved_exactly_up_to_47_tensors_not_48() -> None:
    """The 12-node antichain has every DAG's most ideals (4,096) and pairs (527,345) at 12 nodes;
    the work limit is pairs × nodes × tensors: 47 tensors are within it, 48 (twelve three-input
    ``Sum`` nodes) are not."""
    assert _exact(_antichain([3] * 11 + [2]))
    assert not _exact(_antichain([3] * 12))


def test_thirteen_independent_nodes_are_past_the_ideals() -> None:
    assert not _exact(_antichain([1] * 13))  # 8,192 ideals; 12 are solved (above)


def test_three_chains_within_the_ideals_can_be_past_the_pairs() -> None:
    """Three chains of 10 (1,331 ideals, 286,165 pairs) are solved; three chains of 15 have 4,096
    ideals, within that limit, and 2,511,360 nested pairs, past the pairs limit."""
    assert _exact(_chains(3, 10))
    assert not _exact(_chains(3, 15))


@pytest.mark.parametrize(("length", "exact"), [(63, True), (64, False)])
def test_a_chain_is_solved_up_to_63_nodes(length: int, exact: bool) -> None:
    assert _exact(_chains(1, length)) is exact
