"""The search's memory model on recorded observation sequences (pure values, no compiles)."""

from __future__ import annotations

from sharderd.plan.memory_model import (
    HOPELESS,
    estimate_scales,
    fit_model,
)
from sharderd.plan.observations import (
    AttemptKey,
    Observation,
    StageView,
    observe,
)
from sharderd.plan.oom import OomInfo
from sharderd.plan.search import (
    SearchState,
    amp_retry,
    learn,
)

TILE = 638_976


def stage(
    device: int, predicted: float, start: int = 0, stop: int = 100, act: float = 0.1
) -> StageView:
    return StageView(device, predicted, act, "file", start, stop)


def oom(attempt: int, st: StageView, measured: float, amp: float = 0.6) -> Observation:
    return Observation(attempt, st, False, measured, amp)


def test_one_device_evidence_stays_on_that_device() -> None:
    """The issue's sequence: device 0's scale does not grow when other devices run out of memory."""
    obs = [oom(0, stage(0, 0.6), 0.6 * 1.657)]
    first = fit_model(obs, 7, amp=0.6).scales(1.15)[0]
    obs += [oom(1, stage(3, 0.6, 300, 400), 0.6 * 2.1), oom(2, stage(5, 0.6, 500, 600), 0.6 * 1.3)]
    model = fit_model(obs, 7, amp=0.6)
    assert model.scales(1.15)[0] == first
    assert model.systemic is None  # 2.1 and 1.3 are not the same ratio
    assert model.scales(1.15)[1] == 1.0


def test_same_ratio_on_several_devices_is_one_bounded_systemic_factor() -> None:
    obs = [oom(0, stage(0, 0.6), 0.6 * 1.40), oom(1, stage(2, 0.6, 200, 300), 0.6 * 1.50)]
    model = fit_model(obs, 4, amp=0.6)
    assert model.systemic == 1.40
    again = fit_model([*obs, oom(2, stage(0, 0.5, 0, 80), 0.5 * 1.40)], 4, amp=0.6)
    assert again.scales(1.15)[1] == model.scales(1.15)[1]  # applied once, not compounded


def test_noise_never_makes_an_affine_fit() -> None:
    """0.80 → 0.70 with 1.10 → 1.09 and 0.80 → 0.75 with 1.10 → 1.08: the ratio rule, not 1e6 or 4.08."""
    for (p1, m1), (p2, m2) in (((0.80, 1.10), (0.70, 1.09)), ((0.80, 1.10), (0.75, 1.08))):
        obs = [oom(0, stage(0, p1, 0, 80), m1), oom(1, stage(0, p2, 0, 70), m2)]
        model = fit_model(obs, 2, amp=0.6)
        assert model.devices[0].intercept == 0.0
        assert model.scales(1.15)[0] < 1.7


def test_an_affine_fit_needs_overlapping_stages() -> None:
    apart = [oom(0, stage(0, 0.8, 0, 80), 1.5), oom(1, stage(0, 0.4, 200, 240), 1.3)]
    assert fit_model(apart, 2, amp=0.6).devices[0].intercept == 0.0
    nested = [oom(0, stage(0, 0.8, 0, 80), 1.5), oom(1, stage(0, 0.4, 0, 40), 1.3)]
    device = fit_model(nested, 2, amp=0.6).devices[0]
    assert device.intercept > 1.0 and device.scale(1.15) == HOPELESS
    assert estimate_scales(fit_model(nested, 2, amp=0.6))[0] == HOPELESS


def test_a_later_fit_with_headroom_brings_the_scale_down() -> None:
    obs = [oom(0, stage(0, 0.6), 1.2)]
    high = fit_model(obs, 2, amp=0.6).scales(1.15)[0]
    obs.append(Observation(1, stage(0, 0.5, 0, 80), True, 0.8, 0.6))
    assert fit_model(obs, 2, amp=0.6).scales(1.15)[0] < high


def test_amp_retry_only_when_its_share_closes_the_gap() -> None:
    short = oom(0, stage(0, 0.9, act=0.05), 1.05)
    assert amp_retry(short, 0.6, (0.3, 0.1)) is None
    conv = oom(0, stage(0, 0.9, act=0.6), 1.05)
    assert amp_retry(conv, 0.6, (0.3, 0.1)) == 0.3


def test_observe_and_learn_keep_every_observation() -> None:
    views = (stage(0, 0.7), stage(1, 0.5, 100, 200))
    new = observe(
        0,
        views,
        kind="oom",
        amp=0.6,
        oom=OomInfo("tile", 1, 30, int(1.2 * TILE), TILE),
        tile_bytes=TILE,
    )
    assert [o.device for o in new] == [1] and abs((new[0].measured or 0) - 1.2) < 1e-5
    state = SearchState(2, 1.15, 0.6, observations=new)
    assert state.scales()[0] == 1.0 and state.scales()[1] > 1.0


def test_an_oom_at_a_lower_amp_rules_the_split_out_at_the_default_too() -> None:
    """Lowering available_memory_proportion only lowers memory: the split that ran out at 0.3 is
    marked tried at 0.6 as well; its bytes stay evidence at 0.3 only."""
    state = SearchState(2, 1.15, 0.6)
    low = AttemptKey("abc", 0.3)
    after, _ = learn(state, low, [oom(0, stage(0, 0.8), 1.02, amp=0.3)])
    assert low in after.tried and AttemptKey("abc", 0.6) in after.tried
    assert after.model().devices[0].source == "prior"  # the default's model is unchanged
    fitted, _ = learn(state, AttemptKey("abc", 0.6), [oom(0, stage(0, 0.8), 1.02)])
    assert fitted.tried == {AttemptKey("abc", 0.6)}
