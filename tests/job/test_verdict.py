"""job/verdict.fewest_devices: the smallest device count with a split, found by doubling and
halving, compared with a walk over every count."""

from __future__ import annotations

from typing import Any

import pytest

from sharderd.errors import ConfigError, NotProvenError
from sharderd.job.session import PlanRequest
from sharderd.job.verdict import fewest_devices


class _Session:
    """A model with a split from ``first`` devices on, and nodes for at most ``most``."""

    def __init__(self, first: int | None, most: int) -> None:
        self.first, self.most, self.asked = first, most, []

    async def plan(self, request: PlanRequest) -> Any:
        n = request.devices
        self.asked.append(n)
        if n > self.most:
            raise ConfigError(f"{n} devices for {self.most} nodes")
        if self.first is None or n < self.first:
            raise NotProvenError("no split")
        return None


@pytest.mark.anyio
@pytest.mark.parametrize("devices", [1, 2, 5])
@pytest.mark.parametrize("most", [6, 7, 13, 40])
async def test_fewest_devices_matches_a_walk_over_every_count(devices: int, most: int) -> None:
    for first in [None, *range(devices + 1, most + 2)]:
        session = _Session(first, most)
        found = await fewest_devices(session, lambda n: PlanRequest(n, 1.0), devices)  # type: ignore[arg-type]
        walk = next((n for n in range(devices + 1, most + 1) if first and n >= first), None)
        assert found == walk, (first, most, session.asked)
        assert len(session.asked) <= 2 * max(1, most - devices).bit_length() + 1
