"""Exact min-max split over every valid pipeline split of a small DAG: dynamic programming over ideals.

In a valid split every edge goes to the same or a later stage, so stages 0..s-1 together form an
ideal (a node set closed under predecessors) and stage s is the difference ``J \\ I`` of two
nested ideals (Tarnawski et al., NeurIPS 2020). The DP keeps, per ideal ``J`` and stage count
``s``, the leximax-least split of ``J`` into ``s`` stages that fit their caps (``leximax.py``: the
least bottleneck, then the least next slowest stage, and so on), so the split it returns is
optimal in that order over every valid split, not only in its slowest stage.

The cost model is the planner's own, evaluated on the split's canonical order (stages one after
the other, each in the reference order): stage time ``P(J) - P(I) + (cut(I) + cut(J)) / bw`` where
``P`` sums node time and host I/O (an input is streamed to the stage of its first reader) and
``cut`` counts the tensors leaving an ideal; memory is distinct weights + peak live bytes (tensors
received, produced unless in place, held or passing through) + code per op. Bit masks over at most 63 nodes
keep it vectorised; larger graphs or lattices go to the order search.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sharderd.graph.analyze import Analysis
from sharderd.plan.leximax import EMPTY, grid_of, lexmin, push, quantise
from sharderd.plan.op_costs import node_code_bytes
from sharderd.target import Target

__all__ = ["MAX_IDEALS", "MAX_NODES", "MAX_PAIRS", "MAX_WORK", "IdealSplit", "solve_ideals"]

MAX_NODES = 63
"""Every ideal is one uint64 bit mask, a bit per node (one bit to spare)."""
MAX_IDEALS = 4096
"""The lattice is enumerated in Python and held as an [ideals × nodes] membership matrix: 4,096
(every subset of 12 independent nodes) keeps that small. A DAG of N nodes has at most 2^N."""
MAX_PAIRS = 600_000
"""Nested pairs ``I ⊂ J``, the DP's transitions, each kept as an index: bounds the lists' memory.
A DAG of N nodes has at most 3^N − 2^N (the antichain's: 527,345 at 12 nodes)."""
MAX_WORK = 300_000_000
"""Nested pairs × nodes × tensors: the memory evaluation's element operations (2.5 s of CPU at
the edge: 12 independent nodes with 47 tensors). Only this limit depends on the tensors, so a
DAG within the other three can still be past it (docs/planning.md)."""


@dataclass(frozen=True, slots=True)
class IdealSplit:
    assignment: np.ndarray | None
    """int64 [N]: stage per node; None when no valid split fits the caps (a proof: every split was checked)."""
    bottleneck_s: float
    ideals: int


def _bits(values: np.ndarray) -> np.ndarray:
    return np.left_shift(np.uint64(1), values.astype(np.uint64))


def solve_ideals(
    analysis: Analysis,
    target: Target,
    compute_s: np.ndarray,
    ref_order: np.ndarray,
    caps: np.ndarray,
    *,
    require_costed: bool,
) -> IdealSplit | None:
    """The optimum over all valid splits, or None when the graph is too large for the exact DP."""
    flow, costs = analysis.flow, analysis.costs
    n = flow.num_nodes
    if n > MAX_NODES:
        return None
    rank = np.empty(n, dtype=np.int64)
    rank[ref_order] = np.arange(n)
    producer = flow.producer
    pred = [sum(1 << p for p in ps) for ps in flow.predecessors()]
    in_lists = [flow.inputs(q).tolist() for q in range(n)]
    ideals = _enumerate(pred, n)
    if ideals is None:
        return None
    masks = np.array(ideals, dtype=np.uint64)
    m = len(masks)

    # Tensors that matter: produced ones, and graph inputs someone reads.
    readers = np.zeros(flow.num_tensors, dtype=np.uint64)
    for t in range(flow.num_tensors):
        cons = flow.consumers(t)
        if len(cons):
            readers[t] = np.bitwise_or.reduce(_bits(cons))
    is_input = producer < 0
    keep = ~is_input | (readers != 0)
    origin = np.where(is_input, readers, _bits(np.maximum(producer, 0)))
    tb = costs.tensor_bytes.astype(np.int64)
    t_ids = np.flatnonzero(keep)
    t_origin, t_readers, t_bytes = origin[t_ids], readers[t_ids], tb[t_ids]
    t_input = is_input[t_ids]

    node_time = compute_s.astype(np.float64).copy()
    out_bytes = analysis.node_new_bytes()  # a view or in-place output adds none
    for q in range(n):
        outs = flow.outputs(q)
        host_out = outs[flow.is_graph_output[outs]]
        node_time[q] += float(tb[host_out].sum()) / target.host_bytes_per_s
    bw, hbw = target.link_bytes_per_s, target.host_bytes_per_s

    # Per ideal: P (time up to it) and the bytes leaving it.
    has = lambda a, b: (a & b) != 0  # noqa: E731
    node_bits = _bits(np.arange(n))
    member = has(masks[:, None], node_bits[None, :])  # [m, n]
    p_ideal = member @ node_time
    origin_in = has(masks[:, None], t_origin[None, :])
    reader_out = has(~masks[:, None], t_readers[None, :])
    input_hit = has(masks[:, None], t_readers[None, :]) & t_input[None, :]
    p_ideal += (input_hit * t_bytes[None, :]).sum(1) / hbw
    cut = ((origin_in & reader_out) * t_bytes[None, :]).sum(1)
    u = p_ideal + cut / bw
    v = cut / bw - p_ideal

    w_count = len(flow.weight_bytes)
    wmat = np.zeros((n, max(w_count, 1)), dtype=np.int64)
    for q in range(n):
        wmat[q, flow.weights(q)] = 1
    wbytes = np.zeros(max(w_count, 1), dtype=np.int64)
    wbytes[:w_count] = flow.weight_bytes
    costed_mask = np.uint64(0)
    costed = (costs.flops > 0) | (np.diff(flow.nw_ptr) > 0)
    if costed.any():
        costed_mask = np.bitwise_or.reduce(node_bits[costed])
    low = [
        np.bitwise_or.reduce(node_bits[rank < rank[q]]) if rank[q] > 0 else np.uint64(0)
        for q in range(n)
    ]
    input_reads = [
        [i for i, t in enumerate(t_ids.tolist()) if t_input[i] and t in set(in_lists[q])]
        for q in range(n)
    ]

    subs: list[np.ndarray] = []
    pairs = 0
    for j in range(m):
        sub = np.flatnonzero((masks & masks[j]) == masks)
        subs.append(sub[sub != j])
        pairs += len(subs[-1])
        if pairs > MAX_PAIRS:
            return None
    if pairs * n * max(len(t_ids), 1) > MAX_WORK:
        return None
    mems: list[np.ndarray] = []
    for j in range(m):
        jm, sub = masks[j], subs[j]
        mems.append(
            _stage_memory(
                masks[sub],
                jm,
                n,
                low,
                node_bits,
                t_origin,
                t_readers,
                t_bytes,
                out_bytes,
                input_reads,
                wmat,
                wbytes,
                node_code_bytes(analysis, target),
            )
        )

    full = m - 1  # ideals are enumerated by size: the whole graph is last
    k = len(caps)
    step = grid_of(float(p_ideal[full]))
    best = np.full(m, np.inf)
    best[0] = 0.0
    vec = np.full((m, k), EMPTY, dtype=np.int64)  # leximax of the stages placed (leximax.py)
    parents: list[np.ndarray] = []
    for s in range(k):
        new = np.full(m, np.inf)
        new_vec = np.full((m, k), EMPTY, dtype=np.int64)
        parent = np.full(m, -1, dtype=np.int64)
        targets = [full] if s == k - 1 else range(1, m)
        for j in targets:
            sub = subs[j]
            if not len(sub):
                continue
            stage = u[j] + v[sub]
            score = np.maximum(best[sub], stage)
            ok = np.isfinite(score) & (mems[j] <= caps[s])
            if require_costed:
                ok &= ((masks[j] & ~masks[sub]) & costed_mask) != 0
            if not ok.any():
                continue
            cand = np.flatnonzero(ok)
            vectors = push(vec[sub[cand]], quantise(stage[cand], step))
            # The least leximax (the slowest stage, then the next ...); ties: the cheapest cut,
            # so a stage ends at a layer boundary rather than inside a block.
            pick = lexmin(vectors, cut[sub[cand]])
            new[j] = score[cand[pick]]
            new_vec[j] = vectors[pick]
            parent[j] = sub[cand[pick]]
        best, vec = new, new_vec
        parents.append(parent)
    if not np.isfinite(best[full]):
        return IdealSplit(None, float("inf"), m)
    assignment = np.empty(n, dtype=np.int64)
    j = full
    for s in range(k - 1, -1, -1):
        i = int(parents[s][j])
        assignment[member[j] & ~member[i]] = s
        j = i
    return IdealSplit(assignment, float(best[full]), m)


def _enumerate(pred: list[int], n: int) -> list[int] | None:
    """All ideals, smallest first (the empty set first, the whole graph last); None past the limit."""
    seen = {0}
    frontier = [0]
    out = [0]
    for _ in range(n):
        nxt: list[int] = []
        for ideal in frontier:
            for q in range(n):
                bit = 1 << q
                if not ideal & bit and pred[q] & ideal == pred[q]:
                    grown = ideal | bit
                    if grown not in seen:
                        seen.add(grown)
                        nxt.append(grown)
        if len(seen) > MAX_IDEALS:
            return None
        out.extend(nxt)
        frontier = nxt
    return out


def _stage_memory(
    starts: np.ndarray,
    jm: np.uint64,
    n: int,
    low: list[np.uint64],
    node_bits: np.ndarray,
    t_origin: np.ndarray,
    t_readers: np.ndarray,
    t_bytes: np.ndarray,
    out_bytes: np.ndarray,
    input_reads: list[list[int]],
    wmat: np.ndarray,
    wbytes: np.ndarray,
    code: np.ndarray,
) -> np.ndarray:
    """Bytes of stage ``J \\ I`` for every start ideal ``I`` in ``starts``, as the order model counts them."""
    if not len(starts):
        return np.zeros(0, dtype=np.int64)
    stage = jm & ~starts
    in_stage = (stage[:, None] & node_bits[None, :]) != 0  # [r, n]
    weights = ((in_stage.astype(np.int64) @ wmat) > 0) @ wbytes
    peak = np.zeros(len(starts), dtype=np.int64)
    relevant = (t_origin & jm) != 0
    o, r, b = t_origin[relevant], t_readers[relevant], t_bytes[relevant]
    for q in range(n):
        if not (jm >> np.uint64(q)) & np.uint64(1):
            continue
        here = in_stage[:, q]
        if not here.any():
            continue
        before = starts | (jm & low[q])
        crossing = ((before[:, None] & o[None, :]) != 0) & ((~before[:, None] & r[None, :]) != 0)
        live = (crossing * b[None, :]).sum(1) + out_bytes[q]
        for i in input_reads[q]:
            live += np.where((before & t_readers[i]) == 0, t_bytes[i], 0)
        peak = np.maximum(peak, np.where(here, live, 0))
    return weights + peak + in_stage.astype(np.int64) @ code
