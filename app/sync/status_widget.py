"""A table of the outbox: each submitted episode's sync state as the current server has it
(queued, sending with progress, synced, changed since sync, not on this server, held for privacy
review or failed, with the reason). Takes the Outbox for the initial rows and a SyncBridge's
entry_changed signal (or anything calling update_entry on the main thread) for changes; rows are
read again when the bridge names the server it reached (reload)."""
from __future__ import annotations

from PySide6.QtWidgets import QHeaderView, QLabel, QProgressBar, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget

from agent.sync.outbox import STATES, Outbox, OutboxEntry, state_label

COLUMNS = ("Episode", "State", "Progress", "Details")
ALWAYS_COUNTED = ("queued", "sending", "synced", "failed")  # the others only when some episode is in them


class SyncStatusWidget(QWidget):
    def __init__(self, outbox: Outbox, bridge=None, parent=None, describe=None):
        super().__init__(parent)
        self.outbox = outbox
        self.describe = describe  # episode id -> what people recognise it by (its instruction)
        self.summary = QLabel()
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.horizontalHeader().setSectionResizeMode(3, QHeaderView.Stretch)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        layout = QVBoxLayout(self)
        layout.addWidget(self.summary)
        layout.addWidget(self.table)
        self._rows: dict[str, int] = {}
        self._states: dict[str, str] = {}
        self.connection = "sync is off" if bridge is None else "connecting…"
        self.set_bridge(bridge)

    def reload(self) -> None:
        """Every row again, as the outbox's server has it (after a switch of server)."""
        self.table.setRowCount(0)
        self._rows.clear()
        self._states.clear()
        for e in self.outbox.entries():
            self.update_entry(e)
        self._update_summary()

    def set_bridge(self, bridge) -> None:
        """Follow a (new) sync bridge, starting from the state it already reached."""
        self.reload()  # the rows as the server it syncs to has them
        if bridge is not None:
            bridge.entry_changed.connect(self.update_entry)
            bridge.connection_changed.connect(self.set_connection)
            bridge.server_identified.connect(self._server_identified)
            if getattr(bridge, "connection", None) is not None:
                self.set_connection(*bridge.connection)
                return
            self.connection = "connecting…"
        else:
            self.connection = "sync is off"
        self._update_summary()

    def _server_identified(self, _key: str) -> None:
        self.reload()

    def set_connection(self, up: bool, detail: str) -> None:
        self.connection = f"connected as {detail}" if up else f"offline: {detail}"
        self._update_summary()

    def update_entry(self, e: OutboxEntry) -> None:
        row = self._rows.get(e.episode_id)
        if row is None:
            row = self.table.rowCount()
            self.table.insertRow(row)
            self._rows[e.episode_id] = row
            name = (self.describe(e.episode_id) if self.describe else None) or e.episode_id[:8]
            self.table.setItem(row, 0, QTableWidgetItem(name))
            self.table.item(row, 0).setToolTip(e.episode_id)
            bar = QProgressBar()
            bar.setRange(0, 1000)
            self.table.setCellWidget(row, 2, bar)
        self._states[e.episode_id] = e.state
        self.table.setItem(row, 1, QTableWidgetItem(e.label))
        bar = self.table.cellWidget(row, 2)
        bar.setValue(1000 if e.state == "synced" else int(e.progress * 1000))
        self.table.setItem(row, 3, QTableWidgetItem(e.detail))
        self._update_summary()

    def state_of(self, episode_id: str) -> str | None:
        return self._states.get(episode_id)

    def _update_summary(self) -> None:
        counts = {s: 0 for s in STATES}
        for s in self._states.values():
            counts[s] = counts.get(s, 0) + 1
        shown = [(s, n) for s, n in counts.items() if n or s in ALWAYS_COUNTED]
        self.summary.setText(f"{self.connection[0].upper()}{self.connection[1:]} — "
                             + ", ".join(f"{n} {state_label(s)}" for s, n in shown))


