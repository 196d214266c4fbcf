"""The recorder end to end on a real X display: a real Qt window (tests/desktop_target.py on xcb),
real input from xdotool, the real capture core (pynput, mss, OpenCV) and a real store. The
episode must hold exactly the actions done, at the pixels they were done at, each with a frame
from before it; the window's own state proves the input really happened. Then the `record` CLI
is killed with SIGKILL mid-session and the store must open and hold the events up to the last
second."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from agent.schema import monotonic
from tests.conftest import ROOT

pytestmark = pytest.mark.desktop
TARGET = ROOT / "tests" / "desktop_target.py"


def xdo(*args):
    subprocess.run(["xdotool", *map(str, args)], check=True)


@pytest.fixture
def target(xdisplay, tmp_path):
    state = tmp_path / "state.json"
    env = {**os.environ, "QT_QPA_PLATFORM": "xcb"}
    proc = subprocess.Popen([sys.executable, str(TARGET), str(state)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 20
    while not (state.exists() and json.loads(state.read_text()).get("ready")):
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"the target window did not come up: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.05)
    yield state
    proc.terminate()
    proc.wait(5)


def centre(state: dict, name: str) -> tuple[int, int]:
    x, y, w, h = state["widgets"][name]
    return x + w // 2, y + h // 2


def dark_pixels(store, blob: str, rect) -> int:
    import cv2
    import numpy as np

    img = cv2.imdecode(np.frombuffer(store.get_blob(blob), np.uint8), cv2.IMREAD_GRAYSCALE)
    x, y, w, h = rect
    return int((img[y + 4:y + h - 4, x + 2:x + w - 4] < 100).sum())  # inside the border


def test_recording_holds_exactly_the_actions_done(target, store):
    from agent.recorder.session import RecorderConfig, RecordingSession

    st = json.loads(target.read_text())
    alpha, beta, field = centre(st, "alpha"), centre(st, "beta"), centre(st, "field")
    fx, fy, fw, fh = st["widgets"]["field"]
    session = RecordingSession(store, "Exercise every action", RecorderConfig(fps=10, save_every_s=1.0))
    session.start()
    pause = 0.4
    time.sleep(pause)
    xdo("mousemove", *alpha, "click", "--delay", 0, 1)
    time.sleep(pause)
    xdo("mousemove", *field, "click", "--repeat", 2, "--delay", 0, 1)
    time.sleep(pause)
    xdo("mousemove", *beta, "click", "--delay", 0, 3)
    time.sleep(pause)
    drag_from, drag_to = (fx + 40, field[1]), (fx + 300, field[1] + 5)
    xdo("mousemove", *drag_from, "mousedown", 1, "mousemove", "--sync", drag_from[0] + 100, drag_from[1] + 2,
        "mousemove", "--sync", *drag_to, "mouseup", 1)
    time.sleep(pause)
    xdo("mousemove", *field, "click", "--delay", 0, 1)
    time.sleep(pause)
    xdo("type", "--delay", 20, "helxp")
    xdo("key", "--delay", 20, "BackSpace", "BackSpace")
    xdo("type", "--delay", 20, "lo")
    time.sleep(pause)
    xdo("key", "ctrl+a")
    time.sleep(pause)
    xdo("mousemove", 1000, 900, "click", "--repeat", 3, "--delay", 30, 5)
    time.sleep(0.8)
    ep = session.stop()

    state = json.loads(target.read_text())
    assert state["text"] == "hello" and state["clicks"]["alpha"] == 1  # the input really reached the window
    got = [(s.action.name, s.info["screen_points"], s.action.args.get("content") or s.action.args.get("key") or s.action.args.get("direction"))
           for s in ep.steps]
    assert got == [
        ("click", [list(alpha)], None),
        ("left_double", [list(field)], None),
        ("right_single", [list(beta)], None),
        ("drag", [list(drag_from), list(drag_to)], None),
        ("click", [list(field)], None),
        ("type", [], "hello"),
        ("hotkey", [], "ctrl a"),
        ("scroll", [[1000, 900]], "down"),
    ]
    assert ep.steps[-1].info["clicks"] == 3
    # normalized coordinates map back to the same pixels
    from agent import coords
    from agent.schema import ScreenGeometry

    geo = ScreenGeometry.from_dict(ep.meta["screen"])
    assert geo.to_dict() == ScreenGeometry(1920, 1080, 1920, 1080, 1.0, 0, 0).to_dict()
    assert coords.normalized_to_screen(ep.steps[0].action.args["start_box"], geo) == alpha
    for s in ep.steps:  # each has a frame captured before the action began
        assert s.observation.screenshot and s.observation.time < s.t_start, s
        assert store.get_blob(s.observation.screenshot)[:2] == b"\xff\xd8"
        assert (s.observation.width, s.observation.height) == (1920, 1080)
    typing = ep.steps[5]
    assert dark_pixels(store, typing.observation.screenshot, (fx, fy, fw, fh)) < 30  # empty field (a caret at most)
    assert dark_pixels(store, typing.observation.post_screenshot, (fx, fy, fw, fh)) > 60  # "hello" after
    # stored as it came, and the episode reloads as saved
    assert ep.meta["reducer_version"] >= 1 and ep.meta["recording"]["status"] == "complete"
    again = store.load_episode(ep.id)
    assert [s.action for s in again.steps] == [s.action for s in ep.steps]
    assert sum(1 for e in store.raw_events(ep.id) if e["kind"] == "mouse_down") == 6
    assert store.check() == []  # no frame left that no step shows


def test_sigkill_leaves_the_events_up_to_the_last_second(xdisplay, tmp_path):
    data = tmp_path / "data"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "main.py"), "record", "--instruction", "killed mid-session", "--fps", "8", "--data", str(data)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        episode_id = json.loads(line)["episode"]
        sent = []
        t_end = monotonic() + 2.5
        x = 100
        while monotonic() < t_end:
            before = monotonic()
            xdo("mousemove", x, 500, "click", "--delay", 0, 1)
            sent.append((before, monotonic()))  # the click happened somewhere in between
            x += 7
            time.sleep(0.05)
        t_kill = monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)
    finally:
        if proc.poll() is None:
            proc.kill()
    from agent.recorder.session import rereduce
    from agent.storage.store import Store

    with Store(data) as store:
        ep = store.load_episode(episode_id)
        assert ep.meta["recording"]["status"] == "recording"  # it never got to stop
        downs = [e["t"] for e in store.raw_events(episode_id) if e["kind"] == "mouse_down"]
        assert len(sent) >= 20
        # every click done more than a second before the kill is stored, and nothing else
        edge = t_kill - 1.0
        done = len([1 for before, after in sent if after < edge])
        maybe = len([1 for before, after in sent if before < edge])
        assert done <= len([t for t in downs if t < edge]) <= maybe, (done, maybe, downs, sent)
        assert max(downs) > t_kill - 1.0
        ep = rereduce(store, episode_id)
        assert ep.meta["recording"]["status"] == "recovered"
        assert [s.action.name for s in ep.steps].count("click") == len(downs)
        assert store.check() == []


def test_cli_recording_of_nothing_says_so_and_keeps_nothing(xdisplay, tmp_path):
    """`record --duration` with no input at all: one error line, exit 1, no episode, no frame."""
    data = tmp_path / "data"
    out = subprocess.run(
        [sys.executable, str(ROOT / "main.py"), "record", "--instruction", "idle", "--fps", "8", "--duration", "1",
         "--data", str(data)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip().splitlines()[-1] == ("error: Nothing was recorded: no click, key press or scroll reached "
                                                   "the screen while recording. No episode was saved.")
    from agent.storage.store import Store

    with Store(data) as store:
        assert store.episode_ids() == [] and store.check() == []
