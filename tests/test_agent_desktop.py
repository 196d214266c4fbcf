"""End to end on a real X display: a real Qt window (a subprocess on xcb), the desktop executor
(mss + pyautogui/xdotool), the loop, the gate and the store. Only the model is scripted: UI-TARS-1.5
responses whose smart-resize coordinates are computed for the screenshot size. The window's own
state file proves what was clicked and typed. Two screen sizes: the session's 1920x1080 display
in this process, and a 1280x800 display of our own driven through the CLI in a subprocess
(pyautogui binds to one display per process)."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import coords
from agent.policies import ReplayPolicy
from agent.run.gate import Decision, Gate, terminal_window
from agent.run.loop import AgentLoop, LoopConfig
from agent.schema import Action
from tests.conftest import ROOT, _free_display

pytestmark = pytest.mark.desktop
TARGET = Path(__file__).with_name("desktop_target.py")


def start_target(display: str, state: Path, timeout=15):
    env = {**os.environ, "QT_QPA_PLATFORM": "xcb", "DISPLAY": display}
    proc = subprocess.Popen([sys.executable, str(TARGET), str(state)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the target window exited: {proc.stderr.read().decode()[-2000:]}")
        if state.exists() and json.loads(state.read_text()).get("ready"):
            return proc
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the target window did not come up")


def read_state(state: Path, settle=0.3) -> dict:
    time.sleep(settle)  # let Qt process the last events and write
    return json.loads(state.read_text())


def model_point(state: dict, name: str, width: int, height: int) -> tuple[int, int]:
    """The widget's centre in UI-TARS-1.5 space (pixels of the smart-resized screenshot)."""
    x, y, w, h = state["widgets"][name]
    rh, rw = coords.smart_resize(height, width)
    return round((x + w / 2) / width * rw), round((y + h / 2) / height * rh)


def responses_for(state: dict, width: int, height: int) -> list[str]:
    f = model_point(state, "field", width, height)
    a = model_point(state, "alpha", width, height)
    b = model_point(state, "beta", width, height)
    return [
        f"Thought: I need the text field first.\nAction: click(start_box='<|box_start|>({f[0]},{f[1]})<|box_end|>')",
        "Thought: Type the greeting and submit it.\nAction: type(content='héllo wörld\\n')",
        f"Thought: Now press Alpha.\nAction: click(start_box='({a[0]},{a[1]})')",
        f"Thought: And Beta.\nAction: click(start_box='({b[0]},{b[1]})')",
        "Thought: All done.\nAction: finished(content='done')",
    ]


@pytest.fixture
def target(xdisplay, tmp_path):
    state = tmp_path / "state.json"
    proc = start_target(xdisplay, state)
    yield state
    proc.terminate()
    proc.wait(5)


@pytest.fixture(scope="module")
def desktop(xdisplay):
    from agent.executors.desktop import DesktopExecutor

    ex = DesktopExecutor(settle=0.1, wait_seconds=0.05)
    yield ex
    ex.close()


def test_replay_clicks_and_types_at_1920x1080(target, desktop, store):
    st = json.loads(target.read_text())
    assert st["screen"] == [1920, 1080]
    policy = ReplayPolicy(responses_for(st, 1920, 1080))
    res = AgentLoop(policy, desktop, store=store, config=LoopConfig(max_steps=10)).run("Greet, then press Alpha and Beta")
    assert res.reason == "finished"
    after = read_state(target)
    assert after["text"] == "héllo wörld" and after["submitted"] == ["héllo wörld"]
    assert after["clicks"] == {"alpha": 1, "beta": 1}
    ep = store.load_episode(res.episode.id)
    assert [s.action.name for s in ep.steps] == ["click", "type", "click", "click", "finished"]
    x, y, w, h = st["widgets"]["alpha"]
    sx, sy = ep.steps[2].info["screen_point"]
    assert abs(sx - (x + w / 2)) <= 2 and abs(sy - (y + h / 2)) <= 2  # the right pixels, not just the right widget
    assert ep.steps[0].observation.width == 1920 and ep.steps[0].observation.geometry.logical_height == 1080
    assert store.get_blob(ep.steps[0].observation.screenshot)[:3] == b"\xff\xd8\xff"


class EditFirstClick:
    """A supervisor that moves the first proposed click onto Beta and approves the rest."""

    def __init__(self, beta_norm):
        self.beta_norm = beta_norm
        self.asked = 0

    def decide(self, request):
        self.asked += 1
        if self.asked == 1:
            return Decision.edit([Action("click", {"start_box": self.beta_norm})], thought="Beta is the right one.", by="tester")
        return Decision.approve(by="tester")

    def take_over(self, request):
        raise AssertionError("not used")


def test_gate_edit_moves_the_click(target, desktop, store):
    st = json.loads(target.read_text())
    a = model_point(st, "alpha", 1920, 1080)
    x, y, w, h = st["widgets"]["beta"]
    sup = EditFirstClick(((x + w / 2) / 1920, (y + h / 2) / 1080))
    policy = ReplayPolicy([f"Thought: Press Alpha.\nAction: click(start_box='({a[0]},{a[1]})')", "Action: finished()"])
    res = AgentLoop(policy, desktop, store=store, gate=Gate("all", sup)).run("Press the right button")
    after = read_state(target)
    assert after["clicks"] == {"alpha": 0, "beta": 1}
    ep = store.load_episode(res.episode.id)
    s0 = ep.steps[0]
    assert ep.kind == "supervised" and s0.provenance.source == "corrected"
    assert s0.thought == "Beta is the right one." and s0.provenance.proposal_thought == "Press Alpha."
    ax, ay, aw, ah = st["widgets"]["alpha"]
    px, py = coords.normalized_to_screen(s0.provenance.proposal_action.args["start_box"], s0.observation.geometry)
    assert abs(px - (ax + aw / 2)) <= 2 and abs(py - (ay + ah / 2)) <= 2  # the proposal is kept where it pointed
    assert ep.steps[1].provenance.decision == "approve"


def test_cli_replay_on_a_1280x800_screen(tmp_path):
    n = _free_display()
    display = f":{n}"
    xvfb = subprocess.Popen(["Xvfb", display, "-screen", "0", "1280x800x24", "-nolisten", "tcp", "-ac"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 10
        while not Path(f"/tmp/.X11-unix/X{n}").exists():
            assert xvfb.poll() is None and time.time() < deadline, "second Xvfb did not start"
            time.sleep(0.05)
        state = tmp_path / "state.json"
        target = start_target(display, state)
        try:
            st = json.loads(state.read_text())
            assert st["screen"] == [1280, 800]
            responses = tmp_path / "r.jsonl"
            responses.write_text("\n".join(json.dumps(r) for r in responses_for(st, 1280, 800)) + "\n")
            data = tmp_path / "data"
            env = {**os.environ, "DISPLAY": display, "XDG_SESSION_TYPE": "x11"}
            out = subprocess.run(
                [sys.executable, "main.py", "agent", "--data", str(data), "--instruction", "Greet, then Alpha and Beta",
                 "--policy", "replay", "--responses", str(responses), "--gate", "auto", "--max-steps", "10"],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
            )
            assert out.returncode == 0, out.stdout + out.stderr
            after = read_state(state)
            assert after["text"] == "héllo wörld" and after["clicks"] == {"alpha": 1, "beta": 1}
            assert "kill switch: <ctrl>+<alt>+<shift>+k" in out.stdout and "ended: finished" in out.stdout
        finally:
            target.terminate()
            target.wait(5)
        from agent.storage.store import Store

        with Store(data) as s:
            (ep,) = s.list_episodes()
            ep = s.load_episode(ep.id)
        assert ep.kind == "autonomous" and len(ep.steps) == 5
        assert ep.steps[0].observation.width == 1280 and ep.steps[0].observation.height == 800
    finally:
        xvfb.terminate()
        xvfb.wait(5)


def test_executor_types_many_non_ascii_characters_and_hotkeys(target, desktop):
    st = json.loads(target.read_text())
    x, y, w, h = st["widgets"]["field"]
    frame = desktop.observe()
    centre = ((x + w / 2) / 1920, (y + h / 2) / 1080)
    desktop.step(Action("click", {"start_box": centre}))
    text = "Grüße " + "".join(chr(0x4E00 + i) for i in range(45)) + " ok"  # more distinct characters than spare keycodes
    desktop.step(Action("type", {"content": text}))
    assert read_state(target)["text"] == text
    desktop.step(Action("hotkey", {"key": "ctrl a"}))
    desktop.step(Action("hotkey", {"key": "backspace"}))
    desktop.step(Action("type", {"content": "line one\n"}))
    after = read_state(target)
    assert after["text"] == "line one" and after["submitted"] == ["line one"]
    assert frame.geometry.physical_width == 1920 and frame.geometry.scale_factor == 1.0


def test_hotkey_names_map_to_pyautogui():
    from agent.executors.desktop import hotkey_keys

    assert hotkey_keys("ctrl shift t") == ["ctrl", "shift", "t"]
    assert hotkey_keys("Control+Return") == ["ctrl", "enter"]
    assert hotkey_keys("escape") == ["esc"] and hotkey_keys("super") == ["win"]
    # the chord the gate judged (agent.actions.canonical_keys) is the chord pressed: once, left/right as one
    assert hotkey_keys("ctrl w w") == ["ctrl", "w"] and hotkey_keys("ctrl_l+Shift_R+W") == ["ctrl", "shift", "w"]
    assert hotkey_keys("w lctrl") == ["ctrl", "w"] and hotkey_keys("+") == ["+"] and hotkey_keys("ctrl plus") == ["ctrl", "+"]


def test_where_the_focus_cannot_be_read_the_frame_says_why_and_enter_is_asked_about(monkeypatch):
    """Without an X display (as on Windows and macOS) the focused window is unknown: focus_now
    drops the stale facts, says why, and the gate asks before a line is submitted."""
    from agent.executors.base import Frame
    from agent.executors.desktop import DesktopExecutor
    from agent.schema import ScreenGeometry

    monkeypatch.delenv("DISPLAY", raising=False)
    ex = DesktopExecutor(password_fields=False)
    stale = Frame(geometry=ScreenGeometry.simple(640, 480), text="", extra={"focused_window": {"title": "Notes", "app": "gedit"}})
    now = ex.focus_now(stale)
    assert now.extra == {"focus_unknown": "no X display (DISPLAY is not set)"} and "focused_window" in stale.extra
    gate = Gate("risky", RejectAll())
    assert "focused window is unknown" in gate.risk(Action("type", {"content": "make\n"}), now)
    assert gate.risk(Action("type", {"content": "make"}), now) is None
    ex.close()


def test_cli_publish_lets_a_remote_supervisor_edit_the_click(target, xdisplay, tmp_path):
    """`agent --publish`: the headless agent's gate is answered through a real backend on
    loopback; the supervisor moves the click from Alpha to Beta and the window shows it."""
    import queue

    from agent.protocol import ProposalReceived
    from agent.storage.store import Store
    from agent.sync.live_link import RunWatcher
    from trainer.backend.server_thread import start_in_thread

    b = start_in_thread(tmp_path / "backend")
    robot, alice = b.store.add_user("robot", "annotator"), b.store.add_user("alice", "supervisor")
    st = read_state(target, settle=0)
    width, height = st["screen"]
    a = model_point(st, "alpha", width, height)
    responses = tmp_path / "r.jsonl"
    responses.write_text(json.dumps(f"Thought: Press Alpha.\nAction: click(start_box='({a[0]},{a[1]})')") + "\n"
                         + json.dumps("Thought: Done.\nAction: finished(content='ok')") + "\n")
    data = tmp_path / "data"
    env = {**os.environ, "DISPLAY": xdisplay, "XDG_SESSION_TYPE": "x11"}
    proc = subprocess.Popen(
        [sys.executable, "main.py", "agent", "--data", str(data), "--instruction", "Press Beta", "--policy", "replay",
         "--responses", str(responses), "--gate", "all", "--no-kill-switch", "--publish", "--server", b.url,
         "--token", robot, "--run-id", "cli-run", "--decision-timeout", "60"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    events: queue.Queue = queue.Queue()
    watcher = RunWatcher(b.url, alice, "cli-run", on_event=events.put).start()
    try:
        watcher.claim()
        bx, by, bw, bh = st["widgets"]["beta"]
        beta = ((bx + bw / 2) / width, (by + bh / 2) / height)
        seen = []
        while len(seen) < 2:
            ev = events.get(timeout=60)
            if not isinstance(ev, ProposalReceived):
                continue
            seen.append(ev.step["actions"][0]["name"])
            if len(seen) == 1:
                watcher.decide(ev.proposal_id, Decision.edit([Action("click", {"start_box": beta})]))
            else:
                watcher.decide(ev.proposal_id, Decision.approve())
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        watcher.close()
        b.stop()
    assert proc.returncode == 0, out + err
    assert seen == ["click", "finished"]
    assert "run id: cli-run" in out and "ended: finished" in out
    assert read_state(target)["clicks"] == {"alpha": 0, "beta": 1}
    with Store(data) as s:
        (ep,) = s.list_episodes()
        ep = s.load_episode(ep.id)
    assert ep.kind == "supervised"
    s0 = ep.steps[0]
    assert s0.provenance.source == "corrected" and s0.provenance.decided_by == "alice"
    assert s0.provenance.proposal_action.name == "click"


class RejectAll:
    """A supervisor that says no to every step it is asked about, and remembers what and why."""

    def __init__(self):
        self.why, self.asked = [], []

    def decide(self, request):
        self.why.append(request.why)
        self.asked.append(request)
        return Decision.reject("not in a terminal", by="tester")

    def take_over(self, request):
        raise AssertionError("not used")


@contextlib.contextmanager
def xterm(display, cwd, title, *args, geometry="200x60+0+0"):
    """A real xterm running bash in `cwd`, its window titled `title` (more xterm arguments in
    `args`: -class, -name); yields its window id."""
    if not shutil.which("xterm"):
        pytest.fail("xterm is not installed: run `bash packaging/install.sh --test` first")

    def start():
        return subprocess.Popen(["xterm", "-geometry", geometry, *args, "-title", title, "-e", "bash", "--norc",
                                 "--noprofile"], cwd=cwd, env={**os.environ, "DISPLAY": display})

    term, restarts = start(), 0
    try:
        deadline = time.time() + 15
        while time.time() < deadline:  # wait for the window
            found = subprocess.run(["xdotool", "search", "--name", f"^{re.escape(title)}$"], capture_output=True,
                                   text=True).stdout.split()
            if found:
                break
            if term.poll() is not None and restarts < 2:  # seen once: a first xterm that could not open the display
                term, restarts = start(), restarts + 1
            time.sleep(0.1)
        assert found, "the xterm window did not come up"
        yield int(found[0])
    finally:
        term.terminate()
        term.wait(5)


def victim_folder(tmp_path) -> Path:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    return victim


RM_REPLY = "Thought: Clean up.\nAction: type(content='rm -rf victim\\n')"


def test_risky_gate_asks_before_typing_into_a_terminal(xdisplay, desktop, store, tmp_path):
    """A replayed reply types `rm -rf victim` + Enter; the focused window is a real xterm. The
    default gate ('risky') asks first, the supervisor says no, and the folder is still there."""
    victim = victim_folder(tmp_path)
    with xterm(xdisplay, tmp_path, "shell"):
        subprocess.run(["xdotool", "mousemove", "400", "300"], check=True)  # focus follows the pointer
        time.sleep(0.5)
        frame = desktop.observe()
        assert "xterm" in (frame.extra.get("focused_window", {}).get("app") or "").lower()
        sup = RejectAll()
        policy = ReplayPolicy([RM_REPLY, "Action: finished()"])
        AgentLoop(policy, desktop, store=store, gate=Gate("risky", sup), config=LoopConfig(max_steps=3)).run("Tidy up")
        time.sleep(1.0)
        assert sup.why and "terminal" in sup.why[0]
        assert (victim / "keep.txt").read_text() == "precious"


@pytest.mark.parametrize("wm_class", ["org.gnome.Console", "Scratchpad"])
def test_a_terminal_is_known_by_the_shell_under_it_whatever_it_is_called(xdisplay, desktop, store, tmp_path, wm_class):
    """Issue 38: a terminal whose class and title name no terminal (GNOME Console's, or one on no
    list at all) let `rm -rf` through. Its process has bash under it: the gate asks."""
    victim = victim_folder(tmp_path)
    with xterm(xdisplay, tmp_path, "user@host: ~", "-name", wm_class.lower(), "-class", wm_class):
        subprocess.run(["xdotool", "mousemove", "400", "300"], check=True)
        time.sleep(0.5)
        fw = desktop.observe().extra["focused_window"]
        assert (fw["app"], fw["title"]) == (wm_class, "user@host: ~")
        sup = RejectAll()
        policy = ReplayPolicy([RM_REPLY, "Action: finished()"])
        AgentLoop(policy, desktop, store=store, gate=Gate("risky", sup), config=LoopConfig(max_steps=3)).run("Tidy up")
        time.sleep(1.0)
        assert (victim / "keep.txt").read_text() == "precious"
        assert len(sup.why) == 1 and sup.why[0].startswith("typing into a terminal window (")
        # the xterm's own process tree, read from /proc before each action: what tells it apart when no name does
        assert desktop.focus_now(desktop.observe()).extra["focused_window"]["terminal"] == "bash runs under it"
        if wm_class == "Scratchpad":
            assert sup.why[0].startswith("typing into a terminal window (Scratchpad: bash runs under it)")


def test_click_then_type_in_one_reply_is_asked_about_before_the_type(xdisplay, desktop, store, tmp_path):
    """Issue 38: one reply `click(<the terminal>)` then `type('rm -rf ...\\n')`, made while no
    terminal had focus. The gate reads the focus again after the click and asks before the type."""
    victim = victim_folder(tmp_path)
    with xterm(xdisplay, tmp_path, "shell", geometry="80x24+0+0") as window:
        subprocess.run(["xdotool", "mousemove", "1500", "900"], check=True)  # off the terminal: it has no focus
        time.sleep(0.5)
        assert terminal_window(desktop.observe()) is None
        geo = dict(line.split("=") for line in subprocess.run(
            ["xdotool", "getwindowgeometry", "--shell", str(window)], capture_output=True, text=True, check=True
        ).stdout.split())
        cx, cy = int(geo["X"]) + int(geo["WIDTH"]) // 2, int(geo["Y"]) + int(geo["HEIGHT"]) // 2
        rh, rw = coords.smart_resize(1080, 1920)
        mx, my = round(cx / 1920 * rw), round(cy / 1080 * rh)
        reply = (f"Thought: Open the terminal and clean up.\nAction: click(start_box='({mx},{my})')\n\n"
                 "type(content='rm -rf victim\\n')")
        sup = RejectAll()
        res = AgentLoop(ReplayPolicy([reply, "Action: finished()"]), desktop, store=store, gate=Gate("risky", sup),
                        config=LoopConfig(max_steps=4)).run("Tidy up")
        time.sleep(1.0)
        assert (victim / "keep.txt").read_text() == "precious"
        assert len(sup.asked) == 1 and sup.why[0] == "typing into a terminal window (XTerm): the text may run as a command"
        assert [a.name for a in sup.asked[0].proposal.actions] == ["type"]  # the rest of the reply, after the click
        assert sup.asked[0].observation.extra["focused_window"]["terminal"] == "bash runs under it"
        ep = store.load_episode(res.episode.id)
        assert [s.action.name for s in ep.steps] == ["click", "finished"]
        assert ep.steps[1].info["rejections"][0]["actions"][0]["args"]["content"] == "rm -rf victim\n"
