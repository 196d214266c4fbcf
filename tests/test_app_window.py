"""The main window on a real store (offscreen Qt): library, step viewer, editing, export/import."""
from __future__ import annotations

import json

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QLabel, QMessageBox, QPlainTextEdit, QWidget

from app.main_window import PAGES, MainWindow
from tests.factories import make_episode

W, H = 320, 200  # the factories' screenshot size: one pixel is 1/320 x 1/200


@pytest.fixture
def win(qtbot, store):
    episodes = [make_episode(store, n_steps=5, instruction=f"Task number {i}") for i in range(3)]
    w = MainWindow(store)
    w.resize(1400, 900)
    w.show()
    qtbot.waitExposed(w)
    w.episodes = episodes
    yield w
    # a test may leave edits unsaved: closing would ask (modally) whether to save them
    original = QMessageBox.question
    QMessageBox.question = staticmethod(lambda *a, **k: QMessageBox.Discard)
    try:
        w.close()
    finally:
        QMessageBox.question = original
    w.deleteLater()


def open_step(win, episode, row):
    page = win.page("Library")
    assert page.select_episode(episode.id)
    page.viewer.select_step(row)
    assert page.viewer.current_step().index == row
    return page, page.viewer


def click_canvas_at(qtbot, canvas, point):
    x, y = canvas.point_to_widget(point)
    qtbot.mouseClick(canvas, Qt.LeftButton, pos=QPoint(round(x), round(y)))


def test_every_listed_page_builds(win):
    assert win.sidebar.count() == len(PAGES)
    for name, _ in PAGES:
        page = win.page(name)
        assert isinstance(page, QWidget) and not isinstance(page, QPlainTextEdit), f"{name} failed to load"
    labels = [w.text() for w in win.statusBar().findChildren(QLabel)]
    assert any(str(win.store.root) in t for t in labels)


def test_an_empty_library_says_how_to_get_episodes(qtbot, store):
    w = MainWindow(store)
    qtbot.addWidget(w)
    page = w.page("Library")
    assert "No episodes yet" in page.viewer.empty.text() and "Record" in page.viewer.empty.text()
    make_episode(store, n_steps=1)
    page.refresh()
    assert page.viewer.empty.text() == "Select an episode to review its steps."


def test_the_library_splitter_comes_back_as_left(qtbot, store, tmp_path):
    from PySide6.QtCore import QSettings

    settings = QSettings(str(tmp_path / "tandem.ini"), QSettings.IniFormat)
    w = MainWindow(store, settings=settings)
    w.resize(1100, 800)
    w.show()
    qtbot.waitExposed(w)
    w.page("Library").splitter.setSizes([500, 250])
    top, bottom = w.page("Library").splitter.sizes()
    w.close()
    w.deleteLater()

    again = MainWindow(store, settings=QSettings(str(tmp_path / "tandem.ini"), QSettings.IniFormat))
    again.show()
    qtbot.waitExposed(again)
    a, b = again.page("Library").splitter.sizes()  # the window may come back a little smaller: compare shares
    assert abs(a / (a + b) - top / (top + bottom)) < 0.05 and a / (a + b) > 0.5  # the default gives the list 1/3
    again.close()
    again.deleteLater()


def test_library_lists_sorts_and_filters(win, qtbot):
    page = win.page("Library")
    assert page.proxy.rowCount() == 3
    assert page.count.text() == "3 episodes"
    row_texts = {page.proxy.index(r, 0).data() for r in range(3)}
    assert row_texts == {"Task number 0", "Task number 1", "Task number 2"}
    assert page.proxy.index(0, 2).data() == "5"
    qtbot.keyClicks(page.filter, "number 1")
    assert page.proxy.rowCount() == 1 and page.proxy.index(0, 0).data() == "Task number 1"
    assert page.count.text() == "1 of 3 episodes"
    page.filter.clear()
    page.table.sortByColumn(0, Qt.AscendingOrder)
    assert [page.proxy.index(r, 0).data() for r in range(3)] == ["Task number 0", "Task number 1", "Task number 2"]
    page.table.sortByColumn(0, Qt.DescendingOrder)
    assert page.proxy.index(0, 0).data() == "Task number 2"


def test_edit_thought_and_move_click_by_mouse_then_save(win, qtbot, store):
    ep = win.episodes[1]
    page, viewer = open_step(win, ep, 0)
    assert viewer.current_step().action.name == "click"
    # the thought, typed for real
    viewer.thought.selectAll()
    qtbot.keyClicks(viewer.thought, "The OK button is at the lower right")
    # the click, moved by a real mouse click on the screenshot
    target = (0.75, 0.6)
    click_canvas_at(qtbot, viewer.canvas, target)
    assert viewer.is_dirty() and viewer.save_btn.isEnabled()
    assert viewer.action_editor.fields["start_box"].value() == pytest.approx(target, abs=1 / W)
    qtbot.mouseClick(viewer.save_btn, Qt.LeftButton)

    saved = store.load_episode(ep.id)
    s0 = saved.steps[0]
    assert s0.thought == "The OK button is at the lower right"
    x, y = s0.action.args["start_box"]
    assert abs(x - target[0]) <= 1 / W and abs(y - target[1]) <= 1 / H
    assert s0.provenance.source == "human"  # a human's own step stays human
    assert saved.revision == ep.revision + 1
    assert saved.steps[1].thought == ep.steps[1].thought  # the other steps are untouched
    assert not viewer.is_dirty()
    assert viewer.episode.id == ep.id and viewer.stack.currentIndex() == 1  # still shown
    assert page.current_episode_id() == ep.id
    assert viewer.steps.topLevelItem(0).text(1) == f"click {round(x * W)},{round(y * H)}"


def test_ctrl_s_saves_and_agent_step_becomes_correction(win, qtbot, store):
    ep = win.episodes[0]
    loaded = store.load_episode(ep.id)
    loaded.steps[0].provenance.source = "agent"
    store.save_episode(loaded)
    page, viewer = open_step(win, ep, 0)
    assert viewer.steps.topLevelItem(0).text(2) == "agent"
    old_action = viewer.current_step().action
    click_canvas_at(qtbot, viewer.canvas, (0.2, 0.8))
    win.activateWindow()
    qtbot.waitActive(win)
    qtbot.keyClick(viewer.canvas, Qt.Key_S, Qt.ControlModifier)
    s0 = store.load_episode(ep.id).steps[0]
    assert s0.action.args["start_box"] == pytest.approx((0.2, 0.8), abs=1 / W)
    assert s0.provenance.source == "corrected"
    assert s0.provenance.proposal_action == old_action
    assert viewer.steps.topLevelItem(0).text(2) == "corrected"
    assert "Original proposal" in viewer.provenance.text()


def test_drag_by_press_and_drag_and_by_two_clicks(win, qtbot, store):
    ep = win.episodes[0]
    page, viewer = open_step(win, ep, 3)
    canvas = viewer.canvas
    assert viewer.current_step().action.name == "drag"
    a = QPoint(*map(round, canvas.point_to_widget((0.2, 0.3))))
    b = QPoint(*map(round, canvas.point_to_widget((0.7, 0.4))))
    qtbot.mousePress(canvas, Qt.LeftButton, pos=a)
    qtbot.mouseMove(canvas, pos=(a + b) / 2)
    qtbot.mouseMove(canvas, pos=b)
    qtbot.mouseRelease(canvas, Qt.LeftButton, pos=b)
    act = viewer.action_editor.action()
    assert act.args["start_box"] == pytest.approx((0.2, 0.3), abs=1 / W)
    assert act.args["end_box"] == pytest.approx((0.7, 0.4), abs=1 / W)
    # two clicks: the first sets the start (and waits), the second the end
    click_canvas_at(qtbot, canvas, (0.5, 0.5))
    assert canvas.pending_drag_start()
    click_canvas_at(qtbot, canvas, (0.9, 0.1))
    assert not canvas.pending_drag_start()
    assert viewer.save()
    s3 = store.load_episode(ep.id).steps[3]
    assert s3.action.args["start_box"] == pytest.approx((0.5, 0.5), abs=1 / W)
    assert s3.action.args["end_box"] == pytest.approx((0.9, 0.1), abs=1 / W)


def test_invalid_action_is_not_saved_and_says_why(win, qtbot, store):
    ep = win.episodes[0]
    page, viewer = open_step(win, ep, 1)  # type "hello\n"
    viewer.action_editor.combo.setCurrentText("hotkey")
    key = viewer.action_editor.fields["key"]
    qtbot.keyClicks(key, "ctrl banana")
    assert not viewer.save()
    assert viewer.error.isVisible() and "banana" in viewer.error.text()
    assert store.load_episode(ep.id).steps[1].action.name == "type"
    # revert discards the edit
    qtbot.mouseClick(viewer.revert_btn, Qt.LeftButton)
    assert viewer.action_editor.action() == ep.steps[1].action
    assert not viewer.is_dirty() and not viewer.error.isVisible()


def test_action_type_change_keeps_the_point_and_builds_fields(win, qtbot):
    page, viewer = open_step(win, win.episodes[0], 0)
    editor = viewer.action_editor
    point = editor.fields["start_box"].value()
    editor.combo.setCurrentText("scroll")
    assert set(editor.fields) == {"start_box", "direction"}
    assert editor.action().args == {"start_box": point, "direction": "up"}
    editor.combo.setCurrentText("type")
    assert isinstance(editor.fields["content"], QPlainTextEdit)
    assert viewer.canvas._action.name == "type"


def test_keyboard_moves_between_steps(win, qtbot):
    page, viewer = open_step(win, win.episodes[0], 0)
    viewer.steps.setFocus()
    qtbot.keyClick(viewer.steps, Qt.Key_Down)
    assert viewer.current_step().index == 1
    qtbot.keyClick(viewer.canvas, Qt.Key_Down)
    assert viewer.current_step().index == 2
    qtbot.keyClick(viewer.canvas, Qt.Key_Up)
    assert viewer.current_step().index == 1


def test_leaving_an_edited_step_asks(win, qtbot, store, monkeypatch):
    ep = win.episodes[0]
    page, viewer = open_step(win, ep, 0)
    viewer.thought.setPlainText("changed once")
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.Cancel)
    viewer.select_step(1)
    assert viewer.current_step().index == 0 and viewer.is_dirty()  # cancel: stays
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.Save)
    viewer.select_step(1)
    assert viewer.current_step().index == 1
    assert store.load_episode(ep.id).steps[0].thought == "changed once"


def test_delete_step_and_mark_outcome(win, qtbot, store, monkeypatch):
    ep = win.episodes[2]
    page, viewer = open_step(win, ep, 1)
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.Yes)
    qtbot.mouseClick(viewer.delete_btn, Qt.LeftButton)
    saved = store.load_episode(ep.id)
    assert [s.index for s in saved.steps] == [0, 1, 2, 3]
    assert [s.action.name for s in saved.steps] == ["click", "scroll", "drag", "finished"]
    assert viewer.steps.topLevelItemCount() == 4 and viewer.current_step().action.name == "scroll"
    assert page.proxy.index(page._row_of(ep.id), 2).data() == "4"

    viewer.mark_outcome(False)
    assert store.load_episode(ep.id).outcome.success is False
    assert page.proxy.index(page._row_of(ep.id), 4).data() == "failure"
    # from the library's menu, on the selected episode
    success = [a for a in page.outcome_btn.menu().actions() if a.text() == "Success"][0]
    success.trigger()
    out = store.load_episode(ep.id).outcome
    assert out.success is True and out.source == "annotator"
    assert page.proxy.index(page._row_of(ep.id), 4).data() == "success"
    assert viewer.outcome.currentText() == "success"


def test_blur_region_by_dragging_on_the_screenshot(win, qtbot, store, monkeypatch):
    """Review's privacy tool: drag a rectangle, the stored screenshot is blurred there (only
    there); the same image in other episodes is left alone; Esc leaves the tool without a change."""
    import io

    import numpy as np
    from PIL import Image

    ep = win.episodes[0]
    page, viewer = open_step(win, ep, 0)
    old = store.load_episode(ep.id).steps[0].observation.screenshot
    before = np.asarray(Image.open(io.BytesIO(store.get_blob(old))).convert("RGB")).astype(int)
    canvas = viewer.canvas

    qtbot.mouseClick(viewer.blur_btn, Qt.LeftButton)  # Esc cancels: nothing changes
    assert canvas.region_mode()
    qtbot.keyClick(canvas, Qt.Key_Escape)
    assert not canvas.region_mode() and not viewer.blur_btn.isChecked()
    assert store.load_episode(ep.id).steps[0].observation.screenshot == old

    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.Yes)
    qtbot.mouseClick(viewer.blur_btn, Qt.LeftButton)
    # the "OK" button of the factory's screen: pixels 20..120 x 20..60 of 320x200
    a = QPoint(*map(round, canvas.point_to_widget((10 / W, 10 / H))))
    b = QPoint(*map(round, canvas.point_to_widget((130 / W, 70 / H))))
    qtbot.mousePress(canvas, Qt.LeftButton, pos=a)
    qtbot.mouseMove(canvas, pos=(a + b) / 2)
    qtbot.mouseMove(canvas, pos=b)
    qtbot.mouseRelease(canvas, Qt.LeftButton, pos=b)

    new = store.load_episode(ep.id).steps[0].observation.screenshot
    assert new != old
    # the factory's episodes share this image: theirs is untouched, so the original stays on disk
    assert store.load_episode(win.episodes[1].id).steps[0].observation.screenshot == old
    assert store.blob_path(old).exists()
    after = np.asarray(Image.open(io.BytesIO(store.get_blob(new))).convert("RGB")).astype(int)
    inside = (slice(22, 58), slice(22, 118))
    assert np.abs(after[inside] - before[inside]).mean() > 3  # the button's outline and text are smeared
    assert after[inside].std() < before[inside].std()
    outside = (slice(100, 170), slice(160, 300))
    assert np.abs(after[outside] - before[outside]).max() == 0  # PNG in, PNG out: untouched elsewhere
    assert not canvas.region_mode() and viewer.current_step().observation.screenshot == new


def test_delete_episode_asks_and_removes_blobs(win, qtbot, store, monkeypatch):
    ep = make_episode(store, n_steps=2, width=330, instruction="Own screenshots")  # blobs no other episode shares
    shared = win.episodes[0].blob_hashes()
    win.page("Library").refresh()
    page, viewer = open_step(win, ep, 0)
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.No)
    assert page.delete_selected() == 0 and store.has_episode(ep.id)
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.Yes)
    qtbot.mouseClick(page.delete_btn, Qt.LeftButton)
    assert not store.has_episode(ep.id)
    assert not any(store.has_blob(h) for h in ep.blob_hashes())
    assert all(store.has_blob(h) for h in shared)
    assert page.proxy.rowCount() == 3 and viewer.episode is None


def test_export_jsonl_in_the_background(win, qtbot, store, tmp_path):
    page = win.page("Library")
    out = tmp_path / "export" / "samples.jsonl"
    ids = [e.id for e in win.episodes[:2]]
    with qtbot.waitSignal(page.taskFinished, timeout=20000) as blocker:
        page.export_to(out, ids)
        assert page.progress.isVisible() and not page.export_btn.isEnabled()
    task, result = blocker.args
    assert task == "export" and not isinstance(result, BaseException), result
    lines = [json.loads(l) for l in out.read_text().splitlines()]
    assert len(lines) == 10 == result["samples"]
    assert {l["episode_id"] for l in lines} == set(ids)
    first = next(l for l in lines if l["episode_id"] == ids[0] and l["step"] == 0)
    assert first["messages"][-1]["role"] == "assistant" and "click(" in first["messages"][-1]["content"]
    assert all((out.parent / img).is_file() for l in lines for img in l["images"])
    assert not page.progress.isVisible() and page.export_btn.isEnabled()


def test_bundle_export_then_import_round_trip(win, qtbot, store, tmp_path, monkeypatch):
    page = win.page("Library")
    ep = win.episodes[1]
    bundle = tmp_path / "one.zip"
    with qtbot.waitSignal(page.taskFinished, timeout=20000) as blocker:
        page.export_to(bundle, [ep.id])
    assert blocker.args[1]["episodes"] == 1
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.Yes)
    page.select_episode(ep.id)
    page.delete_selected()
    assert page._row_of(ep.id) < 0
    with qtbot.waitSignal(page.taskFinished, timeout=20000) as blocker:
        page.import_from(bundle)
    assert blocker.args == ["import", {"episodes": 1, "replaced": 0, "blobs": 5}]
    assert page._row_of(ep.id) >= 0
    assert [s.thought for s in store.load_episode(ep.id).steps] == [s.thought for s in ep.steps]


def test_importing_a_bad_file_reports_and_changes_nothing(win, qtbot, store, tmp_path):
    page = win.page("Library")
    bad = tmp_path / "broken.zip"
    bad.write_bytes(b"PK\x03\x04 this is not really a zip")
    before = store.counts()
    with qtbot.waitSignal(page.taskFinished, timeout=20000) as blocker:
        page.import_from(bad)
    assert blocker.args[0] == "import" and isinstance(blocker.args[1], Exception)
    boxes = [b for b in page.findChildren(QMessageBox) if b.isVisible()]
    assert boxes and "broken.zip" in boxes[0].text()
    boxes[0].close()
    assert store.counts() == before
    assert "Import failed" in win.statusBar().currentMessage()


def test_main_py_starts_the_app(tmp_path):
    """`python main.py app --data DIR` runs the event loop on that store (killed after a while)."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "XDG_CONFIG_HOME": str(tmp_path / "config"), "HOME": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, str(root / "main.py"), "app", "--data", str(tmp_path / "data")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 20
        while time.time() < deadline and not (tmp_path / "data" / "tandem.db").exists():
            time.sleep(0.1)
        time.sleep(1.5)  # past window construction
        assert proc.poll() is None, proc.communicate()[1]
        assert (tmp_path / "data" / "tandem.db").exists()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert "Traceback" not in err, err


def test_a_second_app_on_the_same_data_folder_is_refused(tmp_path):
    """Two apps on one data folder both synced the same outbox. The second is refused with one
    clear line; once the first is killed (SIGKILL: its lock file stays behind), a new one starts."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "XDG_CONFIG_HOME": str(tmp_path / "config"),
           "HOME": str(tmp_path), "TANDEM_DATA": str(tmp_path / "data")}
    start = lambda: subprocess.Popen([sys.executable, str(root / "main.py")], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    def wait_open(proc):
        deadline = time.time() + 30
        while time.time() < deadline and proc.poll() is None and not (tmp_path / "data" / "app.lock").exists():
            time.sleep(0.1)
        time.sleep(1.5)  # past window construction
        assert proc.poll() is None, proc.communicate()[1]

    first = start()
    try:
        wait_open(first)
        second = subprocess.run([sys.executable, str(root / "main.py"), "app", "--data", str(tmp_path / "data")],
                                env=env, capture_output=True, text=True, timeout=60)
        assert second.returncode == 2
        assert second.stderr.startswith("tandem: Tandem is already open on the data folder")
        assert f"(process {first.pid}" in second.stderr and second.stderr.count("\n") == 1, second.stderr
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=10)
    assert (tmp_path / "data" / "app.lock").exists()  # left behind by the killed app: stale
    third = start()
    try:
        wait_open(third)
    finally:
        third.terminate()
        _, err = third.communicate(timeout=10)
    assert "Traceback" not in err and "already open" not in err, err


def test_main_py_with_an_unusable_data_dir_fails_clearly(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "XDG_CONFIG_HOME": str(tmp_path / "config")}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "main.py"), "app", "--data", str(not_a_dir)],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "data directory cannot be opened" in out.stderr and str(not_a_dir) in out.stderr


def test_closing_a_dialog_while_the_main_window_is_hidden_does_not_quit_the_app(tmp_path):
    """Drive hides the main window during a run; the risky-step dialog was then the last window,
    and answering it quit the app (3 of 3 times). The real run_app, in its own process: the app
    survives the dialog and ends when the main window is closed."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from types import SimpleNamespace
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QDialog
import app.main as m

def script():
    app = QApplication.instance()
    win = next(w for w in app.topLevelWidgets() if type(w).__name__ == "MainWindow")
    win.hide()  # as Drive does for a run
    dlg = QDialog()
    dlg.show()
    QTimer.singleShot(200, dlg.accept)  # the user answers the dialog
    QTimer.singleShot(1500, lambda: (print("alive", flush=True), win.close()))

app = QApplication(sys.argv[:1])  # run_app takes this instance; the timers need it first
QTimer.singleShot(500, script)
sys.exit(m.run_app(SimpleNamespace(data={str(tmp_path / 'data')!r}, server=None)))
"""
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert "alive" in r.stdout, r.stderr[-2000:]
    assert r.returncode == 0


def test_the_library_follows_the_store_whoever_writes_it(win, qtbot, store):
    """Episodes written by this process (a run, training) or by another (the command line) show
    up without a refresh button; the selected episode stays selected."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    page = win.page("Library")
    assert page.model.rowCount() == 3
    page.select_episode(win.episodes[1].id)
    make_episode(store, n_steps=2, instruction="Written in this process")
    qtbot.waitUntil(lambda: page.model.rowCount() == 4, timeout=5000)
    assert page.current_episode_id() == win.episodes[1].id
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
            f"from agent.storage.store import Store\nfrom factories import make_episode\n"
            f"s = Store({str(store.root)!r}); make_episode(s, n_steps=1, instruction='Written by another process'); s.close()")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    qtbot.waitUntil(lambda: page.model.rowCount() == 5, timeout=5000)
    store.delete_episode(win.episodes[0].id)
    qtbot.waitUntil(lambda: page.model.rowCount() == 4, timeout=5000)
    # the open episode was routed elsewhere (the flywheel's judgement: the episode itself is unchanged):
    # the viewer's route line follows the store
    page.select_episode(win.episodes[1].id)
    qtbot.waitUntil(lambda: page.viewer.episode is not None and page.viewer.episode.id == win.episodes[1].id)
    store.judge(win.episodes[1].id, "sft")
    qtbot.waitUntil(lambda: "route sft" in page.viewer.meta.text(), timeout=5000)


def test_several_steps_are_deleted_with_one_question(win, qtbot, store, monkeypatch):
    ep = win.episodes[1]
    page, viewer = open_step(win, ep, 1)
    item = viewer.steps.topLevelItem(3)
    viewer.steps.scrollToItem(item)
    qtbot.mouseClick(viewer.steps.viewport(), Qt.LeftButton, Qt.ControlModifier,
                     viewer.steps.visualItemRect(item).center())
    assert viewer.selected_step_indices() == [1, 3] and viewer.delete_btn.text() == "Delete 2 steps…"
    # numbered from 1 where a person reads them, as in Supervise and the privacy review
    assert [viewer.steps.topLevelItem(r).text(0) for r in (0, 1, 3)] == ["1", "2", "4"]
    asked = []
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: asked.append(a[2]) or QMessageBox.Yes)
    qtbot.mouseClick(viewer.delete_btn, Qt.LeftButton)
    assert asked == ["Delete 2 steps (2, 4) from this episode? This cannot be undone."]
    saved = store.load_episode(ep.id)
    assert [s.action.name for s in saved.steps] == ["click", "scroll", "finished"]
    assert [s.index for s in saved.steps] == [0, 1, 2] and saved.revision == ep.revision + 1


def test_export_dialog_opens_in_the_data_folder_then_the_last_one_used(win, qtbot, store, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    page = win.page("Library")
    offered = []
    chosen = tmp_path / "elsewhere" / "mine.zip"
    chosen.parent.mkdir()
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (offered.append(a[2]) or str(chosen), ""))
    monkeypatch.setattr(page, "export_to", lambda path, ids: None)
    page._ask_export("zip")
    page._ask_export("jsonl")
    assert offered[0] == str(store.root / "exports" / "tandem-episodes.zip")
    assert offered[1] == str(chosen.parent / "samples.jsonl")  # remembered in the store's settings


def test_an_opened_episode_fits_a_1024x700_screen(qtbot, store):
    """Before, opening an episode widened the window to 1183 px and pushed Save out of view."""
    ep = make_episode(store, n_steps=3, instruction="A long instruction " * 8)
    w = MainWindow(store)
    qtbot.addWidget(w)
    w.resize(1024, 700)
    w.show()
    qtbot.waitExposed(w)
    page = w.page("Library")
    page.refresh()
    page.select_episode(ep.id)
    qtbot.waitUntil(lambda: page.viewer.episode is not None)
    qtbot.wait(50)
    assert w.width() == 1024 and w.minimumSizeHint().width() <= 1024
    viewer = page.viewer
    for b in (viewer.delete_btn, viewer.blur_btn, viewer.revert_btn, viewer.save_btn):
        right = b.mapTo(w, b.rect().topRight()).x()
        assert b.isVisible() and right < w.width(), (b.text(), right)
        assert b.visibleRegion().boundingRect().size() == b.size(), b.text()  # not scrolled or clipped away
    long = "The run ended: the task ended after the agent's click. The sandbox's verifier says the task was not done. " * 2
    for i, (name, _) in enumerate(w.pages_spec):  # every page fits too, also with its longest sentences
        w.show_page_at(i)
        page = w.page(name)
        if name == "Supervise":
            page.panel.clear(long)
            page.claim_label.setText(long)
        elif name == "Train":
            page.summary.setText(long)
            page.message.setText(long)
        elif name == "Drive":
            page.status.setText(long)
        qtbot.wait(20)
        hint = w.minimumSizeHint()
        assert hint.width() <= 1024 and hint.height() <= 680, (name, hint.toTuple())


def test_the_default_model_announced_as_v0000_is_not_offered_while_the_agent_runs_it(qtbot, store, tmp_path):
    """The flywheel's first model is a copy of the shipped default one; "Use model v0000" was
    offered to an app whose Supervise and Drive already run it."""
    w = MainWindow(store)
    qtbot.addWidget(w)
    info = {"path": str(tmp_path), "iteration": 0, "note": "the shipped default model", "shipped_default": True}
    w.model_announced("v0000", info)
    assert w.model_btn.isHidden()
    w.model_announced("v0000", {**info, "shipped_default": False})  # a base built with random weights: new
    assert not w.model_btn.isHidden() and w.model_btn.text() == "Use model v0000"
    w.model_btn.hide()
    store.set_setting("drive.policy", "endpoint")  # Drive runs another model: the default one is a switch for it
    w.model_announced("v0000", info)
    assert not w.model_btn.isHidden()


def test_an_episode_without_steps_shows_no_action_of_the_one_before(win, qtbot, store):
    """Opening a step-less episode (an import, every step deleted) after another left that
    episode's action in the action form: a person read it as this episode's action."""
    page, viewer = open_step(win, win.episodes[0], 0)
    assert viewer.action_editor.combo.currentText() == "click" and viewer.action_editor.fields
    empty = make_episode(store, n_steps=0, instruction="Nothing in it")
    page.refresh()
    assert page.select_episode(empty.id) and viewer.episode.id == empty.id
    assert viewer.action_editor.combo.count() == 0 and viewer.action_editor.fields == {}
    assert viewer.action_editor.form.rowCount() == 0 and viewer.thought.toPlainText() == ""
    assert not viewer.save_btn.isEnabled() and "Click the screenshot" not in viewer.hint.text()
