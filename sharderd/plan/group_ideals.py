"""The DP over ideals for graphs of hundreds of nodes: over the ideals of the contracted graph.

Same recurrence and cost model as ``ideals.py`` (which stays the exhaustive solver for graphs of
≤ 63 nodes), scaled three ways:

- **Groups** (``contract.py``): the lattice is enumerated over groups, a few thousand ideals for a
  real export instead of millions. The optimum is over splits that keep every group together.
- **An upper bound** from the order search: a pair ``I ⊂ J`` can only matter if its stage is no
  slower than a split already in hand, and ``T(I, J) ≥ P(J) − P(I)``, so for each ``J`` only the
  ideals in a window of ``P`` are tested for containment. Exact: every stage of a better split
  passes the window.
- **Memory by bounds first.** Stage memory is at most the weights of its nodes (shared ones
  counted per reader), every tensor it receives, makes or streams in, and its code; all of these
  are differences of per-ideal sums. A tensor made in place (``graph/buffers.py``) adds no bytes
  to the sum: its input, counted there, dies where it is made, so along a chain of in-place ops
  one buffer is live at a time. A pair under its cap by that bound fits; only the pairs whose
  bound is over the cap *and* whose time would win are measured exactly (``StageMemory``).

Limits (ideals, containment tests, pairs, exact measurements' work) keep it near a second; past them it
returns None and the order search's plan stands.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sharderd.graph.analyze import Analysis
from sharderd.plan.contract import Groups
from sharderd.plan.ideals import IdealSplit
from sharderd.plan.leximax import EMPTY, first_per_group, grid_of, push, quantise
from sharderd.plan.op_costs import node_code_bytes
from sharderd.plan.problem import Problem
from sharderd.plan.stage_memory import StageMemory
from sharderd.target import Target

__all__ = ["MAX_GROUP_IDEALS", "enumerate_ideals", "solve_groups"]

MAX_GROUP_IDEALS = 20_000
"""The lattice of groups, enumerated in Python with its [ideals × groups] membership matrix and
per-ideal sums: what keeps enumeration and sums near a second (BENCHMARKS.md, "The DP over the
whole graph")."""
MAX_CONTAINMENT_WORDS = 60_000_000
"""Σ over ideals of (window size × 64-bit words): the containment tests' work."""
MAX_PAIRS = 6_000_000
"""Nested pairs kept after the window and the bound: two int64 indices and a time each (~140 MB)."""
MAX_EXACT_WORK = 20_000_000
"""Exact stage-memory measurements × (nodes + edges), each measurement O(N + E): ~1 s; so
2,000 measurements on a graph of 5,000 nodes and 5,000 edges (at least 50 on any graph)."""
_BLOCK = 2048


def solve_groups(
    problem: Problem,
    groups: Groups,
    *,
    upper_bound: float = np.inf,
    family: list[int] | None = None,
) -> IdealSplit | None:
    """The best split that keeps groups together and beats ``upper_bound``; None past the limits.

    ``assignment is None`` means no such split (none fits, or none beats ``upper_bound``).
    ``family`` restricts the cuts to those ideals (the empty one first, the whole graph last):
    the optimum is then over the splits whose every cut is in it.
    """
    analysis, target, compute_s, caps = (
        problem.analysis,
        problem.target,
        problem.compute_s,
        problem.caps,
    )
    masks = enumerate_ideals(groups) if family is None else family
    if masks is None:
        return None
    m, g_count = len(masks), groups.count
    words = (g_count + 63) // 64
    packed = np.array(
        [[(x >> (64 * w)) & 0xFFFFFFFFFFFFFFFF for w in range(words)] for x in masks],
        dtype=np.uint64,
    )
    member = np.unpackbits(packed.view(np.uint8), axis=1, bitorder="little")[:, :g_count].astype(
        bool
    )
    # The containment tests' work, from compute time alone (host input only widens no window
    # by much), before the per-ideal tensor sums that cost more than the test itself.
    compute = np.concatenate(
        [
            member[lo : lo + _BLOCK].astype(np.float64)
            @ np.bincount(groups.of_node, weights=compute_s, minlength=g_count)
            for lo in range(0, m, _BLOCK)
        ]
    )
    if _window_work(compute, upper_bound) * words > MAX_CONTAINMENT_WORDS:
        return None
    per = _PerIdeal.build(analysis, target, compute_s, groups, member)
    bw = target.link_bytes_per_s
    u = per.time + per.cut / bw
    v = per.cut / bw - per.time

    pair_i, pair_j = _pairs(packed, per, upper_bound)
    if pair_i is None or pair_j is None:
        return None
    limit = upper_bound * (1 + 1e-9)
    stage_time = u[pair_j] + v[pair_i]
    keep = stage_time <= limit
    if problem.require_costed:
        keep &= per.costed[pair_j] > per.costed[pair_i]
    pair_i, pair_j, stage_time = pair_i[keep], pair_j[keep], stage_time[keep]
    exact_memory = StageMemory.build(analysis, target, problem.reference)
    measured: dict[int, int] = {}
    exact_budget = max(
        50, MAX_EXACT_WORK // (analysis.flow.num_nodes + len(analysis.flow.cons_idx))
    )
    of = groups.of_node

    def memory(p: int) -> int:
        if p not in measured:
            if len(measured) >= exact_budget:
                raise _OverBudget
            i, j = int(pair_i[p]), int(pair_j[p])
            before = member[i][of]
            measured[p] = exact_memory.bytes(before, member[j][of] & ~before)
        return measured[p]

    full, k = m - 1, len(caps)
    step = grid_of(float(per.time[full]))
    best = np.full(m, np.inf)
    best[0] = 0.0
    vec = np.full((m, k), EMPTY, dtype=np.int64)
    parents: list[np.ndarray] = []
    try:
        for s in range(k):
            # Stages 0..s end at J, each within the bound, and the k-1-s after it cover the rest.
            starts = np.isfinite(best) & (per.time[full] - per.time <= (k - s) * limit)
            if s == k - 1:
                rows = np.flatnonzero((pair_j == full) & starts[pair_i])
            else:
                rest = per.time[full] - per.time <= (k - 1 - s) * limit
                ends = (per.time <= (s + 1) * limit) & rest
                rows = np.flatnonzero(ends[pair_j] & starts[pair_i])
            pi, pj = pair_i[rows], pair_j[rows]
            score = np.maximum(best[pi], stage_time[rows])
            # Stage memory: the code term is exact, the rest at most ``loose`` (module docstring).
            code = per.code[pj] - per.code[pi]
            alive = np.isfinite(score) & (score <= limit) & (code <= caps[s])
            loose = per.weights[pj] - per.weights[pi] + per.cut[pi] + per.made[pj] - per.made[pi]
            sure = alive & (loose + code <= caps[s])
            # Per J, the leximax-least fitting row (leximax.py); ties: the cheapest cut, so a
            # stage ends at a layer boundary, not inside a block. Rows are walked in that order:
            # the first sure one fits; those before it whose loose bound is over the cap are
            # measured, best first, until one fits.
            # A row slower than some sure row of its J cannot be the least: weigh only the rest.
            q_score = quantise(score, step)
            least_sure = np.full(m, np.iinfo(np.int64).max)
            np.minimum.at(least_sure, pj[sure], q_score[sure])
            live = np.flatnonzero(alive & (q_score <= least_sure[pj]))
            vectors = push(vec[pi[live]], quantise(stage_time[rows[live]], step))
            order, heads = first_per_group(pj[live], vectors, per.cut[pi[live]])
            sorted_sure = sure[live][order]
            group = np.repeat(np.arange(len(heads)), np.diff(np.r_[heads, len(order)]))
            positions = np.where(sorted_sure, np.arange(len(order)), len(order))
            first_sure = np.minimum.reduceat(positions, heads) if len(heads) else positions[:0]
            pick = np.where(first_sure < len(order), first_sure, -1)
            doubt = np.flatnonzero(~sorted_sure & (np.arange(len(order)) < first_sure[group]))
            decided = np.zeros(len(heads), dtype=bool)
            for p in doubt.tolist():
                g = int(group[p])
                if decided[g]:
                    continue
                if memory(int(rows[live[order[p]]])) <= caps[s]:
                    pick[g] = p
                    decided[g] = True
            pick = pick[pick >= 0]
            chosen = live[order[pick]]
            new = np.full(m, np.inf)
            new[pj[chosen]] = score[chosen]
            new_vec = np.full((m, k), EMPTY, dtype=np.int64)
            new_vec[pj[chosen]] = vectors[order[pick]]
            parent = np.full(m, -1, dtype=np.int64)
            parent[pj[chosen]] = pi[chosen]
            best, vec = new, new_vec
            parents.append(parent)
    except _OverBudget:
        return None
    if not np.isfinite(best[full]):
        return IdealSplit(None, float("inf"), m)
    stage_of_group = np.empty(g_count, dtype=np.int64)
    j = full
    for s in range(k - 1, -1, -1):
        i = int(parents[s][j])
        stage_of_group[member[j] & ~member[i]] = s
        j = i
    return IdealSplit(stage_of_group[groups.of_node], float(best[full]), m)


class _OverBudget(Exception):
    """More exact memory measurements than the limit: the order search's plan stands."""


@dataclass(frozen=True, slots=True)
class _PerIdeal:
    """Sums over each ideal, one array entry per ideal."""

    time: np.ndarray
    """Compute and host I/O of its nodes, seconds."""
    cut: np.ndarray
    """Bytes of the tensors made in it and read outside it."""
    made: np.ndarray
    """Bytes its nodes write, plus the graph inputs it streams in (a loose memory term)."""
    weights: np.ndarray
    """Weight bytes of its nodes, a shared weight once per reader (a loose memory term)."""
    nodes: np.ndarray
    code: np.ndarray
    """Code bytes of its nodes (folded nodes add none)."""
    costed: np.ndarray
    """Its nodes with FLOPs or weights."""

    @classmethod
    def build(
        cls,
        analysis: Analysis,
        target: Target,
        compute_s: np.ndarray,
        groups: Groups,
        member: np.ndarray,
    ) -> _PerIdeal:
        flow, costs = analysis.flow, analysis.costs
        n, g_count = flow.num_nodes, groups.count
        of = groups.of_node
        tb = costs.tensor_bytes.astype(np.int64)
        node_of_out = np.repeat(np.arange(n), np.diff(flow.out_ptr))
        host_out = np.where(flow.is_graph_output[flow.out_idx], tb[flow.out_idx], 0)
        node_time = compute_s.astype(np.float64).copy()
        np.add.at(node_time, node_of_out, host_out / target.host_bytes_per_s)
        out_bytes = analysis.node_new_bytes()
        node_w = np.zeros(n, dtype=np.int64)
        np.add.at(
            node_w,
            np.repeat(np.arange(n), np.diff(flow.nw_ptr)),
            flow.weight_bytes[flow.nw_idx].astype(np.int64),
        )
        costed = ((costs.flops > 0) | (np.diff(flow.nw_ptr) > 0)).astype(np.int64)

        def per_group(values: np.ndarray) -> np.ndarray:
            return np.bincount(of, weights=values.astype(np.float64), minlength=g_count)

        nodes = member.astype(np.int64) @ np.bincount(of, minlength=g_count)
        code = member.astype(np.int64) @ np.bincount(
            of, weights=node_code_bytes(analysis, target), minlength=g_count
        ).astype(np.int64)
        costed_count = member.astype(np.int64) @ np.bincount(of, weights=costed, minlength=g_count)

        # Per tensor, the groups that read it: it leaves ideal J when made in J and read outside.
        counts = np.diff(flow.cons_ptr)
        entry_tensor = np.repeat(np.arange(len(counts)), counts)
        pairs = np.unique(np.stack([entry_tensor, of[flow.cons_idx]], axis=1), axis=0)
        is_input = flow.producer < 0
        origin = np.where(is_input, -1, of[np.maximum(flow.producer, 0)])
        m = len(member)
        cut = np.zeros(m)
        hin = np.zeros(m)
        time = np.zeros(m)
        made = np.zeros(m)
        weights = np.zeros(m)
        group_sums = np.stack(
            [per_group(node_time), per_group(out_bytes), per_group(node_w)], axis=1
        )
        # Only a graph input or a tensor read outside its group can cross a cut: the rest of the
        # (tensor, reader group) pairs would only cost the block sums below their size.
        outside = is_input[pairs[:, 0]] | (pairs[:, 1] != origin[pairs[:, 0]])
        pairs = pairs[np.isin(pairs[:, 0], pairs[outside, 0])]
        t_of, g_of = pairs[:, 0], pairs[:, 1]
        starts = np.flatnonzero(np.r_[True, t_of[1:] != t_of[:-1]]) if len(pairs) else pairs[:0, 0]
        tensors = t_of[starts]
        t_bytes = tb[tensors].astype(np.float64)
        t_input = is_input[tensors]
        for lo in range(0, m, _BLOCK):
            block = member[lo : lo + _BLOCK]
            sums = block.astype(np.float64) @ group_sums
            time[lo : lo + _BLOCK], made[lo : lo + _BLOCK] = sums[:, 0], sums[:, 1]
            weights[lo : lo + _BLOCK] = sums[:, 2]
            if not len(tensors):
                continue
            read = block[:, g_of]
            any_in = np.logical_or.reduceat(read, starts, axis=1)
            all_in = np.logical_and.reduceat(read, starts, axis=1)
            origin_in = np.where(t_input[None, :], any_in, block[:, np.maximum(origin[tensors], 0)])
            cut[lo : lo + _BLOCK] = (origin_in & ~all_in) @ t_bytes
            hin[lo : lo + _BLOCK] = (any_in & t_input[None, :]) @ t_bytes
        time = time + hin / target.host_bytes_per_s
        return cls(
            time=time,
            cut=cut,
            made=made + hin,
            weights=weights,
            nodes=nodes,
            code=code,
            costed=costed_count,
        )


def enumerate_ideals(
    groups: Groups, low: int = 0, high: int | None = None, limit: int | None = None
) -> list[int] | None:
    """The ideals ``X`` with ``low ⊆ X ⊆ high`` by size (``low`` first; with the defaults, every
    ideal, the empty set first and the whole graph last); None past ``limit``.

    ``low`` and ``high`` must be ideals. Each ideal carries the groups that may join it next,
    updated from the joining group's successors, so an ideal costs its own width, not a scan of
    every group."""
    pred, succ = groups.pred, groups.succ
    limit = MAX_GROUP_IDEALS if limit is None else limit
    allowed = (1 << groups.count) - 1 if high is None else high
    start = 0
    for g, p in enumerate(pred):
        if p & ~low == 0 and not low >> g & 1 and allowed >> g & 1:
            start |= 1 << g
    out = [low]
    frontier = {low: start}
    while frontier:
        grown: dict[int, int] = {}
        for ideal, addable in frontier.items():
            rest = addable
            while rest:
                bit = rest & -rest
                rest ^= bit
                new = ideal | bit
                if new in grown:
                    continue
                nxt = addable & ~bit
                for c in succ[bit.bit_length() - 1]:
                    if pred[c] & ~new == 0 and allowed >> c & 1:
                        nxt |= 1 << c
                grown[new] = nxt
        out.extend(grown)
        if len(out) > limit:
            return None
        frontier = grown
    return out


def _windows(time: np.ndarray, upper_bound: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per ``J``, the ideals ``I`` whose time is within ``upper_bound`` below ``J``'s (``T(I, J) ≥
    P(J) − P(I)``): ``by_time[lo[J]:hi[J]]``, with a relative slack for rounding."""
    by_time = np.argsort(time, kind="stable")
    ordered = time[by_time]
    slack = 1e-9 * max(float(time.max(initial=0.0)), 1e-30)
    lo = np.searchsorted(ordered, time - upper_bound * (1 + 1e-9) - slack, side="left")
    hi = np.searchsorted(ordered, time + slack, side="right")
    return by_time, lo, hi


def _window_work(time: np.ndarray, upper_bound: float) -> int:
    """How many candidate ``I`` the windows of ``_pairs`` hold, summed over ``J``."""
    _, lo, hi = _windows(time, upper_bound)
    return int((hi - lo).sum())


def _pairs(
    packed: np.ndarray, per: _PerIdeal, upper_bound: float
) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
    """Every nested pair ``I ⊊ J`` whose stage could be no slower than ``upper_bound``."""
    m, words = packed.shape
    by_time, lo, hi = _windows(per.time, upper_bound)
    if int(((hi - lo) * words).sum()) > MAX_CONTAINMENT_WORDS:
        return None, None
    out_i: list[np.ndarray] = []
    out_j: list[np.ndarray] = []
    total = 0
    for j in range(m):
        cand = by_time[lo[j] : hi[j]]
        cand = cand[per.nodes[cand] < per.nodes[j]]
        inside = ((packed[cand] & ~packed[j]) == 0).all(axis=1)
        found = cand[inside]
        total += len(found)
        if total > MAX_PAIRS:
            return None, None
        out_i.append(found)
        out_j.append(np.full(len(found), j, dtype=np.int32))
    return np.concatenate(out_i).astype(np.int32), np.concatenate(out_j).astype(np.int32)
