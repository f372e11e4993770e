"""plan/search_state.best_compiled: the compiled plan to keep is ranked by throughput, not latency."""

from __future__ import annotations

from sharderd.plan.content import ContentCorrection
from sharderd.plan.observations import AttemptKey
from sharderd.plan.search_state import Attempt, Started, best_compiled


def Compiled(index: int, predicted_s: float, throughput_per_s: float | None = None) -> Started:
    attempt = Attempt("plan", "plan", 1.0, (1.0,), ContentCorrection(), 0.6)
    key = AttemptKey(f"d{index}", 0.6)
    return Started(index, attempt, key, predicted_s, "ok", None, throughput_per_s)


def test_throughput_wins_where_latency_disagrees() -> None:
    # A balanced split with big boundary copies: slower alone (1.3 ms against 1.0 ms for one
    # batch), faster with batches in flight.
    balanced = Compiled(0, predicted_s=5e-4, throughput_per_s=2000.0)
    lopsided = Compiled(1, predicted_s=6e-4, throughput_per_s=1650.0)
    assert best_compiled([lopsided, balanced], by_measurement=True) is balanced
    assert best_compiled([balanced, lopsided], by_measurement=True) is balanced


def test_prediction_ranks_without_measurements() -> None:
    a = Compiled(0, predicted_s=7e-4)
    b = Compiled(1, predicted_s=6e-4, throughput_per_s=1.0)
    assert best_compiled([a, b], by_measurement=False) is b
    assert (
        best_compiled([a, Compiled(2, predicted_s=7e-4)], by_measurement=True) is a
    )  # nothing measured


def test_ties_keep_the_earlier_attempt() -> None:
    first, second = Compiled(3, 1e-3, 500.0), Compiled(5, 1e-3, 500.0)
    assert best_compiled([second, first], by_measurement=True) is first
    assert best_compiled([second, first], by_measurement=False) is first
    assert best_compiled([], by_measurement=True) is None


def test_measured_throughput_overrules_the_prediction() -> None:
    """Predicted order opposite to the measured rate: a ranking by predicted time (or by anything
    that agrees with it) keeps the wrong plan here."""
    predicted_fast = Compiled(0, predicted_s=4e-4, throughput_per_s=1500.0)
    predicted_slow = Compiled(1, predicted_s=6e-4, throughput_per_s=2100.0)
    unmeasured = Compiled(2, predicted_s=3e-4)
    both = [predicted_fast, predicted_slow, unmeasured]
    assert best_compiled(both, by_measurement=True) is predicted_slow
    assert best_compiled(both, by_measurement=False) is unmeasured
