"""What each server has: the app's sync state is per server (its id from the welcome), an edit
after upload is sent again without a click, switching to another server offers what it lacks,
and an unreachable server reads as one clear line. Real app widgets (pytest-qt) and real
backends on loopback."""
from __future__ import annotations

import asyncio
import socket
import time

from factories import make_episode
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from agent.sync.client import SyncClient
from agent.sync.outbox import Outbox
from trainer.backend.server_thread import start_in_thread
from trainer.backend.store import BackendStore


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sync_cell(library, episode_id: str) -> str:
    library.refresh()
    return library.proxy.index(library._row_of(episode_id), 6).data()


def _window(qtbot, store):
    from app.main_window import MainWindow

    win = MainWindow(store)
    qtbot.addWidget(win)
    win.start_sync()
    qtbot.waitUntil(lambda: win.sync.connection is not None and win.sync.connection[0], timeout=20000)
    return win


def test_an_outcome_marked_after_upload_reaches_the_backend_without_a_click(qtbot, store):
    """The issue: submitted at revision 1, marked a success in the Library, the local store went
    to revision 2; nothing was re-queued and the Sync page kept "synced, revision 1"."""
    ep = make_episode(store, 2, instruction="Rename the report")
    win = _window(qtbot, store)
    try:
        page, library = win.page("Sync"), win.page("Library")
        page.submit_unsynced()
        qtbot.waitUntil(lambda: page.status.state_of(ep.id) == "synced", timeout=20000)
        first = Outbox(store).get(ep.id).revision
        assert _sync_cell(library, ep.id) == "synced"
        library.mark_outcome(True, [ep.id])  # the Library's own action; no submit afterwards
        assert store.load_episode(ep.id).revision == first + 1
        assert "changed since sync" in _sync_cell(library, ep.id)  # re-queued once the edits are quiet
        qtbot.waitUntil(lambda: Outbox(store).get(ep.id).revision == first + 1
                        and page.status.state_of(ep.id) == "synced", timeout=30000)
        assert _sync_cell(library, ep.id) == "synced"
        row = page.status._rows[ep.id]
        assert page.status.table.item(row, 3).text().endswith(f"revision {first + 1}")
    finally:
        win.stop_sync()
    backend = BackendStore(store.root / "backend")
    try:
        got = backend.store.load_episode(ep.id)
    finally:
        backend.close()
    assert got.revision == first + 1 and got.outcome.success is True and got.outcome.source == "annotator"


def _team_server(tmp_path):
    """A second (team) backend and the token of its annotator ann."""
    team = start_in_thread(tmp_path / "team")
    return team, team.store.add_user("ann", "annotator")


def _window_with_synced(qtbot, store, eps):
    """The main window with every episode of `eps` submitted and synced to its built-in backend:
    (window, its Sync page); the caller stops its sync."""
    win = _window(qtbot, store)
    try:
        page = win.page("Sync")
        page.submit_unsynced()
        qtbot.waitUntil(lambda: all(page.status.state_of(e.id) == "synced" for e in eps), timeout=20000)
    except BaseException:
        win.stop_sync()
        raise
    return win, page


def test_the_offer_comes_when_the_new_server_answered_before_the_page_listened(qtbot, store, tmp_path):
    """The sync thread may be welcomed by the new server before apply_settings connects to its
    signal (a loaded machine): the page then finds the state and offers all the same."""
    eps = [make_episode(store, 2, instruction="Rename the report")]
    team, token = _team_server(tmp_path)
    try:
        win, page = _window_with_synced(qtbot, store, eps)
        try:
            restart = win.restart_sync

            def restart_and_wait_for_the_welcome():  # the worker wins the race, every time
                restart()
                deadline = time.monotonic() + 20
                while not (win.sync.connection and win.sync.connection[0]) and time.monotonic() < deadline:
                    time.sleep(0.02)

            win.restart_sync = restart_and_wait_for_the_welcome
            page.url.setText(team.url)
            page.token.setText(token)
            page.apply_settings()
            qtbot.waitUntil(lambda: page.offer is not None and page.offer.isVisible(), timeout=20000)
            assert "1 episode sent to another server is not on " + team.url in page.offer.text()
            page.offer.button(QMessageBox.No).click()
        finally:
            win.stop_sync()
    finally:
        team.stop()


def test_switching_to_a_second_backend_offers_and_sends_every_episode(qtbot, store, tmp_path):
    """The issue: pointed at a team server, episodes synced to the built-in backend stayed
    "synced", "Submit all unsynced episodes" skipped them, and the team server got none."""
    eps = [make_episode(store, 2, instruction="Rename the report"), make_episode(store, 3, instruction="Open the mail")]
    team, token = _team_server(tmp_path)
    try:
        win, page = _window_with_synced(qtbot, store, eps)
        try:
            supervise = win.page("Supervise")
            assert supervise.server.text() == win.sync_url  # Watch a run: the embedded backend for now
            page.url.setText(team.url)
            page.token.setText(token)
            page.apply_settings()
            qtbot.waitUntil(lambda: page.offer is not None and page.offer.isVisible(), timeout=20000)
            assert "2 episodes sent to another server are not on " + team.url in page.offer.text()
            assert all(page.status.state_of(e.id) == "missing" for e in eps)
            assert "2 not on this server" in page.status.summary.text()
            assert supervise.server.text() == team.url and supervise.token.text() == token  # follows the switch
            qtbot.mouseClick(page.offer.button(QMessageBox.Yes), Qt.LeftButton)
            qtbot.waitUntil(lambda: all(page.status.state_of(e.id) == "synced" for e in eps), timeout=20000)
            assert page.offer is None
        finally:
            win.stop_sync()
        for e in eps:  # every episode on the team server, and still on the built-in one
            assert team.store.store.has_episode(e.id)
        assert Outbox(store).server == team.store.server_id
    finally:
        team.stop()
    embedded = BackendStore(store.root / "backend")
    try:
        assert all(embedded.store.has_episode(e.id) for e in eps)
        embedded_id = embedded.server_id
    finally:
        embedded.close()
    assert embedded_id != team.store.server_id
    from agent.sync.outbox import ACKS

    assert {r["server"] for r in store.query(f"SELECT server FROM {ACKS}")} == {embedded_id, team.store.server_id}


def test_the_sync_page_offline_and_watch_a_run_say_one_clear_line(qtbot, store):
    """Offline, the Sync page showed a Python exception; Watch a run a raw ConnectionRefusedError."""
    from agent.storage.secret_store import SecretStore
    from app.main_window import MainWindow

    url = f"ws://127.0.0.1:{_closed_port()}"
    store.set_setting("sync.server_url", url)
    SecretStore(store.root).set("sync.token", "some-token")
    win = MainWindow(store)
    qtbot.addWidget(win)
    win.start_sync()
    try:
        page = win.page("Sync")
        qtbot.waitUntil(lambda: page.status.summary.text().startswith("Offline"), timeout=20000)
        line = page.status.summary.text().partition(" — ")[0]
        assert line == f"Offline: cannot reach {url}: connection refused (is the server running, and is the port right?)"
        supervise = win.page("Supervise")
        assert supervise.server.text() == url
        supervise.run_id.setText("r1")
        supervise.watch_btn.click()
        said = supervise.claim_label.text()
    finally:
        win.stop_sync()
    assert said.startswith(f"Cannot watch: cannot reach {url}: connection refused") and "Error" not in said


def test_an_old_single_server_state_belongs_to_the_url_it_was_saved_for(store, tmp_path):
    """A store from before: one outbox, 'synced' meaning the configured server. Migrated, that
    server (reached at the saved URL) keeps it as synced under its id; another server lacks it."""
    from agent.sync.outbox import ACKS, MIGRATIONS, TABLE

    team = start_in_thread(tmp_path / "team")
    try:
        token = team.store.add_user("ann", "annotator")
        old, new = make_episode(store, 2), make_episode(store, 1)
        store.migrate(TABLE, MIGRATIONS[:1])  # the table as the release before this one made it
        store.execute(f"INSERT INTO {TABLE} (episode_id, state, revision, content_hash, ack_status, attempts, queued_at, "
                      "updated_at) VALUES (?, 'synced', ?, 'h', 'stored', 1, 0, 0)", [old.id, old.revision])
        store.set_setting("sync.server_url", team.url)
        outbox = Outbox(store)  # migrates
        assert store.query(f"SELECT server, revision FROM {ACKS}") == [{"server": team.url, "revision": old.revision}]
        outbox.submit(new.id)
        client = SyncClient(store, team.url, token)
        assert asyncio.run(client.sync(deadline=time.monotonic() + 20)).ok
        assert Outbox(store).server == team.store.server_id
        assert [(e.episode_id, e.state) for e in Outbox(store).entries()] == [(old.id, "synced"), (new.id, "synced")]
        assert store.get_setting("sync.server_ids") == {team.url: team.store.server_id}
        # the same server at another address is still the same server
        again = Outbox(store, store.get_setting("sync.server_ids")[team.url])
        assert again.missing() == [] and Outbox(store, "another-server").missing() == [old.id, new.id]
    finally:
        team.stop()


def test_cli_submit_all_and_sync_follow_the_server(store, tmp_path, capsys):
    """`tandem submit --all` skipped episodes synced to another server; now it queues what the
    server the data folder syncs to lacks, and `sync` sends episodes edited since."""
    from main import main

    ep = make_episode(store, 2)
    first, second = start_in_thread(tmp_path / "one"), start_in_thread(tmp_path / "two")
    try:
        tokens = [b.store.add_user("ann", "annotator") for b in (first, second)]
        data = ["--data", str(store.root)]
        assert main(["submit", ep.id, *data]) == 0
        assert main(["sync", *data, "--server", first.url, "--token", tokens[0]]) == 0
        assert main(["sync", *data, "--server", second.url, "--token", tokens[1]]) == 0  # nothing queued
        assert "1 episode sent to another server is not on this one: `python main.py submit --all`" in capsys.readouterr().out
        assert main(["submit", "--all", *data]) == 0
        assert "queued 1 episode(s)" in capsys.readouterr().out
        assert main(["sync", *data, "--server", second.url, "--token", tokens[1]]) == 0
        assert second.store.store.has_episode(ep.id)
        store.update_episode_fields(ep.id, instruction="Renamed after upload")  # an edit: revision 2
        assert main(["sync", *data, "--server", second.url, "--token", tokens[1]]) == 0
        assert second.store.store.load_episode(ep.id).instruction == "Renamed after upload"
        assert first.store.store.load_episode(ep.id).revision < store.load_episode(ep.id).revision
        assert main(["sync", *data, "--status"]) == 0
        assert f"{ep.id}  synced" in capsys.readouterr().out
    finally:
        first.stop()
        second.stop()
