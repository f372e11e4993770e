"""A ``Plan`` from a solved split: per-stage memory and time, and the tensors crossing each cut.

Every solver (ideals, orders, least overfull) ends here, so a plan reads the same whichever found it.
"""

from __future__ import annotations

import itertools

import numpy as np

from sharderd.graph.analyze import Analysis
from sharderd.plan.ordered_costs import OrderedCosts, ordered_costs
from sharderd.plan.partition import Partition
from sharderd.plan.problem import Problem
from sharderd.plan.types import CutTensor, Plan, StageCost
from sharderd.target import Target

__all__ = ["build_plan", "canonical_order", "costed_split"]


def build_plan(
    analysis: Analysis,
    oc: OrderedCosts,
    order_name: str,
    partition: Partition,
    target: Target,
    caps: np.ndarray,
    margin: float,
    scale: np.ndarray,
    *,
    bound: float,
    overhead_s: np.ndarray | None = None,
) -> Plan:
    """The plan of ``partition`` along ``oc``'s order, with the caps and corrections it was solved under."""
    flow = analysis.flow
    bounds = partition.bounds
    assignment = np.empty(flow.num_nodes, dtype=np.int64)
    stages = []
    for s, (a, b) in enumerate(itertools.pairwise(bounds)):
        assignment[oc.order[a:b]] = s
        weights, live, code = oc.stage_memory(a, b)
        comm_in = float(oc.cut_bytes[a]) / target.link_bytes_per_s
        comm_out = float(oc.cut_bytes[b]) / target.link_bytes_per_s
        comm = comm_in + comm_out
        total = oc.stage_time(a, b)
        host = 0.0 if oc.host_time is None else float(oc.host_time[a:b].sum())
        overhead = 0.0 if overhead_s is None else float(overhead_s[oc.order[a:b]].sum())
        stages.append(
            StageCost(
                index=s,
                start=a,
                stop=b,
                num_nodes=b - a,
                first_node=flow.node_names[oc.order[a]],
                last_node=flow.node_names[oc.order[b - 1]],
                flops=float(oc.flops[a:b].sum()),
                weight_bytes=weights,
                activation_bytes=live,
                code_bytes=code,
                recv_bytes=int(oc.cut_bytes[a]),
                send_bytes=int(oc.cut_bytes[b]),
                memory_bytes=weights + live + code,
                budget_bytes=int(caps[s]),
                capacity_bytes=target.memory_bytes,
                compute_s=total - comm,
                comm_s=comm,
                time_s=total,
                flops_s=total - comm - host - overhead,
                overhead_s=overhead,
                host_s=host,
                comm_in_s=comm_in,
                comm_out_s=comm_out,
                ops=int(analysis.compiled[oc.order[a:b]].sum()),
            )
        )
    cut_tensors = []
    for c, position in enumerate(bounds[1:-1], start=1):
        crossing = np.flatnonzero(
            (oc.producer_pos >= 0) & (oc.producer_pos < position) & (oc.last_pos >= position)
        )
        for t in crossing.tolist():
            cut_tensors.append(
                CutTensor(c, flow.tensor_names[t], int(analysis.costs.tensor_bytes[t]))
            )
    return Plan(
        devices=len(stages),
        order_name=order_name,
        order=oc.order,
        bounds=bounds,
        assignment=assignment,
        stages=tuple(stages),
        cut_tensors=tuple(cut_tensors),
        bottleneck_s=partition.bottleneck_s,
        lower_bound_s=bound,
        safety_margin=margin,
        memory_scale=tuple(float(x) for x in scale),
    )


def canonical_order(assignment: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Stages one after the other, each in the reference order: how the memory model reads a split."""
    rank = np.empty(len(reference), dtype=np.int64)
    rank[reference] = np.arange(len(reference))
    return np.lexsort((rank, assignment)).astype(np.int64)


def costed_split(problem: Problem, assignment: np.ndarray) -> tuple[OrderedCosts, Partition]:
    """A stage per node as the interval partitioner's result: its canonical order, costed, and
    the stage bounds along it, so any split becomes a plan the way an order's does."""
    order = canonical_order(assignment, problem.reference)
    oc = ordered_costs(problem.analysis, problem.target, order, problem.compute_s)
    bounds = (0, *np.cumsum(np.bincount(assignment, minlength=problem.devices)).tolist())
    partition = Partition(
        bounds=tuple(int(b) for b in bounds),
        bottleneck_s=max(oc.stage_time(a, b) for a, b in itertools.pairwise(bounds)),
        probes=0,
    )
    return oc, partition
