"""Shared fixtures. Qt runs offscreen unless a test asks for the X display (`xdisplay`), which
starts one Xvfb for the whole session (installed by packaging/install.sh)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# the CLIs under test pick torch threads from the free cores (agent.threads); tests run on one, as their fixtures do
os.environ.setdefault("TANDEM_THREADS", "1")
os.environ.setdefault("TANDEM_DATA", str(Path(os.environ.get("TMPDIR", "/tmp")) / f"tandem-test-data-{os.getpid()}"))


def _free_display() -> int:
    for n in range(90, 200):
        if not Path(f"/tmp/.X{n}-lock").exists() and not Path(f"/tmp/.X11-unix/X{n}").exists():
            return n
    raise RuntimeError("no free X display number between :90 and :199")


@pytest.fixture(scope="session")
def xdisplay():
    """An Xvfb display (1920x1080) for the session; sets DISPLAY. Yields ':N'."""
    if not shutil.which("Xvfb"):
        pytest.fail("Xvfb is not installed: run `bash packaging/install.sh --test` first")
    n = _free_display()
    display = f":{n}"
    proc = subprocess.Popen(
        ["Xvfb", display, "-screen", "0", "1920x1080x24", "-nolisten", "tcp", "-ac"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 10
    while not Path(f"/tmp/.X11-unix/X{n}").exists():
        if proc.poll() is not None or time.time() > deadline:
            pytest.fail(f"Xvfb {display} did not start")
        time.sleep(0.05)
    old = os.environ.get("DISPLAY")
    os.environ["DISPLAY"] = display
    os.environ["XDG_SESSION_TYPE"] = "x11"
    yield display
    _wake_stopped_listeners(display)
    proc.terminate()
    proc.wait(5)
    if old is None:
        os.environ.pop("DISPLAY", None)
    else:
        os.environ["DISPLAY"] = old


def _wake_stopped_listeners(display: str) -> None:
    """A stopped pynput listener's thread returns only at the next X input event (see
    agent/recorder/input.py); give them one before the display goes, so none dies on a closed
    connection."""
    import threading

    if shutil.which("xdotool"):  # a mouse listener wakes on a motion, a keyboard listener on a key
        for cmd in (["mousemove_relative", "--", "1", "0"], ["key", "shift"]):
            subprocess.run(["xdotool", *cmd], env={**os.environ, "DISPLAY": display}, capture_output=True, timeout=5)
    for t in threading.enumerate():
        if t is not threading.current_thread() and "pynput" in type(t).__module__:
            t.join(timeout=2)


@pytest.fixture
def store(tmp_path):
    from agent.storage.store import Store

    s = Store(tmp_path / "data")
    yield s
    s.close()


@pytest.fixture
def backend(tmp_path):
    """A live backend on loopback with a user of each role: `.tokens` maps ann, ann2 (annotators),
    sup, sup2 (supervisors) and root (admin) to their tokens. A module's own `backend` replaces it."""
    from trainer.backend.server_thread import start_in_thread

    b = start_in_thread(tmp_path / "backend")
    b.tokens = {name: b.store.add_user(name, role) for name, role in
                [("ann", "annotator"), ("ann2", "annotator"), ("sup", "supervisor"), ("sup2", "supervisor"),
                 ("root", "admin")]}
    yield b
    b.stop()


@pytest.fixture(scope="module")
def backend_for_fuzz(tmp_path_factory):
    """A live backend on loopback and an admin token, shared by a fuzz test's examples."""
    from trainer.backend.server_thread import start_in_thread

    b = start_in_thread(tmp_path_factory.mktemp("fuzz-backend"))
    token = b.store.add_user("fuzz-admin-7f3a", "admin")  # a name random frames will not revoke by chance
    yield b, token
    b.stop()
