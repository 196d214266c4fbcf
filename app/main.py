"""Starts the desktop app. The only place that creates the QApplication."""
from __future__ import annotations

import sys
from pathlib import Path

from agent.storage.store import Store, StoreError

LOCK_NAME = "app.lock"  # in the data folder: held while an app has it open


def lock_data_dir(root: Path):
    """(the lock, None) when no other app has the data folder `root` open, else (None, why).
    Two apps on one folder would both sync the same outbox. A QLockFile left by a process that
    is gone (killed, crashed) is stale and taken over, so only a live app refuses another."""
    from PySide6.QtCore import QLockFile

    lock = QLockFile(str(Path(root) / LOCK_NAME))
    lock.setStaleLockTime(0)  # held for the app's whole life: stale only when its process is gone
    if lock.tryLock(0):
        return lock, None
    if lock.error() == QLockFile.LockFailedError:
        pid, host, _ = lock.getLockInfo()
        return None, (f"Tandem is already open on the data folder {root} (process {pid}"
                      f"{' on ' + host if host else ''}): use that window, or close it first. "
                      "To run a second app, give it another data folder (--data DIR).")
    return None, f"the data folder {root} cannot be locked ({lock.error().name}): check that it is writable"


def run_app(args) -> int:
    """Open the main window on the store at args.data (None: the default data directory).
    args.server (may be None) is the sync server URL. Returns the exit status."""
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication, QMessageBox

    from app.main_window import MainWindow  # lazy: PySide6: this module stays light

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Tandem")
    app.setOrganizationName("Tandem")
    app.setStyle("Fusion")
    # the app ends when its main window is closed, not when the last visible window goes: during a
    # Drive run the main window is hidden, and closing the risky-step dialog quit the whole app
    app.setQuitOnLastWindowClosed(False)
    data = getattr(args, "data", None)
    try:
        store = Store(data) if data else Store()
    except (StoreError, OSError) as e:
        print(f"tandem: the data directory cannot be opened: {e}", file=sys.stderr)
        if app.platformName() != "offscreen":  # nobody could answer a dialog there
            QMessageBox.critical(None, "Tandem", f"The data directory cannot be opened:\n{e}")
        return 2
    lock, busy = lock_data_dir(store.root)
    if lock is None:
        store.close()
        print(f"tandem: {busy}", file=sys.stderr)
        if app.platformName() != "offscreen":
            QMessageBox.critical(None, "Tandem", busy)
        return 2
    window = MainWindow(store, server=getattr(args, "server", None), settings=QSettings())
    try:
        window.start_sync()
    except Exception as e:  # the app stays usable offline; say why sync is off
        print(f"tandem: sync is off: {e}", file=sys.stderr)
        window.notify(f"Sync is off: {e}", 15000)
    window.closed.connect(app.quit)
    window.show()
    try:
        return app.exec()
    finally:
        store.close()
        lock.unlock()
