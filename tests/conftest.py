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
    proc.terminate()
    proc.wait(5)
    if old is None:
        os.environ.pop("DISPLAY", None)
    else:
        os.environ["DISPLAY"] = old


@pytest.fixture
def store(tmp_path):
    from agent.store import Store

    s = Store(tmp_path / "data")
    yield s
    s.close()
