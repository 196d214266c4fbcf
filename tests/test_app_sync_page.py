"""The app with its embedded backend: episodes submitted from the Sync page reach the backend
(a real websockets server on loopback) and show as synced."""
from __future__ import annotations

from factories import make_episode


def test_embedded_backend_syncs_submitted_episodes(qtbot, store):
    from app.main_window import MainWindow
    from trainer.backend_store import BackendStore

    eps = [make_episode(store, 2), make_episode(store, 3)]
    win = MainWindow(store)
    qtbot.addWidget(win)
    win.start_sync()
    try:
        assert win.sync_url.startswith("ws://127.0.0.1:")
        page = win.page("Sync")
        page.submit_unsynced()
        qtbot.waitUntil(lambda: all(page.status.state_of(e.id) == "synced" for e in eps), timeout=20000)
        assert "synced" in page.status.summary.text() or page.status.summary.text()
    finally:
        win.stop_sync()
    backend = BackendStore(store.root / "backend")
    try:
        for e in eps:
            got = backend.store.load_episode(e.id)
            assert len(got.steps) == len(e.steps)
            assert got.steps[0].observation.screenshot == e.steps[0].observation.screenshot
            assert backend.store.has_blob(e.steps[0].observation.screenshot)
    finally:
        backend.close()


def test_sync_page_saves_server_settings(qtbot, store):
    from app.main_window import MainWindow

    win = MainWindow(store)
    qtbot.addWidget(win)
    page = win.page("Sync")
    page.url.setText("")
    page.token.setText("")
    page.apply_settings()  # empty URL: the embedded backend again
    try:
        assert win.sync is not None and win.sync_url.startswith("ws://127.0.0.1:")
        assert "Connected to ws://127.0.0.1" in page.current.text()
    finally:
        win.stop_sync()
