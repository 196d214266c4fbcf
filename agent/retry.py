"""Retrying with exponential backoff: the one schedule (`Backoff`) and the one loop (`retry`,
`retry_async`) behind the endpoint policy's requests, a model download and the sync client's
reconnects. Qt-free; the sleep is injectable, so a test sees the delays without waiting them.
"""
from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class Backoff:
    """Exponential backoff: initial, x`factor` each failure, capped at `maximum`, each delay
    spread by +-`jitter` (a share: 0.2 is +-20%) so that many clients do not retry in step;
    `reset()` after a success starts over."""

    def __init__(self, initial: float = 0.25, maximum: float = 30.0, factor: float = 2.0, jitter: float = 0.2):
        if initial < 0 or maximum < initial or factor < 1 or not 0 <= jitter < 1:
            raise ValueError(f"backoff needs 0 <= initial <= maximum, factor >= 1 and 0 <= jitter < 1; got "
                             f"initial={initial}, maximum={maximum}, factor={factor}, jitter={jitter}")
        self.initial, self.maximum, self.factor, self.jitter = initial, maximum, factor, jitter
        self.attempt = 0

    def next(self) -> float:
        d = min(self.maximum, self.initial * self.factor ** self.attempt)
        self.attempt += 1
        return d * (1 + random.uniform(-self.jitter, self.jitter)) if self.jitter else d

    def reset(self) -> None:
        self.attempt = 0


def retry(fn: Callable[[], T], *, attempts: int, backoff: Backoff, retry_if: Callable[[BaseException], bool],
          sleep: Callable[[float], object] = time.sleep) -> T:
    """fn() until it returns, at most `attempts` calls; an exception that `retry_if` accepts is
    retried after backoff's next delay, any other (and the last attempt's) is raised."""
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    for k in range(attempts):
        try:
            return fn()
        except Exception as e:
            if k == attempts - 1 or not retry_if(e):
                raise
        sleep(backoff.next())
    raise AssertionError("unreachable")


async def retry_async(fn: Callable[[], Awaitable[T]], *, attempts: int, backoff: Backoff,
                      retry_if: Callable[[BaseException], bool],
                      sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> T:
    """`retry` for a coroutine function: await fn() until it returns, at most `attempts` times."""
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    for k in range(attempts):
        try:
            return await fn()
        except Exception as e:
            if k == attempts - 1 or not retry_if(e):
                raise
        await sleep(backoff.next())
    raise AssertionError("unreachable")
