"""agent.retry: the one backoff schedule and retry loop, with a real callable that fails and then
succeeds, and the delays it slept read through the injected sleep."""
from __future__ import annotations

import asyncio

import pytest

from agent.retry import Backoff, retry, retry_async


class Flaky:
    """Raises `error` on the first `failures` calls, then returns how many calls it took."""

    def __init__(self, failures: int, error: Exception):
        self.failures, self.error, self.calls = failures, error, 0

    def __call__(self):
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return self.calls


def test_retry_sleeps_the_backoff_schedule_and_returns_the_success():
    slept = []
    fn = Flaky(3, ConnectionError("down"))
    got = retry(fn, attempts=5, backoff=Backoff(0.5, 1.5, jitter=0.0), retry_if=lambda e: isinstance(e, ConnectionError),
                sleep=slept.append)
    assert got == 4 and fn.calls == 4
    assert slept == [0.5, 1.0, 1.5]  # doubled each time, capped at the maximum


def test_retry_gives_up_after_its_attempts_and_never_retries_what_it_should_not():
    slept = []
    fn = Flaky(5, ConnectionError("down"))
    with pytest.raises(ConnectionError, match="down"):
        retry(fn, attempts=3, backoff=Backoff(1.0, jitter=0.0), retry_if=lambda e: True, sleep=slept.append)
    assert fn.calls == 3 and slept == [1.0, 2.0]
    fn = Flaky(1, PermissionError("no"))
    with pytest.raises(PermissionError):
        retry(fn, attempts=3, backoff=Backoff(jitter=0.0), retry_if=lambda e: isinstance(e, ConnectionError),
              sleep=slept.append)
    assert fn.calls == 1 and slept == [1.0, 2.0]  # a permanent error is raised at once, without a sleep
    with pytest.raises(ValueError, match="attempts must be at least 1, got 0"):
        retry(fn, attempts=0, backoff=Backoff(), retry_if=lambda e: True)


def test_retry_async_and_the_jitter_stays_in_its_band():
    slept = []

    async def sleep(d):
        slept.append(d)

    flaky = Flaky(2, TimeoutError())

    async def fn():
        return flaky()

    assert asyncio.run(retry_async(fn, attempts=3, backoff=Backoff(0.5, 8.0, jitter=0.0),
                                   retry_if=lambda e: isinstance(e, TimeoutError), sleep=sleep)) == 3
    assert slept == [0.5, 1.0]
    b = Backoff(1.0, 100.0, jitter=0.2)
    delays = [b.next() for _ in range(5)]
    assert all(0.8 * 2 ** k <= d <= 1.2 * 2 ** k for k, d in enumerate(delays)), delays
    b.reset()
    assert 0.8 <= b.next() <= 1.2
    with pytest.raises(ValueError, match="maximum=0.5"):
        Backoff(1.0, 0.5)
