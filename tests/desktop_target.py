"""A real Qt window for the desktop end-to-end tests, run as a subprocess on an X display:
two buttons and a text field laid out at fractions of the screen, so their pixels differ with
the screen size. It writes its state (widget geometry in global screen pixels, clicks, text,
submitted lines) to a JSON file on every change.

    QT_QPA_PLATFORM=xcb DISPLAY=:N python tests/desktop_target.py STATE.json

With TANDEM_TARGET_NOTE set, the window also shows that text in large letters near its bottom
and carries it in its title (the privacy tests put an e-mail address there).
"""
from __future__ import annotations

import json
import os
import sys

from PySide6.QtCore import QPoint
from PySide6.QtWidgets import QApplication, QLabel, QLineEdit, QPushButton, QWidget

LAYOUT = {  # name: (x, y, w, h) as fractions of the screen
    "alpha": (0.10, 0.20, 0.15, 0.08),
    "beta": (0.70, 0.60, 0.15, 0.08),
    "field": (0.30, 0.40, 0.40, 0.06),
}


def main(path: str) -> int:
    app = QApplication(sys.argv)
    screen = app.primaryScreen().geometry()
    win = QWidget()
    note = os.environ.get("TANDEM_TARGET_NOTE")
    win.setWindowTitle(f"tandem target - {note}" if note else "tandem target")
    win.setGeometry(screen)
    state = {"clicks": {"alpha": 0, "beta": 0}, "text": "", "submitted": [], "widgets": {}, "ready": False,
             "screen": [screen.width(), screen.height()]}
    widgets = {}

    def write():
        for name, w in widgets.items():
            p = w.mapToGlobal(QPoint(0, 0))
            state["widgets"][name] = [p.x(), p.y(), w.width(), w.height()]
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f)
        os.replace(tmp, path)

    def clicked(name):
        state["clicks"][name] += 1
        write()

    for name, (fx, fy, fw, fh) in LAYOUT.items():
        geo = (int(fx * screen.width()), int(fy * screen.height()), int(fw * screen.width()), int(fh * screen.height()))
        if name == "field":
            w = QLineEdit(win)
            w.textChanged.connect(lambda t: (state.__setitem__("text", t), write()))
            w.returnPressed.connect(lambda w=w: (state["submitted"].append(w.text()), write()))
        else:
            w = QPushButton(name.title(), win)
            w.clicked.connect(lambda _=False, n=name: clicked(n))
        w.setGeometry(*geo)
        widgets[name] = w
    if note:
        label = QLabel(note, win)
        label.setStyleSheet("font-size: 28px; color: black; background: white;")
        label.setGeometry(int(0.1 * screen.width()), int(0.8 * screen.height()), int(0.6 * screen.width()), 60)
    win.show()

    def ready():
        state["ready"] = True
        write()

    from PySide6.QtCore import QTimer

    QTimer.singleShot(300, ready)  # mapped and placed by then (no window manager on Xvfb)
    return app.exec()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
