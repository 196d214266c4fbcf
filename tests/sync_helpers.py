"""What the sync server tests share beside conftest's `backend`: a local store, and one sync of a
store as one of the backend's users."""
from __future__ import annotations

import asyncio
import time

from agent.storage.store import Store
from agent.sync.client import Backoff, SyncClient


def local(tmp_path, name="local") -> Store:
    return Store(tmp_path / name)


def sync(store, backend, user="ann", **kw):
    client = SyncClient(store, backend.url, backend.tokens[user], backoff=Backoff(0.05, 0.2), **kw)
    return asyncio.run(client.sync(deadline=time.monotonic() + 20))
