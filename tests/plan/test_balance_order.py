"""Balance beyond the bottleneck on one order (plan/balance_order.py) against a brute force over
every contiguous split of that order: the same slowest stage as the bisection, and the
leximax-least stage times among the splits that fit (the next slowest least, then the next)."""

from __future__ import annotations

import itertools
import math
from unittest import mock

import numpy as np
import onnx
from dag_cases import TARGET, branchy_dags, dag_settings, leximax_key, loaded
from hypothesis import given
from hypothesis import strategies as st

from sharderd import examples
from sharderd.config import PlanConfig
from sharderd.graph.analyze import analyze
from sharderd.plan import balance_order as balance_module
from sharderd.plan.balance_order import balance_order
from sharderd.plan.order import candidate_orders
from sharderd.plan.ordered_costs import OrderedCosts, calibrated_compute_s, ordered_costs
from sharderd.plan.partition import solve


def _contiguous(oc: OrderedCosts, caps: np.ndarray, costed: bool) -> list[list[float]]:
    """Stage times of every split of the order into ``len(caps)`` intervals that fit."""
    out = []
    k = len(caps)
    for cuts in itertools.combinations(range(1, oc.n), k - 1):
        bounds = (0, *cuts, oc.n)
        pairs = list(itertools.pairwise(bounds))
        if any(sum(oc.stage_memory(a, b)) > caps[s] for s, (a, b) in enumerate(pairs)):
            continue
        if costed and not all(oc.costed[a:b].any() for a, b in pairs):
            continue
        out.append([oc.stage_time(a, b) for a, b in pairs])
    return out


@dag_settings(150)
@given(
    model=branchy_dags(),
    k=st.integers(2, 4),
    pinned=st.integers(-1, 11),
    times=st.lists(st.integers(1, 20), min_size=12, max_size=12),
    cap_fraction=st.floats(0.0, 1.0),
    order_pick=st.integers(0, 2),
    narrow=st.booleans(),
)
def test_balance_is_the_leximax_least_contiguous_split(
    model: onnx.ModelProto,
    k: int,
    pinned: int,
    times: list[int],
    cap_fraction: float,
    order_pick: int,
    narrow: bool,
) -> None:
    """A pinned node (one more costly than the rest together; -1: none) makes the slowest stage
    the same in many splits; caps from the tightest that fits to loose make memory decide too.
    ``narrow``: the wide bands count as past the limit, so the pairs come from the second-slowest
    stage's bound (``second_stage.py``) and must give the same split."""
    analysis = analyze(loaded(model), PlanConfig())
    n = analysis.flow.num_nodes
    k = min(k, n)
    measured = np.array([t * 1e-6 for t in times[:n]])
    if pinned >= 0:
        measured[pinned % n] = 1.0
    orders = list(candidate_orders(analysis.flow).values())
    order = orders[order_pick % len(orders)]
    oc = ordered_costs(analysis, TARGET, order, calibrated_compute_s(analysis, TARGET, measured))
    costed = int(oc.costed.sum()) >= k
    loose = np.full(k, float(TARGET.memory_bytes))
    every = _contiguous(oc, loose, costed)
    if not every:
        return
    need = [
        max(sum(oc.stage_memory(a, b)) for a, b in itertools.pairwise((0, *c, oc.n)))
        for c in itertools.combinations(range(1, oc.n), k - 1)
    ]
    caps = np.full(k, float(math.ceil(min(need) + cap_fraction * (max(need) - min(need)))))
    fitting = _contiguous(oc, caps, costed)
    found = solve(oc, caps, require_costed=costed)
    assert found is not None and fitting
    if narrow:
        with mock.patch.object(
            balance_module,
            "candidate_pairs",
            lambda *args: ([], balance_module.MAX_PAIRS + 1),
        ):
            balanced = balance_order(oc, caps, found, require_costed=costed)
    else:
        balanced = balance_order(oc, caps, found, require_costed=costed)
    assert balanced is not None and balanced.balanced
    total = float(oc.prefix_time[-1])
    expected = min(fitting, key=lambda t: leximax_key(t, total))
    got = [oc.stage_time(a, b) for a, b in itertools.pairwise(balanced.bounds)]
    assert leximax_key(got, total) == leximax_key(expected, total)
    assert all(
        sum(oc.stage_memory(a, b)) <= caps[s]
        for s, (a, b) in enumerate(itertools.pairwise(balanced.bounds))
    )
    assert balanced.bottleneck_s <= found.bottleneck_s * (1 + 1e-9)


def test_past_the_pair_limit_the_bisections_split_stands(monkeypatch) -> None:
    """At the limit the wide bands are weighed; one candidate under it, the narrow bands of the
    second-slowest stage's bound are; under both, it gives up (None) and the bisection's split
    stands, rather than a guess called balanced."""
    analysis = analyze(loaded(examples.chain(nodes=40)), PlanConfig())
    order = next(iter(candidate_orders(analysis.flow).values()))
    oc = ordered_costs(analysis, TARGET, order, calibrated_compute_s(analysis, TARGET, None))
    caps = np.full(3, float(TARGET.memory_bytes))
    found = solve(oc, caps, require_costed=True)
    assert found is not None
    calls: list[tuple[str, int]] = []

    def counting(name):  # type: ignore[no-untyped-def]
        real = getattr(balance_module, name)

        def wrapped(*args):  # type: ignore[no-untyped-def]
            rows, total = real(*args)
            calls.append((name, total))
            return rows, total

        return wrapped

    monkeypatch.setattr(balance_module, "candidate_pairs", counting("candidate_pairs"))
    monkeypatch.setattr(balance_module, "one_over_pairs", counting("one_over_pairs"))
    monkeypatch.setattr(balance_module, "MAX_PAIRS", 10**9)
    assert balance_order(oc, caps, found, require_costed=True) is not None
    (wide,) = [t for name, t in calls if name == "candidate_pairs"]
    assert [name for name, _ in calls] == ["candidate_pairs"]
    calls.clear()
    monkeypatch.setattr(balance_module, "MAX_PAIRS", wide)
    assert balance_order(oc, caps, found, require_costed=True) is not None
    assert [name for name, _ in calls] == ["candidate_pairs"]
    calls.clear()
    monkeypatch.setattr(balance_module, "MAX_PAIRS", wide - 1)
    narrow_ok = balance_order(oc, caps, found, require_costed=True)
    assert [name for name, _ in calls] == ["candidate_pairs", "one_over_pairs"]
    narrow = calls[-1][1]
    assert (narrow_ok is not None) == (narrow <= wide - 1)
    calls.clear()
    monkeypatch.setattr(balance_module, "MAX_PAIRS", min(wide, narrow) - 1)
    assert balance_order(oc, caps, found, require_costed=True) is None
