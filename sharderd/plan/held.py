"""What holds the bottleneck: a cost in the slowest stage that no split can move.

The lower bound (``bounds.py``) names the costs every split pays on one stage whatever it does: a
node's compute plus the graph outputs it sends to the host (``c(v)``), and a graph input's host
transfer plus its cheapest reader. When one of them, in the slowest stage, is at least
``HOLD_SHARE`` of that stage's time, the stage is dominated by something no split can make
cheaper, and more devices or a better balance cannot lower the bottleneck below it: the report
says which cost it is (the host transfer of an output, an op alone, the host transfer of an input)
and what it costs.
"""

from __future__ import annotations

import numpy as np

from sharderd.graph.analyze import Analysis
from sharderd.plan.bounds import node_work
from sharderd.plan.types import BottleneckHolder, Plan
from sharderd.target import Target

__all__ = ["HOLD_SHARE", "held_by"]

HOLD_SHARE = 0.5
"""A cost dominates its stage when it is at least half of the stage's time: then it is more than
all the rest of the stage together, which is the most any split could move."""


def held_by(
    analysis: Analysis, target: Target, compute_s: np.ndarray, plan: Plan
) -> BottleneckHolder | None:
    """The dearest unmovable cost in ``plan``'s slowest stage, when it dominates that stage."""
    flow, tb = analysis.flow, analysis.costs.tensor_bytes
    slowest = plan.slowest_stage
    stage_s = plan.stages[slowest].time_s
    if stage_s <= 0:
        return None
    node_s = node_work(analysis, target, compute_s).node_s
    members = np.flatnonzero(plan.assignment == slowest)
    hbw = target.host_bytes_per_s
    found: BottleneckHolder | None = None
    if len(members):
        v = int(members[np.argmax(node_s[members])])
        outs = flow.outputs(v)
        sent = outs[flow.is_graph_output[outs]]
        sent_bytes = int(tb[sent].sum())
        transfer = sent_bytes / hbw
        kind = "host_output" if transfer >= float(compute_s[v]) else "op"
        found = _holder(
            kind,
            analysis,
            v,
            tuple(flow.tensor_names[t] for t in sent.tolist()) if kind == "host_output" else (),
            sent_bytes if kind == "host_output" else 0,
            float(node_s[v]),
            transfer if kind == "host_output" else 0.0,
            slowest,
            stage_s,
        )
    in_stage = np.zeros(flow.num_nodes, dtype=bool)
    in_stage[members] = True
    for t in np.flatnonzero((flow.producer < 0) & (np.diff(flow.cons_ptr) > 0)).tolist():
        readers = flow.consumers(t)
        first = readers[in_stage[readers]]
        if not len(first) or (plan.assignment[readers] < slowest).any():
            continue  # streamed to another stage (that of its first reader)
        reader = int(readers[np.argmin(node_s[readers])])
        transfer = float(tb[t]) / hbw
        cost = transfer + float(node_s[reader])
        if transfer >= float(node_s[reader]) and (found is None or cost > found.time_s):
            found = _holder(
                "host_input",
                analysis,
                int(first[np.argmin(node_s[first])]),
                (flow.tensor_names[t],),
                int(tb[t]),
                cost,
                transfer,
                slowest,
                stage_s,
            )
    return found if found is not None and found.share >= HOLD_SHARE else None


def _holder(
    kind: str,
    analysis: Analysis,
    node: int,
    tensors: tuple[str, ...],
    nbytes: int,
    time_s: float,
    transfer_s: float,
    stage: int,
    stage_s: float,
) -> BottleneckHolder:
    flow = analysis.flow
    return BottleneckHolder(
        kind=kind,
        node=flow.node_names[node],
        op_type=flow.op_types[node],
        tensors=tensors,
        bytes=nbytes,
        time_s=time_s,
        transfer_s=transfer_s,
        stage=stage,
        share=time_s / stage_s,
    )
