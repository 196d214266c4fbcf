"""The control strip: a small always-on-top, frameless bar shown while the agent drives the
desktop. It shows what the agent is thinking and doing, with Pause, Stop and the kill-switch
hotkey. It never takes the keyboard focus (the agent may be typing into another window)."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QVBoxLayout

from agent.wording import hotkey_label

STRIP_STYLE = """
QFrame#strip { background: #202124; border: 1px solid #5f6368; border-radius: 8px; }
QFrame#strip QLabel { color: #e8eaed; }
QLabel#state { font-weight: 700; color: #8ab4f8; }
QLabel#hotkey { color: #9aa0a6; font-size: 8pt; }
QFrame#strip QPushButton { color: #e8eaed; background: #3c4043; border: 1px solid #5f6368; border-radius: 4px; padding: 3px 10px; }
QFrame#strip QPushButton#stop { background: #c92a2a; border-color: #e03131; }
"""


class ControlStrip(QFrame):
    pause_toggled = Signal(bool)  # True: pause
    stop_clicked = Signal()

    def __init__(self, hotkey: str, parent=None):
        super().__init__(parent, Qt.Tool | Qt.FramelessWindowHint | Qt.WindowStaysOnTopHint | Qt.WindowDoesNotAcceptFocus)
        self.setObjectName("strip")
        self.setAttribute(Qt.WA_ShowWithoutActivating)
        self.setFocusPolicy(Qt.NoFocus)
        self.setStyleSheet(STRIP_STYLE)
        self.state = QLabel("Starting…")
        self.state.setObjectName("state")
        self.thought = QLabel("")
        self.action = QLabel("")
        for lab in (self.thought, self.action):
            lab.setMinimumWidth(100)
            lab.setTextFormat(Qt.PlainText)
        self.hotkey = QLabel(f"kill switch: {hotkey_label(hotkey)}")
        self.hotkey.setObjectName("hotkey")
        self.pause_btn = QPushButton("Pause")
        self.pause_btn.setCheckable(True)
        self.pause_btn.setFocusPolicy(Qt.NoFocus)
        self.pause_btn.toggled.connect(self._paused)
        self.stop_btn = QPushButton("Stop")
        self.stop_btn.setObjectName("stop")
        self.stop_btn.setFocusPolicy(Qt.NoFocus)
        self.stop_btn.clicked.connect(self.stop_clicked)
        text = QVBoxLayout()
        text.setSpacing(0)
        text.addWidget(self.thought)
        text.addWidget(self.action)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(10, 4, 8, 4)
        lay.addWidget(self.state)
        lay.addLayout(text, 1)
        right = QVBoxLayout()
        right.setSpacing(1)
        buttons = QHBoxLayout()
        buttons.addWidget(self.pause_btn)
        buttons.addWidget(self.stop_btn)
        right.addLayout(buttons)
        right.addWidget(self.hotkey, 0, Qt.AlignRight)
        lay.addLayout(right)
        self.setFixedSize(760, 56)

    def _paused(self, on: bool) -> None:
        self.pause_btn.setText("Resume" if on else "Pause")
        self.set_state("Paused" if on else "Acting")
        self.pause_toggled.emit(on)

    def set_state(self, text: str) -> None:
        self.state.setText(text)

    def set_step(self, thought: str, action: str, detail: str = "") -> None:
        fm = self.thought.fontMetrics()
        w = max(100, self.thought.width())
        self.thought.setText(fm.elidedText(thought.replace("\n", " ") or "(no thought)", Qt.ElideRight, w))
        self.action.setText(fm.elidedText(action, Qt.ElideRight, w))
        self.thought.setToolTip(thought)
        self.action.setToolTip(detail or action)

    def set_kill_switch_problem(self, text: str) -> None:
        self.hotkey.setText(f"kill switch off: {text[:60]}")
        self.hotkey.setToolTip(text)

    def place(self) -> None:
        """Top centre of the primary screen: out of the way of most targets, always findable."""
        screen = QGuiApplication.primaryScreen()
        if screen is not None:
            g = screen.availableGeometry()
            self.move(g.x() + (g.width() - self.width()) // 2, g.y() + 2)
