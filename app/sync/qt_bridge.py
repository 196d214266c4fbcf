"""The app's side of sync: a QObject that runs SyncClient in a worker thread (its own asyncio
loop) and reports by signals, which Qt delivers on the main thread (queued connections)."""
from __future__ import annotations

import asyncio
import threading

from PySide6.QtCore import QObject, Signal

from agent.storage.store import Store
from agent.sync.client import SyncClient
from agent.sync.outbox import OutboxEntry


class SyncBridge(QObject):
    entry_changed = Signal(object)  # OutboxEntry
    connection_changed = Signal(bool, str)  # connected, detail (user and role, or the error)
    model_announced = Signal(str, object)  # version, info
    server_identified = Signal(str)  # the key of the server that welcomed us (its lasting id)

    def __init__(self, store: Store, url: str, token: str, parent=None, alias: str | None = None):
        super().__init__(parent)
        self.client = SyncClient(store, url, token, alias=alias)
        self.outbox = self.client.outbox
        self.outbox.subscribe(self._on_entry)  # called on whichever thread changed the row
        self.connection: tuple[bool, str] | None = None  # the last (connected, detail): views made later start right
        self.client.on_connection = self._on_connection
        self.client.on_model_version = lambda v, info: self.model_announced.emit(v, info)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._wake: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()

    def _on_connection(self, up: bool, detail: str) -> None:
        # the state first, then the signals: a view that connects while this runs (on the worker thread)
        # either gets the signal or finds the state (SyncPage.apply_settings, SyncStatusWidget.set_bridge)
        self.connection = (up, detail)
        if up:
            self.server_identified.emit(self.outbox.server)
        self.connection_changed.emit(up, detail)

    def _on_entry(self, entry: OutboxEntry) -> None:
        self.entry_changed.emit(entry)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="tandem-sync", daemon=True)
        self._thread.start()
        self._started.wait(5)

    def _main(self) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._stop, self._wake = asyncio.Event(), asyncio.Event()
        self._started.set()
        try:
            self._loop.run_until_complete(self.client.run_forever(self._stop, self._wake))
        finally:
            self._loop.close()

    def submit(self, episode_ids) -> None:
        """Queue episodes (from the main thread) and wake the worker."""
        for eid in episode_ids:
            self.outbox.submit(eid)
        self.wake()

    def wake(self) -> None:
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None and self._stop is not None and self._thread and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout)
