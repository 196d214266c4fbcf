"""Privacy by construction, on a real X display with real input: pause/resume by hotkey, a
denied window (its title on the denylist) whose frames and keys are dropped, secret typing
stored as a placeholder; and the review's delete and blur, which change what is stored."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from agent.schema import monotonic
from tests.test_recorder_e2e import centre, target, xdo  # noqa: F401 - the fixture

BANK = """
import sys
from PySide6.QtWidgets import QApplication, QLabel
app = QApplication(sys.argv)
w = QLabel("account 12345")
w.setWindowTitle("Example Bank - Online Banking")
w.setGeometry(1500, 40, 360, 200)
w.show()
print("up", flush=True)
app.exec()
"""


@pytest.fixture
def bank_window(xdisplay, target):  # noqa: F811
    proc = subprocess.Popen([sys.executable, "-c", BANK], env={**os.environ, "QT_QPA_PLATFORM": "xcb"},
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout.readline().strip() == "up"
    time.sleep(0.5)  # mapped on top of the full-screen target
    yield
    proc.terminate()
    proc.wait(5)


def focus(name: str) -> None:
    """Give the keyboard focus to the window titled `name` (no window manager: xdotool sets it)."""
    xdo("search", "--name", name, "windowfocus", "--sync")
    time.sleep(0.1)


def kinds(store, ep):
    return [e for e in store.raw_events(ep.id)]


def record(store, body, **cfg):
    from agent.recorder.session import RecorderConfig, RecordingSession

    session = RecordingSession(store, "privacy", RecorderConfig(fps=10, **cfg))
    session.start()
    time.sleep(0.3)
    body(session)
    time.sleep(0.5)
    return session.stop()


def test_pause_hotkey_drops_everything_until_resume(target, store):  # noqa: F811
    st = json.loads(target.read_text())
    a, b, f = centre(st, "alpha"), centre(st, "beta"), centre(st, "field")
    marks = {}

    def body(session):
        xdo("mousemove", *a, "click", "--delay", 0, 1)
        time.sleep(0.3)
        xdo("key", "ctrl+alt+shift+p")
        time.sleep(0.3)
        marks["paused"] = monotonic()
        assert session.paused
        xdo("mousemove", *f, "click", "--delay", 0, 1)
        xdo("type", "--delay", 10, "private")
        time.sleep(0.5)
        marks["resuming"] = monotonic()
        xdo("key", "ctrl+alt+shift+p")
        time.sleep(0.3)
        assert not session.paused
        xdo("mousemove", *b, "click", "--delay", 0, 1)

    ep = record(store, body)
    assert json.loads(target.read_text())["text"] == "private"  # it was typed, just not recorded
    assert [(s.action.name, s.info["screen_points"]) for s in ep.steps] == [("click", [list(a)]), ("click", [list(b)])]
    raw = kinds(store, ep)
    assert [e["kind"] for e in raw if e["kind"] in ("pause", "resume")] == ["pause", "resume"]
    pause_t = next(e["t"] for e in raw if e["kind"] == "pause")
    resume_t = next(e["t"] for e in raw if e["kind"] == "resume")
    assert pause_t < marks["paused"] < marks["resuming"] < resume_t
    inside = [e for e in raw if pause_t < e["t"] < resume_t]
    assert inside == []  # no keys, no clicks, no frames while paused
    assert not any(e.get("key") in ("p", "P") for e in raw)  # the hotkey itself is not recorded
    assert ep.meta["recording"]["dropped_private"] >= 2 + 2 * len("private")


def test_denied_window_drops_frames_and_keys(bank_window, target, store):  # noqa: F811
    from agent.recorder.privacy import FocusedWindow

    st = json.loads(target.read_text())
    a, b = centre(st, "alpha"), centre(st, "beta")
    fw = FocusedWindow()
    focus("Online Banking")
    assert fw.get()[0] == "Example Bank - Online Banking"
    focus("tandem target")
    assert fw.get()[0] == "tandem target"
    fw.close()

    def body(session):
        xdo("mousemove", *a, "click", "--delay", 0, 1)
        time.sleep(0.3)
        focus("Online Banking")  # as alt+tab would: keys now go to the bank
        time.sleep(0.3)
        assert session.denied == "online banking", session.error
        xdo("type", "--delay", 10, "pin4321")
        time.sleep(0.2)
        focus("tandem target")
        time.sleep(0.3)
        assert session.denied is None
        xdo("mousemove", *b, "click", "--delay", 0, 1)

    ep = record(store, body)
    assert [(s.action.name, s.info["screen_points"]) for s in ep.steps] == [("click", [list(a)]), ("click", [list(b)])]
    raw = kinds(store, ep)
    denied_t = next(e["t"] for e in raw if e["kind"] == "denied")
    allowed_t = next(e["t"] for e in raw if e["kind"] == "allowed")
    assert [e for e in raw if e["kind"] in ("key_down", "key_up")] == []
    assert [e for e in raw if e["kind"] == "frame" and denied_t <= e["t"] <= allowed_t] == []
    assert ep.meta["privacy"]["denylist_active"] is True


def test_secret_typing_is_stored_as_a_placeholder(target, store):  # noqa: F811
    from agent.recorder.reduce import SECRET_PLACEHOLDER

    st = json.loads(target.read_text())
    f = centre(st, "field")

    def body(session):
        xdo("mousemove", *f, "click", "--delay", 0, 1)
        time.sleep(0.3)
        xdo("type", "--delay", 10, "user ")
        xdo("key", "ctrl+alt+shift+s")
        xdo("type", "--delay", 10, "pw12")
        xdo("key", "ctrl+alt+shift+s")
        xdo("key", "Return")

    ep = record(store, body)
    assert json.loads(target.read_text())["submitted"] == ["user pw12"]
    assert [(s.action.name, s.action.args.get("content")) for s in ep.steps] == [
        ("click", None), ("type", f"user {SECRET_PLACEHOLDER}\n")]
    keys = [e["key"] for e in kinds(store, ep) if e["kind"] == "key_down"]
    assert not set("pw12") & set(keys)
    assert [e["kind"] for e in kinds(store, ep) if e["kind"].startswith("secret")] == ["secret_on", "secret_off"]


# ---------------------------------------------------------------- review (no display needed)
def _image(seed: int) -> bytes:
    import cv2
    import numpy as np

    rng = np.random.default_rng(seed)
    img = rng.integers(0, 255, (100, 200, 3), dtype=np.uint8)
    return cv2.imencode(".png", img)[1].tobytes()


def _episode(store):
    from agent.schema import Action, Episode, Observation, ScreenGeometry, Step

    geo = ScreenGeometry.simple(200, 100)
    a, b, c = (store.put_blob(_image(i)) for i in range(3))
    steps = [
        Step(0, Observation(a, 200, 100, geo, post_screenshot=b), "", Action("click", {"start_box": (0.1, 0.1)}), t_start=1, t_end=1.1),
        Step(1, Observation(b, 200, 100, geo, post_screenshot=c), "", Action("type", {"content": "pw"}), t_start=2, t_end=2.5),
        Step(2, Observation(c, 200, 100, geo), "", Action("click", {"start_box": (0.5, 0.5)}), t_start=3, t_end=3.1),
    ]
    ep = store.save_episode(Episode("review", steps=steps))
    store.append_raw_events(ep.id, [
        {"t": 0.9, "kind": "frame", "blob": a}, {"t": 1.0, "kind": "mouse_down", "x": 20, "y": 10, "button": "left"},
        {"t": 1.95, "kind": "frame", "blob": b}, {"t": 2.0, "kind": "key_down", "key": "p"}, {"t": 2.5, "kind": "key_down", "key": "w"},
        {"t": 3.0, "kind": "mouse_down", "x": 100, "y": 50, "button": "left"},
    ])
    return ep, (a, b, c)


def test_blur_rewrites_the_image_everywhere_and_drops_the_old_one(store):
    import cv2
    import numpy as np

    from agent.recorder.errors import RecorderError
    from agent.recorder.review import blur_region

    ep, (a, b, c) = _episode(store)
    new = blur_region(store, ep.id, 1, (0.0, 0.0, 0.5, 0.5), which="pre")  # b: step 1's pre and step 0's post
    assert new != b and not store.has_blob(b)
    ep2 = store.load_episode(ep.id)
    assert ep2.steps[1].observation.screenshot == new and ep2.steps[0].observation.post_screenshot == new
    before = cv2.imdecode(np.frombuffer(_image(1), np.uint8), cv2.IMREAD_COLOR).astype(int)
    after = cv2.imdecode(np.frombuffer(store.get_blob(new), np.uint8), cv2.IMREAD_COLOR).astype(int)
    assert np.abs(after[:50, :100] - before[:50, :100]).mean() > 30  # noise blurred away
    assert np.array_equal(after[55:, 105:], before[55:, 105:])  # the rest untouched (PNG: lossless)
    assert any(e.get("blob") == new for e in store.raw_events(ep.id))  # re-reduction finds the blurred frame
    assert ep2.revision == ep.revision + 1 and store.check() == []
    with pytest.raises(RecorderError, match="normalized"):
        blur_region(store, ep.id, 1, (0.5, 0.5, 0.2, 0.9))
    with pytest.raises(RecorderError, match="no step 9"):
        blur_region(store, ep.id, 9, (0, 0, 1, 1))


def test_delete_step_removes_its_input_and_its_only_images(store):
    from agent.recorder.review import delete_step

    ep, (a, b, c) = _episode(store)
    delete_step(store, ep.id, 1)
    ep2 = store.load_episode(ep.id)
    assert [(s.index, s.action.name) for s in ep2.steps] == [(0, "click"), (1, "click")]
    assert store.has_blob(b) and store.has_blob(c)  # still used by step 0's post and the new step 1
    assert [e.get("key") for e in store.raw_events(ep.id) if e["kind"] == "key_down"] == []
    delete_step(store, ep.id, 0)
    assert not store.has_blob(a) and store.check() == []
