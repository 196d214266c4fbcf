"""A real Qt window for the element-list tests, run as a subprocess on an X display with an
accessibility bus: a button, a check box (checked), a radio button, an e-mail field, a password
field, a slider, a disabled button and a list of 2000 rows (most scrolled out of view). Once shown
it prints one JSON line: each widget's global box [x, y, w, h] and the list's first row's; then a
JSON line for every click of the button and every toggle of the check box.

    QT_QPA_PLATFORM=xcb DISPLAY=:N python tests/elements_target.py
"""
from __future__ import annotations

import json
import sys

from PySide6.QtCore import QPoint, Qt, QTimer
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QLineEdit,
    QListWidget,
    QPushButton,
    QRadioButton,
    QSlider,
    QVBoxLayout,
    QWidget,
)

EMAIL = "jane.doe@example.com"
SECRET = "hunter2"
ROWS = 2000


def main() -> int:
    app = QApplication(sys.argv)
    win = QWidget()
    win.setWindowTitle("elements target")
    lay = QVBoxLayout(win)
    save = QPushButton("Save")
    dark = QCheckBox("Dark mode")
    dark.setChecked(True)
    small = QRadioButton("Small")
    email = QLineEdit(EMAIL)
    email.setAccessibleName("Email")
    password = QLineEdit(SECRET)
    password.setEchoMode(QLineEdit.Password)
    password.setAccessibleName("Password")
    volume = QSlider(Qt.Horizontal)
    volume.setRange(0, 100)
    volume.setValue(30)
    volume.setAccessibleName("Volume")
    off = QPushButton("Disabled")
    off.setEnabled(False)
    rows = QListWidget()
    rows.addItems([f"row {i}" for i in range(ROWS)])
    rows.setFixedHeight(120)
    widgets = {"save": save, "dark": dark, "small": small, "email": email, "password": password, "volume": volume,
               "off": off, "rows": rows}
    for name, w in widgets.items():
        # a check box takes clicks on its box and label only: sized to them, its centre is one
        lay.addWidget(w, 0, Qt.AlignLeft) if name in ("dark", "small") else lay.addWidget(w)
    win.setGeometry(150, 120, 420, 480)
    win.show()
    save.clicked.connect(lambda: print(json.dumps({"clicked": "save"}), flush=True))
    dark.toggled.connect(lambda on: print(json.dumps({"dark": on}), flush=True))

    def report():
        out = {}
        for name, w in widgets.items():
            p = w.mapToGlobal(QPoint(0, 0))
            out[name] = [p.x(), p.y(), w.width(), w.height()]
        r = rows.visualItemRect(rows.item(0))
        p = rows.viewport().mapToGlobal(r.topLeft())
        out["row0"] = [p.x(), p.y(), r.width(), r.height()]
        print(json.dumps(out), flush=True)

    QTimer.singleShot(400, report)  # mapped and placed by then (no window manager on Xvfb)
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
