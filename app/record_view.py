"""Record mode: the task instruction, start / pause / stop, the recording state always visible
(live capture fps, event count, microphone level), a tray icon with the same controls, the note
box that the note hotkey opens, and, after stop, the recording opened in the step viewer (or,
when it captured nothing, why: no episode is saved).

The capture core (agent.recorder) runs in its own threads; this page only draws. Starting and
stopping (which encodes the last frames and reduces the events) run in a background worker;
the recorder's control hotkeys reach the page through a queued signal.
"""
from __future__ import annotations

import os
import sys

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QColor, QGuiApplication, QIcon, QKeySequence, QPixmap, QShortcut
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMenu,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QSystemTrayIcon,
    QVBoxLayout,
    QWidget,
)

from agent.recorder.audio import input_devices
from agent.recorder.errors import NothingRecorded
from agent.recorder.privacy import OwnWindows
from agent.recorder.session import RecorderConfig, RecordingSession
from agent.schema import monotonic
from agent.wording import command_name, plural
from app.window_rects import WindowRects
from app.workers import run_in_background


class _Bridge(QObject):
    """Carries the recorder's hotkey callbacks (its processing thread) to the main thread."""

    control = Signal(str, float)


def _dot(color: str) -> QIcon:
    pm = QPixmap(16, 16)
    pm.fill(QColor(color))
    return QIcon(pm)


class NoteBox(QDialog):
    """A small box for a typed think-aloud note; the note keeps the time the box was opened."""

    def __init__(self, t: float, parent=None):
        super().__init__(parent)
        self.t = t
        self.setWindowTitle("Note")
        self.setWindowFlag(Qt.WindowStaysOnTopHint)
        self.edit = QLineEdit()
        self.edit.setPlaceholderText("What are you doing, and why?")
        self.setMinimumWidth(460)
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addWidget(self.edit)
        lay.addWidget(buttons)


class RecordPage(QWidget):
    """States: idle -> starting -> recording <-> paused -> stopping -> idle."""

    recordingStopped = Signal(str)  # episode id

    def __init__(self, store, window=None, parent=None):
        super().__init__(parent)
        self.store, self.window_ = store, window
        self.session = None
        self.state = "idle"
        self.last_episode_id: str | None = None
        self.note_box: NoteBox | None = None
        self._bridge = _Bridge()
        self._bridge.control.connect(self._on_control)

        self.instruction = QLineEdit()
        self.instruction.setPlaceholderText("The task you are about to demonstrate, e.g. “Rename report.txt to final.txt”")
        self.fps = QDoubleSpinBox()
        self.fps.setRange(1, 30)
        self.fps.setValue(8)
        self.fps.setSuffix(" fps")
        self.audio = QCheckBox("Record the microphone (think aloud)")
        self.mic = QComboBox()
        self.mic.setToolTip("The microphone your think-aloud is recorded from")
        self.audio.toggled.connect(lambda _: self._update_state())  # the picker and the level follow it
        mic_row = QHBoxLayout()
        mic_row.addWidget(self.audio)
        mic_row.addWidget(self.mic, 1)
        form = QFormLayout()
        form.addRow("Task", self.instruction)
        form.addRow("Capture rate", self.fps)
        form.addRow("", mic_row)

        self.start_btn = QPushButton("Start recording")
        self.pause_btn = QPushButton("Pause")
        self.stop_btn = QPushButton("Stop")
        self.note_btn = QPushButton("Add note…")
        self.secret_btn = QPushButton("Secret typing")
        self.secret_btn.setCheckable(True)
        self.start_btn.clicked.connect(self.start)
        self.pause_btn.clicked.connect(self.toggle_pause)
        self.stop_btn.clicked.connect(self.stop)
        self.note_btn.clicked.connect(lambda: self.open_note_box(monotonic()))
        self.secret_btn.toggled.connect(lambda on: self.session and self.session.set_secret(on))
        buttons = QHBoxLayout()
        for b in (self.start_btn, self.pause_btn, self.stop_btn, self.note_btn, self.secret_btn):
            buttons.addWidget(b)
        buttons.addStretch(1)

        self.state_label = QLabel()
        self.state_label.setObjectName("title")
        self.fps_label = QLabel()
        self.events_label = QLabel()
        self.level = QProgressBar()
        self.level.setRange(0, 100)
        self.level.setTextVisible(False)
        self.level.setFixedWidth(160)
        self.error_label = QLabel()
        self.error_label.setObjectName("error")
        self.error_label.setWordWrap(True)
        self.level_label = QLabel("Mic")
        live = QHBoxLayout()
        for w in (self.state_label, self.fps_label, self.events_label, self.level_label, self.level):
            live.addWidget(w)
        live.addStretch(1)
        hint = QLabel("Hotkeys while recording: Ctrl+Alt+Shift+P pause/resume · Ctrl+Alt+Shift+S secret typing · "
                      "Ctrl+Alt+Shift+N note. Windows whose title matches the denylist (password managers, banking) "
                      "are never captured. After stop, review every step before submitting.")
        hint.setObjectName("muted")
        hint.setWordWrap(True)

        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addLayout(buttons)
        lay.addLayout(live)
        lay.addWidget(self.error_label)
        lay.addWidget(hint)
        lay.addStretch(1)

        self.tray = QSystemTrayIcon(_dot("#868e96"), self)
        menu = QMenu()
        self.tray_start = QAction("Start recording", menu, triggered=self.start)
        self.tray_pause = QAction("Pause", menu, triggered=self.toggle_pause)
        self.tray_stop = QAction("Stop", menu, triggered=self.stop)
        for a in (self.tray_start, self.tray_pause, self.tray_stop):
            menu.addAction(a)
        self._tray_menu = menu
        self.tray.setContextMenu(menu)
        if QSystemTrayIcon.isSystemTrayAvailable():
            self.tray.show()
        QShortcut(QKeySequence("Ctrl+Return"), self, activated=self.start)

        self.timer = QTimer(self)
        self.timer.setInterval(250)
        self.timer.timeout.connect(self._update_live)
        self.own = WindowRects()
        self._own_by_rects = False  # the recorder reads self.own (not X11's window owners): keep it fresh
        self._fill_microphones()
        self._update_state()

    def _fill_microphones(self) -> None:
        self.mic.clear()
        devices = input_devices()
        if not devices:
            self.audio.setChecked(False)
            self.audio.setEnabled(False)
            self.audio.setText("No microphone found: type notes instead (Add note…)")
            self.mic.setVisible(False)
            return
        self.mic.addItem("Default microphone", None)
        for index, name in devices:
            self.mic.addItem(name, index)
        self.mic.setVisible(True)
        self.mic.setEnabled(self.audio.isChecked())

    def _own_windows(self) -> OwnWindows:
        """Input aimed at Tandem itself is not recorded: by process id on X11, else by the
        app's window rectangles (refreshed while recording)."""
        platform = QGuiApplication.platformName()
        self._own_by_rects = False
        if platform in ("offscreen", "minimal", "vnc"):  # the app's windows are not on the captured screen
            return OwnWindows()
        if platform == "xcb":
            return OwnWindows(pid=os.getpid())
        self._own_by_rects = True
        self.own.refresh()
        return OwnWindows(at=self.own.at, focused=self.own.active)

    # ------------------------------------------------------------ controls
    def start(self) -> None:
        if self.state != "idle":
            return
        text = self.instruction.text().strip()
        if not text:
            self._error("Enter the task first: what are you about to demonstrate?")
            return

        try:
            audio = self.audio.isChecked()
            config = RecorderConfig(fps=self.fps.value(), audio=audio, audio_device=self.mic.currentData() if audio else None)
            self.session = RecordingSession(self.store, text, config, on_control=self._bridge.control.emit,
                                            own_windows=self._own_windows())
        except Exception as e:  # RecorderError: shown, not raised
            self._error(str(e))
            return
        self._error("")
        self.state = "starting"
        self._update_state()
        run_in_background(self.session.start, on_result=self._started, on_error=self._start_failed)

    def _started(self, episode) -> None:
        self.state = "recording"
        self.timer.start()
        self._update_state()
        if self.session is not None and self.session.warnings:
            self._error("Warning: " + "; ".join(self.session.warnings))

    def _start_failed(self, exc) -> None:
        self.session = None
        self.state = "idle"
        self._error(f"Recording did not start: {exc}")
        self._update_state()

    def toggle_pause(self) -> None:
        if self.session is None or self.state not in ("recording", "paused"):
            return
        self.session.toggle_pause()
        self.state = "paused" if self.session.paused else "recording"
        self._update_state()

    def stop(self) -> None:
        if self.session is None or self.state not in ("recording", "paused"):
            return
        self.state = "stopping"
        self.timer.stop()
        self._update_state()
        run_in_background(self.session.stop, on_result=self._stopped, on_error=self._stop_failed)

    def confirm_close(self) -> bool:
        """Before the app closes: a running recording is stopped and saved, or the close is
        cancelled. Without this the app exited mid-recording and left the episode 'recording'."""
        if self.session is None or self.state not in ("recording", "paused"):
            return True
        answer = QMessageBox.question(
            self, "Recording in progress", "A recording is running. Stop it and save it before closing?",
            QMessageBox.Save | QMessageBox.Cancel, QMessageBox.Save)
        if answer != QMessageBox.Save:
            return False
        self.timer.stop()
        try:
            episode = self.session.stop()  # on this thread: the app is closing, the wait is the point
        except NothingRecorded:  # nothing to keep: closing goes on
            self.session, self.state = None, "idle"
            return True
        except Exception as e:  # the raw events are stored; closing goes on
            print(f"tandem: stopping the recording failed: {e}", file=sys.stderr)
            self.session, self.state = None, "idle"
            return True
        self.session, self.state, self.last_episode_id = None, "idle", episode.id
        return True

    def _stopped(self, episode) -> None:
        self.session = None
        self.state = "idle"
        self.last_episode_id = episode.id
        self.secret_btn.setChecked(False)
        self._update_state()
        self.recordingStopped.emit(episode.id)
        self.open_in_viewer(episode.id)

    def _stop_failed(self, exc) -> None:
        self.session = None
        self.state = "idle"
        self.secret_btn.setChecked(False)
        if isinstance(exc, NothingRecorded):  # not an episode: the Library and its viewer stay as they were
            self._error(str(exc))
            if self.window_ is not None and hasattr(self.window_, "notify"):
                self.window_.notify(str(exc))
        else:
            self._error(f"Stopping failed; the raw events are in the store ({command_name()} record --rereduce ID): {exc}")
        self._update_state()

    def open_in_viewer(self, episode_id: str) -> None:
        """Show the recording in the step viewer for review: the window's own opener if it has
        one, else the Library page's viewer."""
        w = self.window_
        if w is None:
            return
        opener = getattr(w, "open_episode", None)
        if callable(opener):
            opener(episode_id)
            return
        try:
            library = w.page("Library")
        except KeyError:
            return
        library.refresh()
        library.select_episode(episode_id)
        names = [n for n, _ in w.pages_spec]
        w.show_page_at(names.index("Library"))
        if hasattr(w, "notify"):
            w.notify("Recording saved: review each step, fix actions and thoughts, and mark the outcome.")

    # ------------------------------------------------------------ notes
    def _on_control(self, name: str, t: float) -> None:
        if name == "note":
            self.open_note_box(t)
        elif name in ("pause", "secret") and self.session is not None:
            if self.state in ("recording", "paused"):
                self.state = "paused" if self.session.paused else "recording"
            self.secret_btn.blockSignals(True)
            self.secret_btn.setChecked(self.session.secret)
            self.secret_btn.blockSignals(False)
            self._update_state()

    def open_note_box(self, t: float) -> NoteBox | None:
        if self.session is None:
            return None
        box = NoteBox(t, self)
        box.accepted.connect(lambda: self.session and self.session.add_note(box.edit.text(), t=box.t))
        box.show()
        box.raise_()
        self.note_box = box
        return box

    # ------------------------------------------------------------ view
    def _error(self, text: str) -> None:
        self.error_label.setText(text)

    def _update_live(self) -> None:
        if self.session is None:
            return
        if self._own_by_rects:
            self.own.refresh()
        st = self.session.stats()
        self.fps_label.setText(f"{st['fps']:.1f} fps")
        self.events_label.setText(plural(st["events"], "event"))
        level = st["audio_level"]
        self.level.setEnabled(level is not None)
        self.level.setValue(int(100 * (level or 0.0)))
        if st["denied"]:
            self.state_label.setText(f"● Not capturing: “{st['denied']}” window focused")
        elif self.state == "recording":
            self.state_label.setText("● Secret typing" if st["secret"] else
                                     "● Password field: keys hidden" if st.get("password_field") else "● Recording")

    def _update_state(self) -> None:
        s = self.state
        self.start_btn.setEnabled(s == "idle")
        self.instruction.setEnabled(s == "idle")
        self.fps.setEnabled(s == "idle")
        self.audio.setEnabled(s == "idle" and self.mic.count() > 0)
        self.mic.setEnabled(s == "idle" and self.audio.isChecked())
        self.level.setVisible(self.audio.isChecked())
        self.level_label.setVisible(self.audio.isChecked())
        self.pause_btn.setEnabled(s in ("recording", "paused"))
        self.pause_btn.setText("Resume" if s == "paused" else "Pause")
        self.stop_btn.setEnabled(s in ("recording", "paused"))
        self.note_btn.setEnabled(s in ("recording", "paused"))
        self.secret_btn.setEnabled(s in ("recording", "paused"))
        self.tray_start.setEnabled(s == "idle")
        self.tray_pause.setEnabled(s in ("recording", "paused"))
        self.tray_pause.setText("Resume" if s == "paused" else "Pause")
        self.tray_stop.setEnabled(s in ("recording", "paused"))
        label, color = {
            "idle": ("Not recording", "#868e96"), "starting": ("Starting…", "#f08c00"),
            "recording": ("● Recording", "#e03131"), "paused": ("❚❚ Paused", "#f08c00"),
            "stopping": ("Saving…", "#f08c00"),
        }[s]
        self.state_label.setText(label)
        self.state_label.setStyleSheet(f"color: {color};")
        self.tray.setIcon(_dot(color))
        self.tray.setToolTip(f"Tandem: {label}")
        if s == "idle":
            self.fps_label.setText("")
            self.events_label.setText("")
            self.level.setValue(0)

    def closeEvent(self, event) -> None:
        if self.session is not None and self.state in ("recording", "paused"):
            try:
                self.session.stop()
            except NothingRecorded:
                pass
        self.tray.hide()
        super().closeEvent(event)
