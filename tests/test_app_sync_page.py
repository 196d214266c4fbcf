"""The app with its embedded backend: episodes submitted from the Sync page reach the backend
(a real websockets server on loopback) and show as synced."""
from __future__ import annotations

import shutil

from factories import make_episode


def test_embedded_backend_syncs_submitted_episodes(qtbot, store):
    from app.main_window import MainWindow
    from trainer.backend.store import BackendStore

    eps = [make_episode(store, 2, instruction="Rename the report"), make_episode(store, 3, instruction="Open the mail")]
    win = MainWindow(store)
    qtbot.addWidget(win)
    win.start_sync()
    try:
        assert win.sync_url.startswith("ws://127.0.0.1:")
        qtbot.waitUntil(lambda: win.sync.connection is not None and win.sync.connection[0], timeout=20000)
        page = win.page("Sync")  # made after the connection came up: it says so (before: "not connected")
        assert page.status.summary.text().startswith("Connected as "), page.status.summary.text()
        assert page.current.text().startswith("Sends to ws://127.0.0.1:") and "built into this app" in page.current.text()
        page.submit_unsynced()
        qtbot.waitUntil(lambda: all(page.status.state_of(e.id) == "synced" for e in eps), timeout=20000)
        assert "2 synced" in page.status.summary.text()
        names = {page.status.table.item(r, 0).text() for r in range(page.status.table.rowCount())}
        assert names == {e.instruction for e in eps}  # episodes by what they are, not 8 hex digits
        # the Train page trains on what was synced (the embedded backend's store) and says so
        train = win.page("Train")
        assert train.data_dir == store.root / "backend" and str(store.root / "backend") in train.where.text()
        qtbot.waitUntil(lambda: train.status is not None, timeout=60000)
        assert train.status["pools"]["unscored"] == 2 and train.status["store"] == str(store.root / "backend")
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
        assert "Sends to ws://127.0.0.1" in page.current.text()
    finally:
        win.stop_sync()


def test_an_announced_model_reaches_the_idle_app_and_switches_the_agent(qtbot, store, tmp_path):
    """The flywheel announces a promoted model to the embedded backend; the app, connected but
    with nothing to upload, hears it, offers it, and one click makes Supervise and Drive run it."""
    import asyncio

    from app.main_window import MainWindow
    from app.train_view import IterationRun
    from trainer.flywheel.announce import announce_over_wire

    model_dir = tmp_path / "v0002"
    model_dir.mkdir()
    win = MainWindow(store)
    qtbot.addWidget(win)
    supervise = win.page("Supervise")  # built before the switch: its form must follow
    win.start_sync()
    try:
        url, token = win.announce_target()
        assert url == win.sync_url
        run = IterationRun(store.root, 1, announce_to=(url, token))
        assert run.env["TANDEM_BACKEND_URL"] == url and token not in " ".join(run.cmd)
        qtbot.waitUntil(lambda: "Sync: connected" in win.statusBar().currentMessage(), timeout=10000)
        asyncio.run(announce_over_wire(url, token, "v0002", {"path": str(model_dir), "mean_success": 0.4}))
        qtbot.waitUntil(lambda: not win.model_btn.isHidden(), timeout=10000)
        assert win.model_btn.text() == "Use model v0002" and "40%" in win.model_btn.toolTip()
        win.model_btn.click()
        assert win.model_btn.isHidden()
        assert supervise.form.policy.currentData() == "local" and supervise.form.model_dir.text() == str(model_dir)
        drive = win.page("Drive")  # built after: it reads the settings
        assert drive.form.policy.currentData() == "local" and drive.form.model_dir.text() == str(model_dir)
        assert store.get_setting("models.in_use") == "v0002"
        # on reconnect the backend repeats its current model; the one in use is not offered again
        win.stop_sync()
        win.start_sync()
        qtbot.wait(1500)
        assert win.model_btn.isHidden()
    finally:
        win.stop_sync()


def test_a_model_announced_by_a_remote_backend_is_downloaded_with_progress_then_used(qtbot, store, tmp_path):
    """Synced to a backend elsewhere, the announced folder is not this machine's: 'Use model'
    downloads it over the sync protocol with a progress bar, then Supervise and Drive run the copy."""
    from agent.storage.model_files import model_manifest
    from agent.storage.secret_store import SecretStore
    from app.main_window import MainWindow
    from trainer.backend.server_thread import start_in_thread
    from trainer.flywheel.iteration import SHIPPED_MODEL

    served = tmp_path / "server-models" / "v0007"
    shutil.copytree(SHIPPED_MODEL, served)
    bt = start_in_thread(tmp_path / "remote", models={"chunk_bytes": 2**20})
    try:
        token = bt.store.add_user("sup", "supervisor")
        store.set_setting("sync.server_url", bt.url)
        SecretStore(store.root).set("sync.token", token)
        win = MainWindow(store)
        qtbot.addWidget(win)
        supervise = win.page("Supervise")
        seen = []
        win.start_sync()
        try:
            qtbot.waitUntil(lambda: "Sync: connected" in win.statusBar().currentMessage(), timeout=10000)
            win.model_progress.valueChanged.connect(seen.append)
            bt.announce_model("v0007", {"path": str(served), "mean_success": 0.3})
            qtbot.waitUntil(lambda: not win.model_btn.isHidden(), timeout=10000)
            assert win.model_btn.text() == "Use model v0007" and "Download v0007 from ws://" in win.model_btn.toolTip()
            win.model_btn.click()
            assert not win.model_btn.isEnabled() and win.model_btn.text().startswith("Downloading v0007")
            qtbot.waitUntil(lambda: win.model_btn.isHidden(), timeout=60000)
            copy = store.root / "models" / "v0007"
            assert model_manifest(copy)["hash"] == model_manifest(served)["hash"]
            assert supervise.form.policy.currentData() == "local" and supervise.form.model_dir.text() == str(copy)
            assert store.get_setting("drive.model_dir") == str(copy) and store.get_setting("models.in_use") == "v0007"
            assert len(seen) > 2 and seen[-1] == win.model_progress.maximum() and win.model_progress.isHidden()
        finally:
            win.stop_sync()
    finally:
        bt.stop()


def test_a_privacy_hold_names_the_installed_command(qtbot, store, monkeypatch):
    """The Sync page told the user to run `python main.py redact approve …` in an installed app,
    whose command is `tandem`, and called the hold "failed": it is held for privacy review."""
    import sys

    from pii_windows import render_window
    from test_redaction import _recording

    from app.main_window import MainWindow

    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/tandem"])
    ep = _recording(store, render_window(seed=2, size=(300, 120), px=11, records=1).png)  # not reviewed
    win = MainWindow(store)
    qtbot.addWidget(win)
    win.start_sync()
    try:
        page = win.page("Sync")
        page.submit_unsynced()
        qtbot.waitUntil(lambda: page.status.state_of(ep.id) == "held", timeout=20000)
        row = next(r for r in range(page.status.table.rowCount()) if page.status.table.item(r, 0).toolTip() == ep.id)
        detail = page.status.table.item(row, 3).text()
        state = page.status.table.item(row, 1).text()
        summary = page.status.summary.text()
    finally:
        win.stop_sync()
    assert state == "held for privacy review" and "1 held for privacy review" in summary and "1 failed" not in summary
    assert "personal data check needed" in detail and "python main.py" not in detail
    assert f"`tandem redact scan {ep.id}`" in detail and f"`tandem redact approve {ep.id} --by NAME`" in detail
