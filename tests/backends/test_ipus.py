"""The host's IPUs as a counted resource: never more held than the host has, freed on any exit."""

from __future__ import annotations

import anyio
import pytest

from sharderd.backends.ipus import IpuPool


def test_holders_never_exceed_the_total_and_every_one_runs() -> None:
    pool = IpuPool(4)
    most = 0
    done: list[int] = []

    async def use(count: int, tag: int) -> None:
        nonlocal most
        async with pool.hold(count):
            most = max(most, pool.held)
            await anyio.sleep(0.01)
        done.append(tag)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for tag, count in enumerate([2, 4, 2, 3, 1, 4]):
                tg.start_soon(use, count, tag)

    anyio.run(main)
    assert most <= 4 and sorted(done) == [0, 1, 2, 3, 4, 5]
    assert pool.held == 0


def test_a_cancelled_holder_and_a_cancelled_waiter_give_everything_back() -> None:
    pool = IpuPool(4)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            holding = anyio.Event()

            async def holder() -> None:
                async with pool.hold(4):
                    holding.set()
                    await anyio.sleep_forever()

            tg.start_soon(holder)
            await holding.wait()
            with anyio.move_on_after(0.05):
                async with pool.hold(2):  # waits behind the holder, then is cancelled
                    raise AssertionError("granted while all four were held")
            assert pool.held == 4
            tg.cancel_scope.cancel()
        assert pool.held == 0
        async with pool.hold(4):
            assert pool.held == 4

    anyio.run(main)


def test_a_big_waiter_is_not_overtaken_by_later_small_ones() -> None:
    pool = IpuPool(4)
    order: list[str] = []

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            first = anyio.Event()

            async def run(name: str, count: int, started: anyio.Event | None = None) -> None:
                async with pool.hold(count):
                    if started is not None:
                        started.set()
                    order.append(name)
                    await anyio.sleep(0.02)

            tg.start_soon(run, "a2", 2, first)
            await first.wait()
            tg.start_soon(run, "b4", 4)
            await anyio.sleep(0.005)
            tg.start_soon(run, "c2", 2)

    anyio.run(main)
    assert order == ["a2", "b4", "c2"]


def test_too_many_ipus_or_an_unknown_count_cannot_be_held() -> None:
    unknown = IpuPool.of_setting(-1)
    assert unknown.total is None and not unknown.can_hold(1)
    unknown.learn(16)
    unknown.learn(4)  # counted once: the first attempt's answer stands
    assert unknown.total == 16 and unknown.can_hold(16) and not unknown.can_hold(17)
    assert not IpuPool.of_setting(0).can_hold(1)

    async def main() -> None:
        async with IpuPool(2).hold(4):
            pass

    with pytest.raises(ValueError, match="4 IPUs wanted, the host has 2"):
        anyio.run(main)
