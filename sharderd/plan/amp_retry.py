"""AMP retries: the same split at a lower ``available_memory_proportion``, after the search is
settled (docs/search.md, "When it says ..."). PopART's option caps conv/matmul temporaries per tile,
so a lower cap takes at most the difference off a tile (``memory_model.amp_closing``); a retry is
compiled only when that can close the overflow's gap, one level at a time.

Per stage (``search.amp_per_stage``): PopART reads the option per conv/matmul op too (the FLOAT
attribute ``__available_memory``, ``shard/amp.py``). A lower cap costs speed, and an out-of-memory
text names one device, so the retry lowers that device's stage alone by the closing level (from
the stage's own current cap) and every other stage keeps its level. It builds on the latest
per-stage retry; when that one overflowed on a device it had not lowered, the overflow is not one
stage's, and every stage still above the new level goes down to it (one compile, not one per
stage). An overflow naming no device leaves the decision to the global retry, and so does the
last compile the budget allows (``SearchState.budget``): a per-stage retry bets that the other
stages fit at their level, and a compile after it would be needed to lower the next device that
overflows, so the last one lowers every stage.
"""

from __future__ import annotations

from dataclasses import replace

from sharderd.plan.memory_model import amp_closing, overflow_need
from sharderd.plan.observations import AttemptKey, Observation
from sharderd.plan.search_state import Attempt, SearchState, Started

__all__ = ["amp_retry", "cap_too_small", "stage_retry", "under_global"]


def amp_retry(s: SearchState) -> tuple[Attempt | None, str]:
    """At most one lower AMP per level, on the overflowed split, and only when what the lower cap
    can take off the worst tile closes its gap; else why not (for the "not proven" message)."""
    cfg, settled = s.settings, s.settled
    if not cfg.fallbacks:
        return None, ""
    node = settled.node if settled is not None else None
    need = settled.node_need if settled is not None else 0.0
    if node is not None and amp_closing(need, cfg.default_amp, cfg.fallbacks) is None:
        return None, (
            f"; a lower available_memory_proportion was not tried: {node!r} alone "
            f"needs {need:.2f}× a device, and a cap on temporaries of "
            f"{min(cfg.fallbacks):g} instead of {cfg.default_amp:g} takes at most "
            f"{max(0.0, cfg.default_amp - min(cfg.fallbacks)) * 100:.0f}% of a tile off"
        )
    by_index = {a.index: a for a in s.attempts}
    ooms = [
        (o, by_index[o.attempt])
        for o in s.overflows()
        if o.attempt in by_index and by_index[o.attempt].attempt.kind != "probe"
    ]
    if not ooms:
        return None, ""
    last = len(s.attempts) + 1 >= s.budget()  # no compile left to lower the next device
    if cfg.amp_per_stage and not last and (staged := stage_retry(s, ooms)) is not None:
        return staged
    lowest = min(a.key.amp for _, a in ooms)
    o, base = min(
        ((o, a) for o, a in ooms if a.key.amp == lowest), key=lambda oa: overflow_need(oa[0])
    )
    need = overflow_need(o)
    if o.stage is None:  # no device, so no bytes to judge by: the next level down, if any
        amp = max((a for a in cfg.fallbacks if a < lowest), default=None)
        if amp is None:
            return None, (
                f"; no lower available_memory_proportion is left to try: attempt {base.index}, "
                f"whose overflow named no device, ran at {lowest:g}, the lowest"
            )
    else:
        amp = amp_closing(need, lowest, cfg.fallbacks)
        if amp is None:
            where = f"attempt {base.index}"
            return None, cap_too_small(min(cfg.fallbacks), lowest, o.stage.device, where, need)
    own = under_global(base.attempt.stage_amps, amp)
    if AttemptKey(base.key.digest, amp, own, base.key.serialize) in s.tried():
        return None, ""
    label = f"available_memory_proportion {amp:g}"
    retry = replace(base.attempt, kind="amp", label=label, amp=amp, of=base.index, stage_amps=own)
    return retry, ""


def stage_retry(
    s: SearchState, ooms: list[tuple[Observation, Started]]
) -> tuple[Attempt | None, str] | None:
    """The per-stage retry, or (None, why not) when no level closes the gap; None when the
    overflow to build on named no device (the global retry decides)."""
    cfg = s.settings
    staged = [(o, a) for o, a in ooms if a.attempt.stage_amps is not None]
    if staged:
        o, base = max(staged, key=lambda oa: oa[1].index)
    else:
        at_default = [(o, a) for o, a in ooms if a.key.amp == cfg.default_amp]
        if not at_default:
            return None
        o, base = min(at_default, key=lambda oa: overflow_need(oa[0]))
    amps = list(base.attempt.stage_amps or (base.key.amp,) * len(base.attempt.scale))
    if o.stage is None or len(amps) <= o.stage.device:
        return None
    device, need = o.stage.device, overflow_need(o)
    level = amp_closing(need, amps[device], cfg.fallbacks)
    if level is None:
        where = f"attempt {base.index}, its stage at {amps[device]:g}"
        return None, cap_too_small(min(cfg.fallbacks), amps[device], device, where, need)
    spread = any(a < cfg.default_amp for a in amps) and amps[device] >= cfg.default_amp
    amps[device] = level
    if spread:
        amps = [min(a, level) for a in amps]
    if replace(base.key, stage_amps=tuple(amps)) in s.tried():
        return None, ""
    where = (
        f"every stage above it (device {device} overflowed too)" if spread else f"stage {device}"
    )
    label = f"available_memory_proportion {level:g} on {where}"
    return replace(base.attempt, kind="amp", label=label, stage_amps=tuple(amps), of=base.index), ""


def under_global(stage_amps: tuple[float, ...] | None, amp: float) -> tuple[float, ...] | None:
    """The per-stage levels of a global retry at ``amp`` built on a per-stage attempt: no stage
    above ``amp`` (the retry lowers them all to it), a stage already below keeps its lower level;
    None when every stage is at ``amp`` (the session's option alone)."""
    if stage_amps is None:
        return None
    capped = tuple(min(a, amp) for a in stage_amps)
    return capped if any(a < amp for a in capped) else None


def cap_too_small(cap: float, amp: float, device: int, where: str, need: float) -> str:
    """Why no lower AMP was tried on an overflow (for the "not proven" message): going from
    ``amp`` down to ``cap`` takes at most their difference off a tile, short of ``need``."""
    return (
        f"; a lower available_memory_proportion was not tried: it caps conv/matmul "
        f"temporaries per tile, and even at {cap:g} it takes at most "
        f"{max(0.0, amp - cap) * 100:.0f}% of a tile off device {device}'s worst tile "
        f"({where}), which is {(need - 1) * 100:.0f}% over"
    )
