"""Runs the real app window on an X display and drives its Drive or Supervise page the way a
user would (fills the form, clicks Start, answers), writing what happened to a JSON file.
Used by tests/test_drive_xvfb.py as a subprocess (the test's own QApplication is offscreen).

    QT_QPA_PLATFORM=xcb DISPLAY=:N python tests/app_driver.py drive OUT.json DATA_DIR RESPONSES.jsonl [SHOT.png]
    QT_QPA_PLATFORM=xcb DISPLAY=:N python tests/app_driver.py supervise OUT.json DATA_DIR RESPONSES.jsonl [SHOT.png]
    QT_QPA_PLATFORM=xcb DISPLAY=:N python tests/app_driver.py record OUT.json DATA_DIR GEOMETRY [SHOT.png]

In record mode the driver only starts the recording (GEOMETRY is x,y,w,h of the window) and
then publishes where the Record page's buttons and the note box are on screen; the test clicks
them with xdotool like a person would, and the driver writes the saved episode's id at stop (or
the Record page's message when the stop saved none).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def grab_screen(path: str) -> None:
    import mss
    import mss.tools

    with mss.MSS() as sct:
        g = sct.grab(sct.monitors[1])
        mss.tools.to_png(g.rgb, g.size, output=path)


def main(mode: str, out: str, data: str, responses: str, shot: str | None = None) -> int:
    from PySide6.QtCore import QPoint, Qt, QTimer
    from PySide6.QtTest import QTest
    from PySide6.QtWidgets import QApplication

    from agent.storage.store import Store
    from app.main_window import MainWindow

    app = QApplication(sys.argv[:1])
    app.setStyle("Fusion")
    store = Store(data)
    window = MainWindow(store)
    if mode == "record":
        x, y, w, h = map(int, responses.split(","))
        window.setGeometry(x, y, w, h)
    else:
        window.resize(1500, 950)
        window.move(150, 70)
    window.show()
    state = {"mode": mode, "window_visible_during_steps": [], "strip_visible_during_steps": [], "shot": None}

    def write():
        tmp = out + ".tmp"
        Path(tmp).write_text(json.dumps(state))
        os.replace(tmp, out)

    def finish(result):
        state.update(reason=result.reason, steps=result.steps, episode=result.episode.id, kind=result.episode.kind,
                     window_visible_after=window.isVisible())
        write()
        QTimer.singleShot(200, app.quit)

    if mode == "record":
        record(app, window, state, write)
    elif mode == "drive":
        page = window.page("Drive")
        window.show_page_at([n for n, _ in window.pages_spec].index("Drive"))
        f = page.form
        f.set_choice(f.policy, "replay")
        f.replay_path.setText(responses)
        f.set_choice(f.gate, "auto")
        f.instruction.setText("Greet, then press Alpha and Beta")

        def on_step(step):
            state["window_visible_during_steps"].append(window.isVisible())
            state["strip_visible_during_steps"].append(page.strip.isVisible())
            state["strip_rects"] = page.strip_rects.rects()
            if shot and step.index == 1 and state["shot"] is None:
                grab_screen(shot)
                state["shot"] = shot
            state["started"] = True
            write()

        def start():
            page.run_finished.connect(finish)
            QTest.mouseClick(page.start_btn, Qt.LeftButton)
            if page.run is None:
                state["failed"] = page.status.text()
                write()
                app.quit()
                return
            page.run.step.connect(on_step)
            page.run.failed.connect(lambda t: (state.update(failed=t), write(), app.quit()))

        QTimer.singleShot(300, start)
    else:
        page = window.page("Supervise")
        window.show_page_at([n for n, _ in window.pages_spec].index("Supervise"))
        f = page.form
        f.set_choice(f.policy, "replay")
        f.replay_path.setText(responses)
        f.set_choice(f.executor, "sandbox")
        f.family.setCurrentText("click_button")
        f.seed.setValue(3)

        def shown(pending, t):
            if state.get("edited"):
                return
            # the supervisor moves the click onto the right button, looks, then approves
            target = page.run.loop.executor.expert_action()[1].args["start_box"]
            x, y = page.panel.canvas.point_to_widget(target)
            QTest.mouseClick(page.panel.canvas, Qt.LeftButton, pos=QPoint(round(x), round(y)))
            page.panel.thought.setPlainText("Undo is the middle button; the corner is empty.")
            state["edited"] = target

            def look_then_approve():
                if shot:
                    grab_screen(shot)
                    state["shot"] = shot
                QTest.keyClick(page.panel, Qt.Key_Return)

            QTimer.singleShot(500, look_then_approve)

        page.panel.displayed.connect(shown)
        page.run_finished.connect(finish)
        QTimer.singleShot(300, lambda: QTest.mouseClick(page.start_btn, Qt.LeftButton))
    QTimer.singleShot(90000, app.quit)  # never hang a test run
    code = app.exec()
    for p in window.pages.values():
        if hasattr(p, "shutdown"):
            p.shutdown()
    store.close()
    return code


def record(app, window, state, write) -> None:
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QDialogButtonBox

    page = window.page("Record")
    window.show_page_at([n for n, _ in window.pages_spec].index("Record"))
    page.instruction.setText("Press Alpha, then Beta")

    def centre(w):
        c = w.mapToGlobal(w.rect().center())
        return [c.x(), c.y()]

    def publish():
        state["state"] = page.state
        if page.state == "recording":
            state["started"] = True
        elif page.state == "idle" and state.get("started") and "episode" not in state:
            state["error"] = page.error_label.text()  # stopped without an episode: why
            QTimer.singleShot(300, app.quit)
        if page.state in ("recording", "paused"):
            state["buttons"] = {name: centre(b) for name, b in
                                (("pause", page.pause_btn), ("stop", page.stop_btn), ("note", page.note_btn))}
            box = page.note_box
            if box is not None and box.isVisible():
                ok = box.findChild(QDialogButtonBox).button(QDialogButtonBox.Ok)
                state["note_box"] = {"edit": centre(box.edit), "ok": centre(ok)}
            else:
                state.pop("note_box", None)
        write()

    def stopped(episode_id):
        state["episode"] = episode_id
        write()
        QTimer.singleShot(300, app.quit)

    page.recordingStopped.connect(stopped)
    timer = QTimer(window)
    timer.timeout.connect(publish)
    timer.start(100)
    QTimer.singleShot(300, page.start)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
