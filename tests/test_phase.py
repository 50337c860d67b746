"""A phase mark is one line on the machine's monotonic clock, and nothing at all while the logger is off."""

from __future__ import annotations

import logging
import time

import pytest

from fitevict.phase import log, mark


def test_a_mark_carries_the_model_the_step_and_the_machine_clock(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, log.name)
    before = time.monotonic()
    mark("gemma-3-1b", "release verified")
    after = time.monotonic()
    (rec,) = [r for r in caplog.records if r.name == log.name]
    head, model, *step, at = rec.getMessage().split(" ")
    assert (head, model, " ".join(step)) == ("phase", "gemma-3-1b", "release verified")
    assert before <= float(at) <= after


def test_no_mark_is_written_while_the_logger_is_off(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, log.name)
    log.setLevel(logging.INFO)
    mark("gemma-3-1b", "exited")
    assert [r for r in caplog.records if r.name == log.name] == []
