"""Password fields, where the platform tells: a real accessibility bus (a private D-Bus session
with at-spi2-core), a real Qt login window on Xvfb, real input by xdotool. What is typed into
the password field is stored only as a placeholder, what is typed elsewhere is kept; and the
agent's gate asks before the agent types while a password field is focused."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.test_recorder_e2e import xdo

LOGIN = """
import json, sys
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QFormLayout, QLineEdit, QWidget
app = QApplication(sys.argv)
w = QWidget()
w.setWindowTitle("tandem login")
form = QFormLayout(w)
user, pw = QLineEdit(), QLineEdit()
pw.setEchoMode(QLineEdit.Password)
form.addRow("user", user)
form.addRow("password", pw)
w.setGeometry(200, 200, 420, 120)
w.show()
centre = lambda x: [x.mapToGlobal(x.rect().center()).x(), x.mapToGlobal(x.rect().center()).y()]
QTimer.singleShot(500, lambda: print(json.dumps({"user": centre(user), "pw": centre(pw)}), flush=True))
pw.textChanged.connect(lambda t: print(json.dumps({"pw_len": len(t)}), flush=True))
app.exec()
"""


@pytest.fixture
def a11y_session(monkeypatch):
    """A private D-Bus session bus; the accessibility bus is started from it on demand."""
    if not (shutil.which("dbus-daemon") and os.path.exists("/usr/libexec/at-spi-bus-launcher")):
        pytest.fail("dbus-daemon or at-spi2-core is missing: run `bash packaging/install.sh --test`")
    proc = subprocess.Popen(["dbus-daemon", "--session", "--nofork", "--print-address=1"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    address = proc.stdout.readline().strip()
    assert address.startswith("unix:"), address
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", address)
    monkeypatch.delenv("AT_SPI_BUS_ADDRESS", raising=False)
    yield address
    os.killpg(proc.pid, signal.SIGTERM)  # the bus and what it activated (the a11y bus, the registry)
    proc.wait(5)


def test_keys_typed_into_a_password_field_are_stored_as_a_placeholder(xdisplay, a11y_session, store):
    from agent.recorder.reduce import SECRET_PLACEHOLDER
    from agent.recorder.session import RecorderConfig, RecordingSession

    session = RecordingSession(store, "log in", RecorderConfig(fps=10))
    session.start()  # watches the accessibility bus and turns applications' bridges on
    login, spots = login_window()
    try:
        xdo("mousemove", *spots["user"], "click", "--delay", 0, 1)
        time.sleep(0.4)
        xdo("type", "--delay", 20, "alice")
        time.sleep(0.3)
        xdo("mousemove", *spots["pw"], "click", "--delay", 0, 1)
        deadline = time.monotonic() + 5
        while not session.in_password and time.monotonic() < deadline:
            time.sleep(0.02)
        assert session.in_password, session.password.reason
        assert session.stats()["password_field"] and not session.stats()["secret"]  # the Record page shows it
        xdo("type", "--delay", 20, "hunter2")
        assert json.loads(login.stdout.readline()) == {"pw_len": 1}  # the field got the keys
        time.sleep(0.5)
        xdo("mousemove", *spots["user"], "click", "--delay", 0, 1)
        time.sleep(0.4)
        assert not session.in_password
        xdo("type", "--delay", 20, "x")
        time.sleep(0.5)
    finally:
        ep = session.stop()
        login.terminate()
        login.wait(5)
    assert ep.meta["privacy"]["password_fields"] == {"watched": True, "how": "AT-SPI"}
    raw = store.raw_events(ep.id)
    keys = [e["key"] for e in raw if e["kind"] == "key_down"]
    assert not set("hunter2") - set("alice") & set(keys), keys  # h, u, n, t, r, 2: never stored
    assert [e["kind"] for e in raw if e["kind"].startswith("password_")] == ["password_on", "password_off"]
    typed = [s.action.args["content"] for s in ep.steps if s.action.name == "type"]
    assert typed == ["alice", SECRET_PLACEHOLDER, "x"]


def login_window():
    proc = subprocess.Popen([sys.executable, "-c", LOGIN], env={**os.environ, "QT_QPA_PLATFORM": "xcb"},
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return proc, json.loads(proc.stdout.readline())


def observe_until(executor, want: bool, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while True:
        frame = executor.observe()
        if bool(frame.extra.get("password_focused")) == want or time.monotonic() > deadline:
            return frame
        time.sleep(0.05)


def test_the_gate_asks_before_the_agent_types_into_a_password_field(xdisplay, a11y_session):
    from types import SimpleNamespace

    from agent.executors.desktop import DesktopExecutor
    from agent.run.gate import Gate
    from agent.schema import Action

    ex = DesktopExecutor()
    assert "password_focused" not in ex.observe().extra and ex._password.available, ex._password.reason
    login, spots = login_window()
    try:
        gate = Gate("risky", supervisor=object())
        typing = SimpleNamespace(actions=[Action("type", {"content": "hunter2"})])
        xdo("mousemove", *spots["pw"], "click", "--delay", 0, 1)
        frame = observe_until(ex, True)
        assert frame.extra.get("password_focused") is True
        assert gate.why_ask(typing, frame) == "typing into a password field"
        xdo("mousemove", *spots["user"], "click", "--delay", 0, 1)
        frame = observe_until(ex, False)
        assert "password_focused" not in frame.extra and gate.why_ask(typing, frame) is None
    finally:
        ex.close()
        login.terminate()
        login.wait(5)


def test_without_an_accessibility_bus_the_recording_says_so(monkeypatch):
    from agent.host.password_focus import PasswordFocus

    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS", raising=False)
    monkeypatch.delenv("AT_SPI_BUS_ADDRESS", raising=False)
    pf = PasswordFocus().start(timeout=2)
    assert not pf.available and "no accessibility bus" in pf.reason
    assert not pf.active
    pf.stop()


def test_password_state_is_answered_for_the_time_of_each_key():
    """A key typed before the focus left the field is masked even if it is handled later."""
    from agent.host.password_focus import PasswordFocus

    pf = PasswordFocus()
    pf._set(True, 5.0)
    pf._set(True, 6.0)  # no change: no new entry
    pf._set(False, 8.0)
    assert [pf.active_at(t) for t in (4.9, 5.0, 7.9, 8.0, 9.0)] == [False, True, True, False, False]
    assert len(pf._times) == 3 and not pf.active


def test_a_recording_without_the_accessibility_bus_warns_the_annotator(xdisplay, store, monkeypatch):
    """Masking turns itself off where nothing can say a password field is focused; the recorder
    says so out loud (the CLI prints it, the Record page shows it), not only in the metadata."""
    from agent.recorder.errors import NothingRecorded
    from agent.recorder.session import RecorderConfig, RecordingSession

    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS", raising=False)
    monkeypatch.delenv("AT_SPI_BUS_ADDRESS", raising=False)
    session = RecordingSession(store, "log in", RecorderConfig(fps=5))
    session.start()
    try:
        xdo("mousemove", 500, 500, "click", "--delay", 0, 1)  # one step: a recording of nothing is not kept
        time.sleep(0.4)
        assert session.warnings and "password fields are NOT masked" in session.warnings[0]
        assert "no accessibility bus" in session.warnings[0]
    finally:
        ep = session.stop()
    assert ep.meta["privacy"]["password_fields"]["watched"] is False
    off = RecordingSession(store, "no masking asked", RecorderConfig(fps=5, password_fields=False))
    off.start()
    with pytest.raises(NothingRecorded):
        off.stop()
    assert off.warnings == []  # masking switched off on purpose: nothing to warn about
