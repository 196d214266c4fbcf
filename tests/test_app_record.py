"""Record mode in the app (offscreen Qt widgets, capture and input on the session's Xvfb display):
start with an instruction, live counts, pause and the note hotkey from real xdotool input,
stop, and the recording opened in the step viewer of the Library page."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.main_window import MainWindow

pytestmark = pytest.mark.desktop
PAGES = [("Library", "app.library_view:LibraryPage"), ("Record", "app.record_view:RecordPage")]


def xdo(*args):
    subprocess.run(["xdotool", *map(str, args)], check=True)


@pytest.fixture
def win(qtbot, store, xdisplay):
    w = MainWindow(store, pages=PAGES)
    w.show()
    qtbot.waitExposed(w)
    yield w
    page = w.pages.get("Record")
    if page is not None and page.session is not None and page.state in ("recording", "paused"):
        page.session.stop()  # a failed test left it recording: closing would ask, modally
        page.session, page.state = None, "idle"
    w.close()
    w.deleteLater()


def test_record_page_start_note_pause_stop_then_review(win, qtbot, store):
    page = win.page("Record")
    win.show_page_at(1)
    page.start()
    assert "Enter the task" in page.error_label.text() and page.state == "idle"  # no instruction, no recording
    page.instruction.setText("Click twice and say why")
    page.fps.setValue(10)
    qtbot.mouseClick(page.start_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: page.state == "recording", timeout=10000)
    assert not page.start_btn.isEnabled() and page.stop_btn.isEnabled() and not page.tray_start.isEnabled()
    time.sleep(0.3)
    xdo("mousemove", 400, 300, "click", "--delay", 0, 1)
    qtbot.waitUntil(lambda: page.events_label.text().startswith(("2 ", "3 ")), timeout=3000)  # the mouse press, release (start)
    assert page.fps_label.text().endswith("fps")
    xdo("key", "ctrl+alt+shift+n")  # the note hotkey opens the note box, stamped with the hotkey's time
    qtbot.waitUntil(lambda: page.note_box is not None and page.note_box.isVisible(), timeout=3000)
    page.note_box.edit.setText("now the second one saves it")
    page.note_box.accept()
    xdo("key", "ctrl+alt+shift+p")
    qtbot.waitUntil(lambda: page.state == "paused", timeout=3000)
    assert page.pause_btn.text() == "Resume" and "Paused" in page.state_label.text()
    xdo("mousemove", 800, 300, "click", "--delay", 0, 1)  # not recorded
    page.toggle_pause()
    assert page.state == "recording"
    time.sleep(0.3)
    xdo("mousemove", 900, 600, "click", "--delay", 0, 1)
    time.sleep(0.5)
    qtbot.mouseClick(page.stop_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: page.state == "idle" and page.last_episode_id is not None, timeout=15000)
    ep = store.load_episode(page.last_episode_id)
    assert ep.kind == "recording" and ep.instruction == "Click twice and say why"
    assert [(s.action.name, s.info["screen_points"]) for s in ep.steps] == [("click", [[400, 300]]), ("click", [[900, 600]])]
    # a note between two actions explains the coming one (the same rule as spoken words)
    assert ep.steps[0].thought == "" and ep.steps[1].thought == "now the second one saves it"
    # opened for review in the step viewer
    library = win.page("Library")
    assert win.stack.currentWidget() is library
    assert library.current_episode_id() == ep.id
    assert library.viewer.current_step().action.name == "click"


@pytest.mark.parametrize("answer", ["cancel", "save"])
def test_closing_the_window_during_a_recording_asks_first(qtbot, store, xdisplay, answer):
    """Closing mid-recording asks: Cancel keeps the window and the recording; Save stops and
    saves it (its status is no longer 'recording') and the window closes."""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QMessageBox

    w = MainWindow(store, pages=PAGES)
    w.show()
    qtbot.waitExposed(w)
    page = w.page("Record")
    w.show_page_at(1)
    page.instruction.setText("Close me halfway")
    qtbot.mouseClick(page.start_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: page.state == "recording", timeout=10000)
    episode_id = page.session.episode.id
    time.sleep(0.3)
    xdo("mousemove", 500, 400, "click", "--delay", 0, 1)  # a step to save (a recording of nothing is not kept)
    time.sleep(0.4)
    asked = []

    def press():
        box = next((b for b in QApplication.topLevelWidgets() if isinstance(b, QMessageBox) and b.isVisible()), None)
        if box is None:
            QTimer.singleShot(50, press)
            return
        asked.append(box.text())
        button = box.button(QMessageBox.Save if answer == "save" else QMessageBox.Cancel)
        qtbot.mouseClick(button, Qt.LeftButton)

    QTimer.singleShot(50, press)
    w.close()
    assert asked and "recording is running" in asked[0]
    status = store.load_episode(episode_id).meta["recording"]["status"]
    if answer == "cancel":
        assert w.isVisible() and page.state == "recording" and status == "recording"
        qtbot.mouseClick(page.stop_btn, Qt.LeftButton)
        qtbot.waitUntil(lambda: page.state == "idle", timeout=15000)
        w.close()
    else:
        assert not w.isVisible() and page.state == "idle" and status != "recording"
    w.deleteLater()


def _wait_for(path, pred, timeout=20.0):
    import json

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            st = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            st = None
        if st is not None and pred(st):
            return st
        time.sleep(0.05)
    raise AssertionError(f"timed out; last state: {st}")


def _record_driver(xdisplay, tmp_path):
    """The real app on the Xvfb display (xcb), recording; returns (process, its state file, data folder)."""
    import os
    import sys

    out, data = tmp_path / "driver.json", tmp_path / "data"
    env = {**os.environ, "QT_QPA_PLATFORM": "xcb", "DISPLAY": xdisplay, "XDG_SESSION_TYPE": "x11"}
    driver = subprocess.Popen([sys.executable, str(Path(__file__).with_name("app_driver.py")), "record", str(out),
                               str(data), "700,40,620,380"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return driver, out, data


def _click(x, y):
    xdo("mousemove", x, y, "sleep", 0.15, "click", 1)
    time.sleep(0.4)


def _write_note(out, buttons, text: str) -> None:
    """Add note… on the Record page, type into the note box, OK: all of it Tandem's own window."""
    _click(*buttons["note"])
    box = _wait_for(out, lambda s: "note_box" in s)["note_box"]
    _click(*box["edit"])
    xdo("type", "--delay", 30, text)
    time.sleep(0.3)
    _click(*box["ok"])
    _wait_for(out, lambda s: "note_box" not in s)


def test_clicks_and_typing_on_tandems_own_window_are_not_recorded(xdisplay, tmp_path):
    """The real app on Xvfb (xcb) records while xdotool clicks a foreign window's buttons and
    Tandem's own Pause, Resume, Add note…, the note box (typed into) and Stop. Only the two
    foreign clicks become steps; the note is the second step's thought, never a `type` action."""
    from agent.storage.store import Store
    from tests.test_agent_desktop import read_state, start_target

    target_state = tmp_path / "target.json"
    target = start_target(xdisplay, target_state)
    driver, out, data = _record_driver(xdisplay, tmp_path)
    try:
        st = _wait_for(out, lambda s: s.get("state") == "recording" and "buttons" in s)
        widgets = read_state(target_state)["widgets"]

        def centre(name):
            x, y, w, h = widgets[name]
            return x + w // 2, y + h // 2

        b = st["buttons"]
        _click(*centre("alpha"))
        _click(*b["pause"])
        _wait_for(out, lambda s: s.get("state") == "paused")
        _click(*b["pause"])  # Resume
        _wait_for(out, lambda s: s.get("state") == "recording")
        _write_note(out, b, "beta is next")
        _click(*centre("beta"))
        time.sleep(0.4)
        _click(*b["stop"])
        st = _wait_for(out, lambda s: "episode" in s, timeout=30)
        log = driver.communicate(timeout=30)[0].decode(errors="replace")
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
        target.terminate()
        target.wait(5)
    assert read_state(target_state, settle=0)["clicks"] == {"alpha": 1, "beta": 1}
    with Store(data) as store:
        ep = store.load_episode(st["episode"])
    centres = [list(centre("alpha")), list(centre("beta"))]
    assert [(s.action.name, s.info["screen_points"]) for s in ep.steps] == [("click", [c]) for c in centres], log[-2000:]
    assert ep.steps[1].thought == "beta is next"
    assert ep.meta["recording"]["dropped_own"] >= 8  # 5 clicks' presses and releases, the typing


def test_a_recording_that_captured_nothing_is_not_saved_and_says_why(win, qtbot, store):
    """Before, a recording with no step was saved as an episode and opened in the viewer, which
    still showed the previous recording's action. Now nothing is kept (no episode, no frame), the
    page says why, and the Library keeps showing the recording before it."""
    page, library = win.page("Record"), win.page("Library")
    win.show_page_at(1)
    page.instruction.setText("Click once")
    qtbot.mouseClick(page.start_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: page.state == "recording", timeout=10000)
    time.sleep(0.3)
    xdo("mousemove", 500, 400, "click", "--delay", 0, 1)
    time.sleep(0.5)
    qtbot.mouseClick(page.stop_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: page.state == "idle" and page.last_episode_id is not None, timeout=15000)
    first = page.last_episode_id
    assert library.viewer.episode.id == first and library.viewer.current_step().action.name == "click"

    page.instruction.setText("Do nothing at all")
    win.show_page_at(1)
    qtbot.mouseClick(page.start_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: page.state == "recording", timeout=10000)
    time.sleep(0.5)
    qtbot.mouseClick(page.stop_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: page.state == "idle", timeout=15000)
    assert page.error_label.text() == ("Nothing was recorded: no click, key press or scroll reached the screen "
                                       "while recording. No episode was saved.")
    assert win.statusBar().currentMessage() == page.error_label.text()
    assert store.episode_ids() == [first] and page.last_episode_id == first
    assert store.check() == []  # the empty recording's frames went with it
    assert win.stack.currentWidget() is page  # the Library was not opened on anything
    assert library.viewer.episode.id == first and library.viewer.current_step().action.name == "click"
    assert page.start_btn.isEnabled()  # ready for the next try


def test_a_recording_of_only_tandems_own_window_says_so(xdisplay, tmp_path):
    """The real app on Xvfb (xcb): every click and key goes to Tandem itself (Add note…, typing
    in the note box, its OK, Stop). No episode is saved; the Record page names that reason."""
    from agent.storage.store import Store

    driver, out, data = _record_driver(xdisplay, tmp_path)
    try:
        b = _wait_for(out, lambda s: s.get("state") == "recording" and "buttons" in s)["buttons"]
        _write_note(out, b, "just a note")
        _click(*b["stop"])
        st = _wait_for(out, lambda s: "episode" in s or "error" in s, timeout=30)
        log = driver.communicate(timeout=30)[0].decode(errors="replace")
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert "episode" not in st, log[-2000:]
    assert st["error"].startswith("Nothing was recorded: every input went to Tandem's own window ("), st["error"]
    assert st["error"].endswith("input events left out). No episode was saved.")
    with Store(data) as store:
        assert store.episode_ids() == [] and store.check() == []
