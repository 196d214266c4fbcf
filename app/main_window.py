"""The main window: a sidebar of pages and a status bar with the data location.

Pages are listed once, in PAGES, as (sidebar name, "module:factory"); a factory is called as
factory(store, window) and returns a QWidget. Adding a page is one line here. A page's module
is imported when the page is first shown, so a heavy page costs nothing until it is opened.
"""
from __future__ import annotations

import importlib
import traceback

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QListWidget,
    QMainWindow,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QStackedWidget,
    QWidget,
)

from agent.storage.secret_store import saved_secret
from agent.sync.model_pull import max_pull_bytes, models_dir, pull_model
from agent.sync.outbox import EMBEDDED
from app.run_form import RunForm
from app.sync.embedded import EMBEDDED_TOKEN_KEY, embedded_model_path, start_embedded_backend
from app.sync.qt_bridge import SyncBridge
from app.workers import run_in_background, wait_for_workers

PAGES: list[tuple[str, str]] = [
    ("Library", "app.library_view:LibraryPage"),
    ("Record", "app.record_view:RecordPage"),
    ("Sync", "app.sync_page:SyncPage"),
    ("Train", "app.train_view:TrainPage"),
    ("Supervise", "app.supervise_view:SupervisePage"),
    ("Drive", "app.drive_view:DrivePage"),
]

STYLE = """
QListWidget#sidebar { border: none; background: palette(alternate-base); font-size: 11pt; padding-top: 6px; }
QListWidget#sidebar::item { padding: 9px 14px; border-radius: 4px; margin: 1px 6px; }
QListWidget#sidebar::item:selected { background: palette(highlight); color: palette(highlighted-text); }
QLabel#muted { color: palette(placeholder-text); }
QLabel#title { font-size: 12pt; font-weight: 600; }
QLabel#error { color: #c92a2a; font-weight: 600; }
QPushButton#danger { color: #c92a2a; }
QPushButton#danger:disabled { color: palette(placeholder-text); }
QGroupBox { font-weight: 600; }
"""


def load_factory(spec: str):
    """'package.module:attribute' -> the attribute."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"page factory must look like 'module:attribute', got {spec!r}")
    return getattr(importlib.import_module(module), attr)


def page_failure_text(name: str, error: Exception) -> str:
    """What the page called `name` shows instead of itself when building it raised `error`."""
    missing = getattr(error, "name", None) if isinstance(error, ModuleNotFoundError) else None
    if missing and missing.partition(".")[0] not in ("agent", "app", "trainer"):
        # an installation without an extra: the small bundle, or `pip install tandem`
        return (f"The {name} page needs the package '{missing}', which this installation of Tandem "
                "lacks.\n\nInstall Tandem with its training extras (pip install 'tandem[train]', or "
                "bash packaging/install.sh in a checkout), or use the bundle built with "
                "bash packaging/build.sh --train.")
    return f"The {name} page failed to load:\n\n{''.join(traceback.format_exception(error))}"


class MainWindow(QMainWindow):
    closed = Signal()  # the user closed the window and it let go: the app ends (app.main.run_app)
    sync_changed = Signal()  # sync started, stopped or moved to another server (sync_url, sync)

    def __init__(self, store, server: str | None = None, settings: QSettings | None = None, pages=None):
        super().__init__()
        self.store, self.server, self.settings = store, server, settings
        self.pages_spec = list(PAGES if pages is None else pages)
        self.pages: dict[str, QWidget] = {}
        self.setWindowTitle("Tandem")
        self.setStyleSheet(STYLE)

        self.sidebar = QListWidget()
        self.sidebar.setObjectName("sidebar")
        self.sidebar.setFixedWidth(132)
        self.sidebar.addItems([name for name, _ in self.pages_spec])
        self.stack = QStackedWidget()
        for _ in self.pages_spec:
            self.stack.addWidget(QWidget())  # replaced by the real page when first shown
        self.sidebar.currentRowChanged.connect(self.show_page_at)
        central = QWidget()
        lay = QHBoxLayout(central)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(0)
        lay.addWidget(self.sidebar)
        lay.addWidget(self.stack, 1)
        self.setCentralWidget(central)

        location = QLabel(f"Data: {store.root}")
        location.setTextInteractionFlags(Qt.TextSelectableByMouse)
        location.setToolTip("The data directory (set with --data or $TANDEM_DATA)")
        self.statusBar().addPermanentWidget(location)
        if server:
            self.statusBar().addPermanentWidget(QLabel(f"Server: {server}"))

        # a model version the backend announced, offered until the user switches to it
        self.announced: tuple[str, dict] | None = None
        self.model_btn = QPushButton()
        self.model_btn.setFlat(True)
        self.model_btn.hide()
        self.model_btn.clicked.connect(self.use_announced_model)
        self.statusBar().addPermanentWidget(self.model_btn)
        self.model_progress = QProgressBar()  # a model downloading from the backend
        self.model_progress.setMaximumWidth(140)
        self.model_progress.setTextVisible(False)
        self.model_progress.hide()
        self.statusBar().addPermanentWidget(self.model_progress)

        self.sync = None  # SyncBridge, when sync runs (start_sync)
        self.sync_url: str | None = None
        self._stop_embedded = None

        self._restore_geometry()
        if self.pages_spec:
            self.sidebar.setCurrentRow(0)

    # ------------------------------------------------------------ pages
    def show_page_at(self, row: int) -> None:
        if not 0 <= row < len(self.pages_spec):
            return
        name, spec = self.pages_spec[row]
        if name not in self.pages:
            try:
                page = load_factory(spec)(self.store, self)
            except Exception as e:  # a broken page must not take the app down; say why instead
                page = QPlainTextEdit(page_failure_text(name, e))
                page.setReadOnly(True)
            old = self.stack.widget(row)
            self.stack.insertWidget(row, page)
            self.stack.removeWidget(old)
            old.deleteLater()
            self.pages[name] = page
            self._restore_splitter(name, page)
        self.stack.setCurrentIndex(row)
        if self.sidebar.currentRow() != row:
            self.sidebar.setCurrentRow(row)

    def page(self, name: str) -> QWidget:
        """The page called `name`, built if it was not shown yet."""
        names = [n for n, _ in self.pages_spec]
        if name not in names:
            raise KeyError(f"no page {name!r}; pages: {', '.join(names)}")
        if name not in self.pages:
            current = self.sidebar.currentRow()
            self.show_page_at(names.index(name))
            self.show_page_at(current)
        return self.pages[name]

    def notify(self, text: str, ms: int = 6000) -> None:
        self.statusBar().showMessage(text, ms)

    # ------------------------------------------------------------ announced models
    def model_announced(self, version: str, info) -> None:
        """The backend has a new current model (the flywheel promoted it). A status-bar button
        offers to switch Supervise and Drive to it: at once when the backend runs in this app
        (its folder is here), else after downloading it from the backend, with progress."""
        info = dict(info or {})
        if self.store.get_setting("models.in_use") == version or self._default_model_is(version, info):
            return  # announced again on reconnect, or the default model the agent runs already: in use
        self.announced = (version, info)
        success = info.get("mean_success")
        about = f" (held-out success {100 * success:.0f}%)" if isinstance(success, (int, float)) else ""
        self.model_btn.setEnabled(True)
        self.model_btn.setText(f"Use model {version}")
        here = self._model_here(version)
        if here:
            self.model_btn.setToolTip(f"Switch Supervise and Drive to {here}{about}")
            self.notify(f"New model version {version}{about}: 'Use model {version}' switches the agent to it", 15000)
        else:
            self.model_btn.setToolTip(f"Download {version} from {self.sync_url} and switch Supervise and Drive to it{about}")
            self.notify(f"New model version {version}{about} on the backend: 'Use model {version}' downloads it "
                        "and switches the agent to it", 15000)
        self.model_btn.show()

    def _default_model_is(self, version: str, info: dict) -> bool:
        """Is the announced model the shipped default one (the flywheel's first, copied from it)
        while Supervise and Drive run the default model (no other chosen, none switched to)?"""
        if not info.get("shipped_default") or self.store.get_setting("models.in_use") is not None:
            return False
        return all(self.store.get_setting(f"{p}.policy") in (None, "default") for p in ("supervise", "drive"))

    def _model_here(self, version: str) -> str | None:
        """The announced model's folder when it is on this machine: only with the embedded backend."""
        if self._stop_embedded is None:
            return None

        return embedded_model_path(self.store, version)

    def use_announced_model(self) -> None:
        """Supervise and Drive run the announced model from now on (their forms and settings),
        downloaded first when it lives on a remote backend."""
        if self.announced is None:
            return
        version, _ = self.announced
        here = self._model_here(version)
        if here:
            self._switch_to_model(version, here)
            return

        token = saved_secret(self.store, "sync.token")
        if not self.sync_url or not token:
            self.notify(f"Cannot download {version}: this app is not connected to a backend with a token", 10000)
            return
        self.model_btn.setEnabled(False)
        self.model_btn.setText(f"Downloading {version}…")
        self.model_progress.setValue(0)
        self.model_progress.show()

        def done(res):
            self.model_progress.hide()
            if res.get("endpoint"):
                self._switch_to_endpoint(version, res["endpoint"])
            else:
                self._switch_to_model(version, res["path"])

        def failed(e):
            self.model_progress.hide()
            self.model_btn.setEnabled(True)
            self.model_btn.setText(f"Retry model {version}")
            self.notify(f"Downloading model {version} failed: {e} (a retry resumes where it stopped)", 15000)

        def on_progress(done_kib, total_kib):
            self.model_progress.setMaximum(total_kib)
            self.model_progress.setValue(done_kib)
            self.model_btn.setText(f"Downloading {version}… {done_kib / 1024:.1f} of {total_kib / 1024:.1f} MiB")

        limit = max_pull_bytes(self.store)

        def fetch(progress):  # in KiB: Qt's signal carries 32-bit ints
            return pull_model(self.sync_url, token, models_dir(self.store), version, max_bytes=limit,
                              progress=lambda d, t: progress(d // 1024, max(1, t // 1024)))

        run_in_background(fetch, on_result=done, on_error=failed, on_progress=on_progress)

    def _switch_to_model(self, version: str, path: str) -> None:
        for name, prefix in (("Supervise", "supervise"), ("Drive", "drive")):
            form = getattr(self.pages.get(name), "form", None)
            if form is not None:
                form.use_model(path)
            else:  # not built yet: it reads the settings when it is
                RunForm.remember_model(self.store, prefix, path)
        self.store.set_setting("models.in_use", version)
        self.model_btn.hide()
        self.notify(f"Supervise and Drive now use model {version} ({path})", 10000)

    def _switch_to_endpoint(self, version: str, endpoint: dict) -> None:
        """A model too large to ship: the agent talks to the endpoint the backend names."""
        for name, prefix in (("Supervise", "supervise"), ("Drive", "drive")):
            form = getattr(self.pages.get(name), "form", None)
            if form is not None:
                form.use_endpoint(endpoint.get("url") or "", endpoint.get("model") or "")
            else:
                RunForm.remember_endpoint(self.store, prefix, endpoint.get("url") or "", endpoint.get("model") or "")
        self.store.set_setting("models.in_use", version)
        self.model_btn.hide()
        self.notify(f"Model {version} is too large to download; Supervise and Drive now use it at "
                    f"{endpoint.get('url')}", 15000)

    def announce_target(self) -> tuple[str, str] | None:
        """(url, admin token) of the embedded backend, for the flywheel to announce to; None
        when syncing to a remote server (announcing there takes that server's admin token)."""
        if self._stop_embedded is None or not self.sync_url:
            return None

        token = saved_secret(self.store, EMBEDDED_TOKEN_KEY)
        return (self.sync_url, token) if token else None

    # ------------------------------------------------------------ sync
    def start_sync(self) -> None:
        """Sync to the configured server, or to an embedded backend on loopback when none is."""
        url = self.server or self.store.get_setting("sync.server_url")
        token = saved_secret(self.store, "sync.token")
        alias = url
        if not url:
            url, token, self._stop_embedded = start_embedded_backend(self.store)
            alias = EMBEDDED
        self.sync_url = url
        self.sync = SyncBridge(self.store, url, token or "", alias=alias)
        self.sync.connection_changed.connect(
            lambda up, detail: self.notify(f"Sync: {'connected as ' + detail if up else 'offline: ' + detail}")
        )
        self.sync.model_announced.connect(self.model_announced)
        self.sync.start()
        self.sync_changed.emit()

    def stop_sync(self) -> None:
        if self.sync is not None:
            self.sync.stop()
            self.sync = None
        if self._stop_embedded is not None:
            self._stop_embedded()
            self._stop_embedded = None
        if self.sync_url is not None:
            self.sync_url = None
            self.sync_changed.emit()

    def training_data_dir(self):
        """Where the Train page's flywheel trains: the embedded backend's store (what was synced
        to it) while it runs; this app's own store otherwise (syncing to a remote server, the
        team trains there)."""
        if self._stop_embedded is not None:
            return self.store.root / "backend"
        return self.store.root

    def restart_sync(self) -> None:
        self.server = None  # settings now say where to sync
        self.stop_sync()
        self.start_sync()

    # ------------------------------------------------------------ window state
    def _restore_geometry(self) -> None:
        geo = self.settings.value("main_window/geometry") if self.settings is not None else None
        if geo is not None and self.restoreGeometry(geo):
            return
        screen = QGuiApplication.primaryScreen()
        if screen is None:
            self.resize(1440, 900)
            return
        avail = screen.availableGeometry()
        self.resize(min(1600, int(avail.width() * 0.9)), min(1000, int(avail.height() * 0.9)))

    @staticmethod
    def _splitter_key(name: str) -> str:
        return f"pages/{name}/splitter"

    def _restore_splitter(self, name: str, page: QWidget) -> None:
        """A page's main splitter (its `splitter` attribute) comes back as the user left it."""
        splitter = getattr(page, "splitter", None)
        state = self.settings.value(self._splitter_key(name)) if self.settings is not None else None
        if splitter is not None and state is not None:
            splitter.restoreState(state)

    def closeEvent(self, event) -> None:
        for page in self.pages.values():
            viewer = getattr(page, "viewer", None)
            if viewer is not None and not viewer.confirm_leave():
                event.ignore()
                return
            confirm = getattr(page, "confirm_close", None)  # e.g. a recording still running
            if confirm is not None and not confirm():
                event.ignore()
                return
        if self.settings is not None:
            self.settings.setValue("main_window/geometry", self.saveGeometry())
            for name, page in self.pages.items():
                splitter = getattr(page, "splitter", None)
                if splitter is not None:
                    self.settings.setValue(self._splitter_key(name), splitter.saveState())
        self.notify("Waiting for background tasks to finish…")
        for page in self.pages.values():  # a running agent is stopped; its episode is already saved
            shutdown = getattr(page, "shutdown", None)
            if shutdown is not None:
                shutdown()
        wait_for_workers()  # an export cut off mid-write would leave a half file
        self.stop_sync()
        super().closeEvent(event)
        self.closed.emit()
