"""A backend on its own event loop in a background thread: the app's embedded backend, tests."""
from __future__ import annotations

import asyncio
import threading

from trainer.backend.server import BackendServer
from trainer.backend.store import BackendStore


class BackendThread:
    """A backend running on its own event loop in a background thread (the app's embedded
    backend, tests). `port` is the bound port, `url` the ws:// address."""

    def __init__(self, data_dir, host: str = "127.0.0.1", port: int = 0, **kw):
        self.server = BackendServer(data_dir, host, port, **kw)
        self.loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="tandem-backend", daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        except BaseException as e:  # reported to start()'s caller
            self._error = e
            self._ready.set()
        finally:
            self.loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        await self.server.start()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await self.server.stop()

    def start(self, timeout: float = 10.0) -> BackendThread:
        self.thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"the backend did not start within {timeout} s")
        if self._error:
            raise RuntimeError(f"the backend failed to start: {self._error}") from self._error
        return self

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        scheme = "wss" if self.server.ssl else "ws"
        return f"{scheme}://{self.server.host}:{self.port}"

    @property
    def store(self) -> BackendStore:
        return self.server.store

    def call(self, fn, *args):
        """Run fn(*args) on the server's loop and return its result (thread-safe)."""
        async def run():
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def announce_model(self, version: str, info: dict | None = None) -> None:
        self.server.store.announce_model(version, info or {})
        self.call(self.server.announce_model, version, info)

    def stop(self, timeout: float = 30.0) -> None:
        if self.thread.is_alive() and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
            self.thread.join(timeout)


def start_in_thread(data_dir, host: str = "127.0.0.1", port: int = 0, **kw) -> BackendThread:
    """Start a backend on a background thread; returns once it listens (port 0: any free port)."""
    return BackendThread(data_dir, host, port, **kw).start()
