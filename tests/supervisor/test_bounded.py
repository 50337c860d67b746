"""A shutdown step that hangs is cut at its limit, and the log names what it was waiting on."""

from __future__ import annotations

import asyncio
import logging

import pytest

from fitevict.supervisor.bounded import bounded


def test_a_step_that_ends_in_time_is_awaited_whole() -> None:
    asyncio.run(_ends_in_time())


async def _ends_in_time() -> None:
    done = asyncio.Event()

    async def step() -> None:
        done.set()

    assert await bounded("a quick step", step(), 5.0) is True
    assert done.is_set()


def test_a_hung_step_is_cut_at_its_limit_and_named(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "fitevict.shutdown")
    asyncio.run(_hung(caplog))


async def _hung(caplog: pytest.LogCaptureFixture) -> None:
    never = asyncio.Event()

    async def held() -> None:
        await never.wait()

    waiter = asyncio.create_task(held(), name="held-record")
    assert await bounded("the records under way", asyncio.wait([waiter]), 0.05, [waiter]) is False
    line = caplog.records[-1].getMessage()
    assert "the records under way did not end within 0.1 s" in line
    assert "held-record (_hung.<locals>.held)" in line
    assert "test_bounded.py:" in line  # where it was suspended
    waiter.cancel()
