"""The app on a real X display (Xvfb), in subprocesses: Drive mode completes a task in a real
window with a replay policy; the kill-switch hotkey sent by xdotool stops it mid-run; the
Supervise page edits a sandbox step on screen. Screenshots of both modes are saved."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import coords
from tests.test_agent_desktop import model_point, read_state, responses_for, start_target

pytestmark = pytest.mark.desktop
DRIVER = Path(__file__).with_name("app_driver.py")
DRIVE_SHOT, SUPERVISE_SHOT = "/tmp/tandem_drive.png", "/tmp/tandem_supervise.png"


@pytest.fixture
def target(xdisplay, tmp_path):
    state = tmp_path / "target.json"
    proc = start_target(xdisplay, state)
    yield state
    proc.terminate()
    proc.wait(5)


def run_driver(xdisplay, tmp_path, mode, responses, shot=None):
    rfile = tmp_path / "responses.jsonl"
    rfile.write_text("".join(json.dumps(r) + "\n" for r in responses))
    out = tmp_path / "driver.json"
    env = {**os.environ, "QT_QPA_PLATFORM": "xcb", "DISPLAY": xdisplay, "XDG_SESSION_TYPE": "x11"}
    args = [sys.executable, str(DRIVER), mode, str(out), str(tmp_path / "data"), str(rfile)] + ([shot] if shot else [])
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return proc, out


def result_of(proc, out, timeout=60):
    try:
        log = proc.communicate(timeout=timeout)[0].decode(errors="replace")
    except subprocess.TimeoutExpired:
        proc.kill()
        log = proc.communicate()[0].decode(errors="replace")
    assert out.exists() and "reason" in json.loads(out.read_text()), f"the app did not finish its run:\n{log[-3000:]}"
    return json.loads(out.read_text())


def test_drive_completes_a_task_in_a_real_window(xdisplay, target, tmp_path):
    st = json.loads(target.read_text())
    proc, out = run_driver(xdisplay, tmp_path, "drive", responses_for(st, 1920, 1080), DRIVE_SHOT)
    res = result_of(proc, out)
    assert res["reason"] == "finished" and res["steps"] == 5
    after = read_state(target)
    assert after["text"] == "héllo wörld" and after["submitted"] == ["héllo wörld"]
    assert after["clicks"] == {"alpha": 1, "beta": 1}
    # out of the way while acting, back afterwards; the strip shows meanwhile
    assert not any(res["window_visible_during_steps"]) and all(res["strip_visible_during_steps"])
    assert res["window_visible_after"] is True
    assert Path(DRIVE_SHOT).stat().st_size > 10_000
    # the strip is on screen (the screenshot above shows it) but painted out of what the agent saw
    import io

    import numpy as np
    from PIL import Image

    from agent.storage.store import Store

    (x, y, w, h), = res["strip_rects"]
    with Store(tmp_path / "data") as store:
        step = store.load_episode(res["episode"]).steps[1]
        seen = np.asarray(Image.open(io.BytesIO(store.get_blob(step.observation.screenshot))).convert("L")).astype(int)
    inside = seen[y + 2:y + h - 2, x + 2:x + w - 2]
    assert inside.size > 10_000 and np.abs(inside - 128).max() <= 3  # flat grey (JPEG keeps it within a few levels)
    shot = np.asarray(Image.open(DRIVE_SHOT).convert("L")).astype(int)[y + 2:y + h - 2, x + 2:x + w - 2]
    assert shot.std() > 5  # while the real screen showed the strip's text and buttons


def test_kill_switch_hotkey_stops_drive_mid_run(xdisplay, target, tmp_path):
    st = json.loads(target.read_text())
    b = model_point(st, "beta", 1920, 1080)
    click_beta = f"Thought: Press Beta again.\nAction: click(start_box='({b[0]},{b[1]})')"
    proc, out = run_driver(xdisplay, tmp_path, "drive", [click_beta] * 40 + ["Action: finished()"])
    deadline = time.time() + 40
    while time.time() < deadline:
        if json.loads(target.read_text())["clicks"]["beta"] >= 3:
            break
        assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
        time.sleep(0.05)
    else:
        pytest.fail("the agent never started clicking")
    subprocess.run(["xdotool", "key", "--delay", "0", "ctrl+alt+shift+k"], check=True)
    res = result_of(proc, out)
    assert "kill switch" in res["reason"], res
    clicks = read_state(target, settle=0.5)["clicks"]["beta"]
    assert 3 <= clicks < 40
    assert res["window_visible_after"] is True


def test_supervise_on_screen_edits_a_sandbox_step(xdisplay, tmp_path):
    corner = coords.normalized_to_model((0.03, 0.97), coords.SMART_RESIZE, 320, 240)
    proc, out = run_driver(xdisplay, tmp_path, "supervise",
                           [f"Thought: The corner.\nAction: click(start_box='({corner[0]},{corner[1]})')"], SUPERVISE_SHOT)
    res = result_of(proc, out)
    assert res["kind"] == "supervised" and res["steps"] == 1
    from agent.storage.store import Store

    with Store(tmp_path / "data") as store:
        s0 = store.load_episode(res["episode"]).steps[0]
    assert s0.provenance.source == "corrected"
    got = coords.normalized_to_screen(s0.action.args["start_box"], s0.observation.geometry)
    want = coords.normalized_to_screen(tuple(res["edited"]), s0.observation.geometry)
    assert abs(got[0] - want[0]) <= 1 and abs(got[1] - want[1]) <= 1
    assert Path(SUPERVISE_SHOT).stat().st_size > 10_000
