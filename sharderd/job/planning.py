"""The plans a job asks of its planning session beyond the one it proves: the device count a
fitting split needs after an overfull plan, and the stages a written model's pieces went to."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sharderd.errors import NoSplitError
from sharderd.graph.load import read_structure
from sharderd.job.session import PlanRequest, PlanSession
from sharderd.plan.fewest import FITTING_SEARCH

__all__ = ["fitting_devices", "piece_stages"]


async def fitting_devices(
    session: PlanSession, request: PlanRequest, nodes: int
) -> tuple[int | None, int]:
    """``engine.fitting_devices`` through the job's planning worker: the fewest devices past
    ``request.devices`` (up to ``FITTING_SEARCH`` more) on which a split fits, and the last tried."""
    last = min(request.devices + FITTING_SEARCH, nodes)
    for count in range(request.devices + 1, last + 1):
        try:
            planned = await session.plan(replace(request, devices=count))
        except NoSplitError:
            continue
        if planned.plan.method != "overfull":
            return count, last
    return None, last


def piece_stages(model_path: Path) -> dict[str, int]:
    """Node name → ``__pipeline_stage`` of the written model (read without its weights)."""
    model = read_structure(model_path)
    return {
        n.name: a.i for n in model.graph.node for a in n.attribute if a.name == "__pipeline_stage"
    }
