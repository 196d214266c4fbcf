"""GameEnv: headless Chromium over the DevTools pipe under the fake clock (trainer.sandbox.games).

Real Chromium throughout; skipped where it is not installed."""
from __future__ import annotations

import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from games_helpers import needs_chromium

from agent.schema import Action
from trainer.sandbox.games import registry
from trainer.sandbox.games.browser import (
    chromium_processes,
    key_event,
    tagged_processes,
)
from trainer.sandbox.games.env import NO_ELEMENTS, GameEnv
from trainer.sandbox.games.spec import HEIGHT, WIDTH, key

ROOT = Path(__file__).resolve().parents[1]


def wait_gone(pgid: int, profile: str, seconds: float = 15.0) -> list[int]:
    """The browser's processes still alive after up to `seconds`: its process group's, and any
    carrying its profile in their environment (the crash handler, which leaves the group)."""
    def left():
        return sorted(set(chromium_processes(pgid)) | set(tagged_processes(profile)))

    end = time.monotonic() + seconds
    while left() and time.monotonic() < end:
        time.sleep(0.1)
    return left()


@pytest.fixture
def env():
    e = GameEnv("snake")
    yield e
    e.close()


# ------------------------------------------------------------ without a browser
def test_unknown_game_is_a_clear_error():
    with pytest.raises(registry.GameError, match=r"unknown game 'chess'; known games: .*snake"):
        GameEnv("chess")
    with pytest.raises(registry.GameError, match="known games"):
        registry.parse_games("snake,chess")
    with pytest.raises(registry.GameError, match="more than once"):
        registry.parse_games("snake,snake")
    assert registry.game("games/snake").name == "snake"


def test_registry_skips_absent_games_with_a_reason():
    present, gone = registry.games(), registry.missing()
    assert set(present) | set(gone) == set(registry.GAME_MODULES)
    assert "snake" in present and "merge" in present
    for name, why in gone.items():
        assert why, name


def test_key_events_carry_the_right_key_and_code():
    assert key_event("up") | {} == {"key": "ArrowUp", "code": "ArrowUp", "windowsVirtualKeyCode": 38,
                                    "nativeVirtualKeyCode": 38, "text": "", "unmodifiedText": ""}
    assert (key_event("space")["key"], key_event("space")["code"], key_event("space")["text"]) == (" ", "Space", " ")
    assert (key_event("enter")["key"], key_event("enter")["windowsVirtualKeyCode"]) == ("Enter", 13)
    assert (key_event("a")["key"], key_event("a")["code"], key_event("a")["windowsVirtualKeyCode"]) == ("a", "KeyA", 65)
    assert key_event("a", shift=True)["key"] == "A"
    assert (key_event("7")["code"], key_event("-")["code"]) == ("Digit7", "Minus")
    with pytest.raises(ValueError, match="unknown key 'hyper'"):
        key_event("hyper")


# ------------------------------------------------------------ the environment
@needs_chromium
def test_reset_and_step_shape(env):
    obs, info = env.reset(seed=3, options={"game": "snake"})
    assert obs["screenshot"].shape == (HEIGHT, WIDTH, 3) and obs["screenshot"].dtype == np.uint8
    assert env.observation_space["screenshot"].contains(obs["screenshot"])
    assert info["family"] == "games/snake" and info["game"] == "snake" and info["success"] is False
    assert info["instruction"].startswith("Play Snake") and info["max_steps"] == 100 and info["split"] == "train"
    json.dumps(info["state"])  # JSON-able
    obs, reward, terminated, truncated, info = env.step(key("down"))
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["state"]["dir"] == "down" and info["steps"] == 1
    _, info = env.reset(seed=10 ** 7, options={"family": "games/snake"})
    assert info["split"] == "heldout"


@needs_chromium
def test_elements_say_a_game_has_none():
    env = GameEnv("snake", observation="elements")
    try:
        obs, _ = env.reset(seed=0)
        assert obs["elements"] is None and obs["elements_source"] == NO_ELEMENTS
        obs, *_ = env.step(Action("wait", {}))
        assert obs["elements"] is None and obs["elements_source"] == NO_ELEMENTS
    finally:
        env.close()


@needs_chromium
def test_malformed_and_impossible_actions_are_reported_not_raised(env):
    env.reset(seed=1)
    cases = [("up", "must be an Action"), (Action("click", {"start_box": (1.5, 0.2)}), "outside the screenshot"),
             (Action("hotkey", {"key": "hyper"}), "unknown key"), (Action("hotkey", {"key": "ctrl"}), "modifiers alone"),
             (Action("open_app", {"app_name": "x"}), "not an action a game can take"), (42, "must be an Action")]
    for action, why in cases:
        _, reward, terminated, truncated, info = env.step(action)
        assert why in info.get("action_error", ""), (action, info)
        assert reward == 0.0 and not terminated
    # a step whose action failed still lets the step's time pass: 6 ticks of the snake
    assert env.state["ticks"] == 6


@needs_chromium
def test_the_pages_own_errors_are_reported_and_the_game_goes_on(env):
    env.reset(seed=1)
    env.browser.evaluate("document.addEventListener('keydown', () => { throw new Error('handler broke'); }); "
                         "setTimeout(() => { throw new TypeError('timer broke'); }, 10)")
    _, _, terminated, _, info = env.step(key("down"))
    assert any("handler broke" in e for e in info["page_errors"]), info
    assert any("TypeError: timer broke" in e for e in info["page_errors"]), info
    assert info["state"]["dir"] == "down" and not terminated
    _, _, _, _, info = env.step(Action("wait", {}))
    assert "page_errors" not in info


@needs_chromium
def test_a_broken_get_state_ends_the_episode_with_the_error(env):
    env.reset(seed=1)
    env.browser.evaluate("tandemGame.getState = () => { throw new Error('no state today'); }")
    _, _, terminated, truncated, info = env.step(key("up"))
    assert "no state today" in info["error"] and truncated and not terminated
    _, info = env.reset(seed=1)  # a fresh browser
    assert info["state"]["score"] == 0


@needs_chromium
def test_finished_ends_the_episode(env):
    env.reset(seed=1)
    _, _, terminated, truncated, info = env.step(Action("finished", {}))
    assert terminated and not truncated
    _, _, _, _, info = env.step(key("up"))
    assert "episode is over" in info["error"]


@needs_chromium
def test_keydown_handlers_see_key_and_code(env):
    env.reset(seed=1)
    env.browser.evaluate("window.__keys = []; document.addEventListener('keydown', "
                         "e => __keys.push([e.key, e.code, e.keyCode, e.shiftKey, e.ctrlKey]))")
    for k in ("up", "down", "left", "right", "space", "enter", "a", "shift a", "ctrl z"):
        env.step(key(k))
    env.step(Action("type", {"content": "Hi\n"}))
    got = env.browser.evaluate("__keys")
    assert got == [["ArrowUp", "ArrowUp", 38, False, False], ["ArrowDown", "ArrowDown", 40, False, False],
                   ["ArrowLeft", "ArrowLeft", 37, False, False], ["ArrowRight", "ArrowRight", 39, False, False],
                   [" ", "Space", 32, False, False], ["Enter", "Enter", 13, False, False],
                   ["a", "KeyA", 65, False, False], ["Shift", "ShiftLeft", 16, True, False],
                   ["A", "KeyA", 65, True, False], ["Control", "ControlLeft", 17, False, True],
                   ["z", "KeyZ", 90, False, True],
                   ["H", "KeyH", 72, True, False],  # typed text: a capital carries shift, no Shift key of its own
                   ["i", "KeyI", 73, False, False], ["Enter", "Enter", 13, False, False]]


@needs_chromium
def test_mouse_events_land_where_the_action_points(env):
    env.reset(seed=1)
    env.browser.evaluate("window.__mouse = []; for (const t of ['mousedown', 'mouseup', 'click', 'dblclick', "
                         "'contextmenu', 'wheel']) document.addEventListener(t, e => __mouse.push([t, e.clientX, "
                         "e.clientY, e.button]))")
    env.step(Action("click", {"start_box": (0.5, 0.25)}))
    env.step(Action("right_single", {"start_box": (0.25, 0.5)}))
    env.step(Action("scroll", {"start_box": (0.5, 0.5), "direction": "down"}))
    got = env.browser.evaluate("__mouse")
    assert got[:3] == [["mousedown", 168, 63, 0], ["mouseup", 168, 63, 0], ["click", 168, 63, 0]]
    assert ["contextmenu", 84, 126, 2] in got and ["wheel", 168, 126, 0] in got


# ------------------------------------------------------------ the fake clock
@needs_chromium
def test_the_clock_runs_timers_and_frames_in_order_only_when_told(env):
    env.reset(seed=1)
    b = env.browser
    b.evaluate("""(() => {
        window.__log = []; const t0 = performance.now(), d0 = Date.now();
        setTimeout(() => __log.push(['t50', performance.now() - t0]), 50);
        const iv = setInterval(() => { __log.push(['iv', performance.now() - t0]); }, 40);
        setTimeout(() => clearInterval(iv), 130);
        const c = setTimeout(() => __log.push(['never']), 60); clearTimeout(c);
        requestAnimationFrame(ts => __log.push(['raf', Math.round(ts * 1000) / 1000]));
        window.__d0 = d0; window.__t0 = t0;
    })()""")
    assert b.evaluate("__log") == []  # nothing until the clock moves
    time.sleep(0.3)
    assert b.evaluate("__log") == [] and b.evaluate("performance.now() - __t0") == 0
    b.evaluate("__tandemClock.advance(200)")
    log = b.evaluate("__log")
    assert [e[0] for e in log] == ["raf", "iv", "t50", "iv", "iv"]
    assert [e[1] for e in log[1:]] == pytest.approx([40, 50, 80, 120])
    assert b.evaluate("Date.now() - __d0") == 200 and b.evaluate("new Date().getTime() - __d0") == 200
    assert b.evaluate("typeof Date()") == "string" and b.evaluate("new Date(0).getTime()") == 0
    assert b.evaluate("new Date() instanceof Date")
    # animation frames come at a fixed 1000/60 ms cadence
    frames = b.evaluate("""(() => { const ts = []; const f = t => { ts.push(t); if (ts.length < 5) requestAnimationFrame(f); };
        requestAnimationFrame(f); __tandemClock.advance(100); return ts; })()""")
    assert len(frames) == 5 and all(abs((b_ - a) - 1000 / 60) < 1e-6 for a, b_ in zip(frames, frames[1:], strict=False))


@needs_chromium
def test_web_animations_follow_the_virtual_clock(env):
    env.reset(seed=1)
    b = env.browser
    b.evaluate("""(() => { const d = document.createElement('div'); document.body.appendChild(d);
        window.__anim = d.animate([{opacity: 0}, {opacity: 1}], {duration: 1000}); })()""")
    b.evaluate("__tandemClock.advance(0)")
    start = b.evaluate("__anim.currentTime")
    time.sleep(0.3)
    b.evaluate("__tandemClock.advance(0)")
    assert b.evaluate("__anim.currentTime") == start  # wall time does not move it
    b.evaluate("__tandemClock.advance(250)")
    assert b.evaluate("__anim.currentTime") == pytest.approx(start + 250)
    # a CSS animation too: paused, and moved by the clock alone
    b.evaluate("""(() => { const st = document.createElement('style');
        st.textContent = '@keyframes spin { from { opacity: 0 } to { opacity: 1 } } .spin { animation: spin 2s linear; }';
        document.head.appendChild(st); const d = document.createElement('div'); d.className = 'spin';
        document.body.appendChild(d); window.__css = d; })()""")
    b.evaluate("__tandemClock.advance(0)")
    assert b.evaluate("__css.getAnimations().length") == 1
    first = b.evaluate("__css.getAnimations()[0].currentTime")
    time.sleep(0.3)
    assert b.evaluate("__css.getAnimations()[0].currentTime") == first
    b.evaluate("__tandemClock.advance(500)")
    assert b.evaluate("__css.getAnimations()[0].currentTime") == pytest.approx(first + 500)


def _play(env, seed, actions):
    obs, _ = env.reset(seed=seed, options={"game": "snake"})
    shots, states = [obs["screenshot"]], []
    for a in actions:
        obs, _, term, trunc, info = env.step(a)
        shots.append(obs["screenshot"])
        states.append(info["state"])
        if term or trunc:
            break
    return shots, states


@needs_chromium
def test_same_seed_and_actions_give_identical_screenshots(env):
    actions = [Action("wait", {})] * 3 + [key("down"), key("left")] + [Action("wait", {})] * 4 + [key("up")] * 3
    first = _play(env, 7, actions)
    other = GameEnv("snake")  # another browser too
    try:
        again, second = _play(env, 7, actions), _play(other, 7, actions)
    finally:
        other.close()
    for run in (again, second):
        assert len(run[0]) == len(first[0])
        assert all(np.array_equal(a, b) for a, b in zip(first[0], run[0], strict=True))
        assert run[1] == first[1]
    # and the game does move by itself: waiting changes the screen
    assert not np.array_equal(first[0][0], first[0][1])


@needs_chromium
def test_a_game_left_alone_does_not_advance(env):
    obs, info = env.reset(seed=2)
    obs, *_, info = env.step(Action("wait", {}))
    shot, state = obs["screenshot"], info["state"]
    time.sleep(10)  # ten seconds of wall time: fifty of the snake's ticks, had its clock been real
    assert np.array_equal(env.browser.screenshot(WIDTH, HEIGHT), shot)
    assert env.browser.evaluate("tandemGame.getState()") == state
    obs, *_, info = env.step(Action("wait", {}))
    assert info["state"]["ticks"] == state["ticks"] + 1


@needs_chromium
def test_realtime_mode_lets_a_step_last_its_game_time():
    env = GameEnv("snake", realtime=True)
    try:
        env.reset(seed=2)
        t0 = time.monotonic()
        for _ in range(3):
            _, _, _, _, info = env.step(Action("wait", {}))
        assert time.monotonic() - t0 >= 0.6 - 0.05  # three steps of 200 ms
        assert 2 <= info["state"]["ticks"] <= 4
    finally:
        env.close()


# ------------------------------------------------------------ no Chromium outlives a run
@needs_chromium
def test_close_reaps_chromium():
    env = GameEnv("snake")
    env.reset(seed=0)
    pgid, profile = env.browser.pgid, env.browser.profile
    assert len(chromium_processes(pgid)) >= 2  # the watchdog and Chromium's processes
    assert tagged_processes(profile)
    env.close()
    assert wait_gone(pgid, profile) == [] and not os.path.exists(profile)
    env.close()  # idempotent


@needs_chromium
def test_garbage_collection_reaps_chromium():
    env = GameEnv("snake")
    env.reset(seed=0)
    pgid, profile = env.browser.pgid, env.browser.profile
    del env
    gc.collect()
    assert wait_gone(pgid, profile) == []


@needs_chromium
def test_two_browsers_in_one_process():
    a, b = GameEnv("snake"), GameEnv("snake")
    try:
        oa, _ = a.reset(seed=1)
        ob, _ = b.reset(seed=2)
        assert a.browser.pgid != b.browser.pgid
        a.step(key("down"))
        _, _, _, _, ib = b.step(key("up"))
        assert a.state["dir"] == "down" and ib["state"]["dir"] == "up"
    finally:
        a.close()
        b.close()


@needs_chromium
def test_a_process_killed_mid_episode_leaves_no_chromium():
    script = textwrap.dedent("""
        import sys
        from trainer.sandbox.games.env import GameEnv
        from trainer.sandbox.games.spec import key
        env = GameEnv("snake")
        env.reset(seed=4)
        print(env.browser.pgid, env.browser.profile, flush=True)
        while True:
            for k in ("up", "left", "down", "right"):
                _, _, term, trunc, _ = env.step(key(k))
                if term or trunc:
                    env.reset(seed=5)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        pgid, profile = proc.stdout.readline().split()
        pgid = int(pgid)
        time.sleep(1.0)  # mid-episode
        assert len(chromium_processes(pgid)) >= 2 and tagged_processes(profile)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert wait_gone(pgid, profile) == []


@needs_chromium
def test_a_hung_page_is_killed_and_named():
    env = GameEnv("snake", call_timeout=2.0)
    try:
        env.reset(seed=0)
        pgid, profile = env.browser.pgid, env.browser.profile
        env.browser.evaluate("window.tandemGame.getState = () => { for (;;) {} }")
        t0 = time.monotonic()
        _, _, terminated, truncated, info = env.step(key("up"))
        assert time.monotonic() - t0 < 10
        assert "a step of games/snake did not answer within 2 s; Chromium was killed" in info["error"]
        assert truncated and not terminated
        assert wait_gone(pgid, profile) == []
        _, info = env.reset(seed=0)  # a fresh browser
        assert info["state"]["score"] == 0
    finally:
        env.close()


# ------------------------------------------------------------ normalized scores and the eval command
def _traj(game: str, seed: int, rewards: list[float]):
    from trainer.rollout.runner import Trajectory, Turn

    return Trajectory(seed=seed, family=f"games/{game}", instruction="",
                      turns=[Turn(None, [], [], "", reward=r) for r in rewards])


def test_summarize_normalizes_against_the_reference_mean():
    from trainer.rollout.games_eval import summarize

    trajs = [_traj("snake", 1, [1, 1, 0, 1]), _traj("snake", 2, [1, 0]), _traj("snake", 3, [0, 0, 0]),
             _traj("merge", 1, [400, 400]), _traj("merge", 2, [1000])]
    out = summarize(trajs, ["snake", "merge"], norms={"snake": {"reference": 2.0}, "merge": {"reference": 800.0}})
    snake, merge = out["games"]["snake"], out["games"]["merge"]
    assert snake["episodes"] == 3 and snake["score"] == pytest.approx(4 / 3)
    assert snake["normalized"] == pytest.approx(100 * (4 / 3) / 2)
    lo, hi = snake["ci95"]
    assert lo < snake["normalized"] < hi and hi - lo == pytest.approx(2 * 4.303 * statistics.stdev([150, 50, 0]) / 3 ** 0.5)  # t, 2 df
    assert merge["normalized"] == pytest.approx(112.5)
    assert out["overall"] == pytest.approx((snake["normalized"] + merge["normalized"]) / 2)
    assert out["ci95"][0] < out["overall"] < out["ci95"][1] and out["unnormed"] == []
    out = summarize(trajs, ["snake", "merge"], norms={"snake": {"reference": 2.0}})
    assert out["unnormed"] == ["merge"] and out["games"]["merge"]["normalized"] is None
    assert out["overall"] == pytest.approx(snake["normalized"])


def test_t_quantiles():
    from trainer.stats import mean_interval, t975

    assert t975(1) == 12.706 and t975(30) == 2.042 and t975(40) == pytest.approx(2.021, abs=1e-3)
    assert t975(120) == pytest.approx(1.980, abs=1e-3)
    assert mean_interval([5.0])["ci95"] == [5.0, 5.0]


def test_suite_games_flags():
    import argparse

    from trainer.rollout.sandbox_cli import _suite_problem

    base = dict(suite="games", policy="reference", games=None, families=None, tasks=None, grounding=False, trace=False,
                episode_seconds=None, width=None, height=None, workers=1, split="heldout", inference_dtype="fp32")
    assert _suite_problem(argparse.Namespace(**base)) is None
    assert "--policy reference" in _suite_problem(argparse.Namespace(**{**base, "policy": "expert"}))
    assert "--families is not for --suite games" in _suite_problem(argparse.Namespace(**{**base, "families": "x"}))
    assert "are for --suite games" in _suite_problem(argparse.Namespace(**{**base, "suite": "sandbox"}))


@needs_chromium
def test_calibrate_changes_only_the_games_it_is_given(tmp_path, monkeypatch):
    from trainer.rollout import games_eval

    norms = tmp_path / "norms.json"
    norms.write_text(json.dumps({"games": {"blocks": {"reference": 7.0, "random": 1.0}}}))
    monkeypatch.setattr(registry, "NORMS", norms)
    found = games_eval.calibrate(["snake"], 1)
    data = json.loads(norms.read_text())
    assert data["games"]["blocks"] == {"reference": 7.0, "random": 1.0}
    assert data["games"]["snake"]["reference"] == found["snake"]["reference"] > 0
    assert data["games"]["snake"]["episodes"] == 1 and data["games"]["snake"]["split"] == "train"


@needs_chromium
def test_eval_command_reference_json():
    out = subprocess.run([sys.executable, "main.py", "sandbox", "eval", "--suite", "games", "--games", "snake",
                          "--policy", "reference", "--episodes", "2", "--json"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    snake = res["games"]["snake"]
    assert res["suite"] == "games" and res["split"] == "heldout" and snake["episodes"] == 2
    assert snake["normalized"] is not None and snake["ci95"][0] <= snake["normalized"] <= snake["ci95"][1]
    assert res["overall"] == snake["normalized"]
    bad = subprocess.run([sys.executable, "main.py", "sandbox", "eval", "--suite", "games", "--games", "chess",
                          "--policy", "random", "--episodes", "1"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode != 0 and "unknown game 'chess'; known games:" in bad.stderr
