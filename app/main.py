"""Starts the desktop app. The only place that creates the QApplication."""
from __future__ import annotations

import sys


def run_app(args) -> int:
    """Open the main window on the store at args.data (None: the default data directory).
    args.server (may be None) is the sync server URL. Returns the exit status."""
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication, QMessageBox

    from agent.store import Store, StoreError
    from app.main_window import MainWindow

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
