"""The Sync page: where this app sends its data (the embedded backend or a server), each
submitted episode's state as that server has it, and buttons to submit episodes. Settings take
effect at once: the sync worker is restarted with the new server and token, and once that server
has answered, the page offers to send it the episodes sent elsewhere that it does not have."""
from __future__ import annotations

from PySide6.QtWidgets import (
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from agent.storage.secret_store import SecretStore
from agent.sync.outbox import Outbox
from agent.wording import plural
from app.sync.status_widget import SyncStatusWidget

SERVER_KEY, TOKEN_KEY = "sync.server_url", "sync.token"


class SyncPage(QWidget):
    def __init__(self, store, window):
        super().__init__()
        self.store, self.window = store, window
        self.outbox = Outbox(store)  # as the server this store syncs to now has it
        self.offer: QMessageBox | None = None  # "send the episodes this server lacks?", after a switch
        self._offer_next_welcome = False

        box = QGroupBox("Server")
        form = QFormLayout(box)
        self.url = QLineEdit(store.get_setting(SERVER_KEY) or "")
        self.url.setPlaceholderText("empty: the embedded backend on this machine")

        self.secrets = SecretStore(store.root)
        self.token = QLineEdit(self.secrets.get(TOKEN_KEY, store) or "")
        self.token.setEchoMode(QLineEdit.Password)
        self.token.setPlaceholderText("the token `backend user add` printed")
        self.current = QLabel(self._describe())
        self.current.setObjectName("muted")
        apply = QPushButton("Save and reconnect")
        apply.clicked.connect(self.apply_settings)
        form.addRow("URL", self.url)
        form.addRow("Token", self.token)
        form.addRow("", self.current)
        apply_row = QHBoxLayout()  # a button, not a bar across the form
        apply_row.addWidget(apply)
        apply_row.addStretch(1)
        form.addRow("", apply_row)

        buttons = QHBoxLayout()
        self.submit_all = QPushButton("Submit all unsynced episodes")
        self.submit_all.clicked.connect(self.submit_unsynced)
        self.retry = QPushButton("Retry now")
        self.retry.clicked.connect(lambda: window.sync and window.sync.wake())
        buttons.addWidget(self.submit_all)
        buttons.addWidget(self.retry)
        buttons.addStretch(1)

        self.status = SyncStatusWidget(self.outbox, getattr(window, "sync", None), describe=store.instruction_of)
        layout = QVBoxLayout(self)
        layout.addWidget(box)
        layout.addLayout(buttons)
        layout.addWidget(self.status, 1)

    def _describe(self) -> str:
        """Where episodes go (whether that works right now is the status line below)."""
        url = getattr(self.window, "sync_url", None)
        if not url:
            return "Sync is off"
        embedded = getattr(self.window, "_stop_embedded", None) is not None
        return f"Sends to {url}" + (" (the backend built into this app)" if embedded else "")

    def submit_unsynced(self) -> None:
        ids = self.outbox.submit_all()
        if self.window.sync is not None:
            self.window.sync.wake()
        for eid in ids:
            e = self.outbox.get(eid)
            if e is not None:
                self.status.update_entry(e)
        self.window.notify(f"Queued {plural(len(ids), 'episode')} for sync")

    def apply_settings(self) -> None:
        self.store.set_setting(SERVER_KEY, self.url.text().strip() or None)
        self.secrets.set(TOKEN_KEY, self.token.text().strip() or None)  # the keyring or a 0600 file
        self.window.restart_sync()
        self.status.set_bridge(self.window.sync)
        self.current.setText(self._describe())
        bridge = self.window.sync
        if bridge is not None:  # what it lacks is known once it has said who it is
            self._offer_next_welcome = True
            bridge.server_identified.connect(self._offer_missing)
            if bridge.connection is not None and bridge.connection[0]:  # it said so before we listened
                self._offer_missing(bridge.outbox.server)

    def _offer_missing(self, _key: str) -> None:
        """Ask whether to send the episodes that went to another server and this one lacks."""
        if not self._offer_next_welcome or self.window.sync is None:
            return
        self._offer_next_welcome = False
        ids = self.outbox.missing()
        if not ids:
            return
        n = len(ids)
        box = QMessageBox(QMessageBox.Question, "Send episodes to this server?",
                          f"{plural(n, 'episode')} sent to another server {'is' if n == 1 else 'are'} not on "
                          f"{self.window.sync_url}. Send {'it' if n == 1 else 'them'} now?",
                          QMessageBox.Yes | QMessageBox.No, self)
        box.setDefaultButton(QMessageBox.Yes)
        box.finished.connect(lambda _r: self._offer_answered(box, ids))
        self.offer = box
        box.open()

    def _offer_answered(self, box: QMessageBox, ids: list[str]) -> None:
        self.offer = None
        box.deleteLater()
        if box.clickedButton() is not box.button(QMessageBox.Yes) or self.window.sync is None:
            return
        self.window.sync.submit(ids)
        self.window.notify(f"Sending {plural(len(ids), 'episode')} to {self.window.sync_url}")
