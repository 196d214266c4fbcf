"""The app's sync pieces: the Qt bridge and the status widget against a real embedded backend;
the Qt-free modules stay Qt-free."""
from __future__ import annotations

import subprocess
import sys

from factories import make_episode
from PySide6.QtCore import QObject, Slot

from agent.schema import Episode
from agent.sync.outbox import Outbox
from app.sync.embedded import start_embedded_backend


def test_sync_modules_do_not_import_qt():
    code = ("import sys; import agent.sync.client, agent.sync.outbox, agent.sync.session, app.sync.embedded, "
            "app.sync.cli, agent.protocol, trainer.backend.server; print('PySide6' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


class StateRecorder(QObject):
    """Every (episode, state) the bridge signals, in the order the main thread receives them."""

    def __init__(self):
        super().__init__()
        self.states: list[tuple[str, str]] = []

    @Slot(object)
    def add(self, entry) -> None:
        self.states.append((entry.episode_id, entry.state))


def test_bridge_and_widget_show_each_state(qtbot, store):
    from app.sync.qt_bridge import SyncBridge
    from app.sync.status_widget import SyncStatusWidget

    url, token, stop = start_embedded_backend(store)
    good = make_episode(store, 3)
    # an episode whose step points at a blob the store lacks: the server can never get it
    broken = Episode.from_dict({**make_episode(store, 1).to_dict(), "id": "broken-episode"})
    broken.steps[0].observation.screenshot = "0" * 64
    store.db["episodes"].upsert(store._episode_row(broken), pk="id")
    store.db["steps"].upsert(store._step_row(broken.id, broken.steps[0]), pk=("episode_id", "idx"))
    bridge = SyncBridge(store, url, token)
    widget = SyncStatusWidget(Outbox(store), bridge)
    qtbot.addWidget(widget)
    # a QObject slot on the main thread, as the widget's: a bare lambda's delivery from the sync
    # thread is not ordered with the widget's, so it could lag behind what the widget shows
    recorder = StateRecorder()
    bridge.entry_changed.connect(recorder.add)
    bridge.start()
    try:
        bridge.submit([good.id, broken.id])
        qtbot.waitUntil(lambda: widget.state_of(good.id) == "synced" and widget.state_of(broken.id) == "failed"
                        and {(good.id, "synced"), (broken.id, "failed")} <= set(recorder.states), timeout=10_000)
    finally:
        bridge.stop()
        stop()
    states = recorder.states
    assert (good.id, "sending") in states and states[-1][1] in ("synced", "failed")
    row = widget._rows[broken.id]
    assert "missing from the local store" in widget.table.item(row, 3).text()
    assert widget.table.cellWidget(widget._rows[good.id], 2).value() == 1000
    assert "1 synced" in widget.summary.text() and "1 failed" in widget.summary.text()
    assert widget.summary.text().startswith("Connected as local (admin) — ")
