"""Record mode in the app (offscreen Qt widgets, capture and input on the session's Xvfb display):
start with an instruction, live counts, pause and the note hotkey from real xdotool input,
stop, and the recording opened in the step viewer of the Library page."""
from __future__ import annotations

import subprocess
import time

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
