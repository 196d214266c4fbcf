"""The kill switch on a real X display: the global hotkey (pynput) heard from xdotool input,
the agent stopped within 200 ms, held buttons and keys released."""
from __future__ import annotations

import subprocess
import threading
import time

import pytest

from agent.host.killswitch import DEFAULT_HOTKEY, ControlIndicator, KillSwitch, KillSwitchError
from agent.policies import ReplayPolicy
from agent.run.loop import AgentLoop

pytestmark = pytest.mark.desktop


def press_hotkey():
    subprocess.run(["xdotool", "key", "--delay", "0", "ctrl+alt+shift+k"], check=True)


def x_state():
    """(buttons mask, pressed keycodes) of the X server right now."""
    from Xlib import X, display

    d = display.Display()
    try:
        mask = d.screen().root.query_pointer().mask
        keymap = d.query_keymap()
        pressed = {i * 8 + b for i, byte in enumerate(keymap) for b in range(8) if byte & (1 << b)}
        return mask & (X.Button1Mask | X.Button3Mask), pressed
    finally:
        d.close()


def test_hotkey_triggers(xdisplay):
    hits = []
    with KillSwitch(lambda: hits.append(time.monotonic())) as ks:
        t0 = time.monotonic()
        press_hotkey()
        assert ks.triggered.wait(2)
    assert hits and hits[0] - t0 < 0.2
    assert DEFAULT_HOTKEY == "<ctrl>+<alt>+<shift>+k"


def test_ordinary_typing_does_not_trigger(xdisplay):
    ks = KillSwitch(lambda: None).start()
    try:
        subprocess.run(["xdotool", "key", "--delay", "0", "ctrl+alt+k", "k", "ctrl+k"], check=True)
        assert not ks.triggered.wait(0.3)
    finally:
        ks.stop()


def test_bad_hotkey_is_named(xdisplay):
    with pytest.raises(KillSwitchError, match="<nonsense"):
        KillSwitch(hotkey="<nonsense>+x").start()


def test_hotkey_stops_a_running_loop_and_releases_input(xdisplay, store):
    from agent.executors.desktop import DesktopExecutor

    ex = DesktopExecutor(settle=0, wait_seconds=30)
    indicator = ControlIndicator()
    loop = AgentLoop(ReplayPolicy(["Action: wait()"] * 3), ex, store=store, on_control=indicator.set)
    out = {}
    with KillSwitch(loop):
        th = threading.Thread(target=lambda: out.update(r=loop.run("wait")))
        th.start()
        deadline = time.time() + 5
        while not (loop.episode and indicator.active) and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # inside the 30 s wait now
        pg = ex._pyautogui()
        pg.mouseDown(button="left")  # as if the agent were mid-drag with a modifier held
        pg.keyDown("win")
        mask, keys = x_state()
        assert mask and keys
        t0 = time.monotonic()
        press_hotkey()
        th.join(2)
        elapsed = time.monotonic() - t0
    assert not th.is_alive() and elapsed < 0.2, elapsed
    res = out["r"]
    assert res.reason.startswith("kill switch") and not indicator.active
    time.sleep(0.05)
    mask, keys = x_state()
    assert mask == 0 and not keys  # nothing held any more
    ep = store.load_episode(res.episode.id)
    assert ep.meta["end_reason"].startswith("kill switch") and (not ep.steps or ep.steps[-1].truncated)
    ex.close()
