"""Reduction of raw input events to actions and steps, on hand-made event lists."""
from __future__ import annotations

import pytest

from agent.actions import validate
from agent.recorder.reduce import (
    MASK_CHAR,
    REDUCER_VERSION,
    SECRET_PLACEHOLDER,
    Thresholds,
    attach_texts,
    build_steps,
    reduce_actions,
)
from agent.schema import ScreenGeometry


class Ev:
    """A little builder of raw events on a running clock."""

    def __init__(self, t=100.0):
        self.t = t
        self.events: list[dict] = []

    def at(self, dt):
        self.t += dt
        return self

    def add(self, kind, **kw):
        self.events.append({"t": round(self.t, 6), "kind": kind, **kw})
        self.t += 0.01
        return self

    def click(self, x, y, button="left", to=None, hold=0.05):
        self.add("mouse_down", x=x, y=y, button=button)
        self.t += hold
        tx, ty = to or (x, y)
        return self.add("mouse_up", x=tx, y=ty, button=button)

    def key(self, k, secret=False):
        kw = {"secret": True} if secret else {}
        self.add("key_down", key=k, **kw)
        return self.add("key_up", key=k, **kw)

    def type(self, text):
        for c in text:
            self.key(c)
            self.t += 0.05
        return self

    def chord(self, *keys):
        for k in keys:
            self.add("key_down", key=k)
        for k in reversed(keys):
            self.add("key_up", key=k)
        return self

    def scroll(self, x, y, dy=0, dx=0):
        return self.add("scroll", x=x, y=y, dx=dx, dy=dy)


def names(actions):
    return [(a.name, a.args) for a in actions]


def test_click_double_right_and_drag():
    e = Ev().click(10, 20).at(1).click(300, 300).at(0.1).click(301, 300).at(1).click(50, 60, "right")
    e.at(1).click(100, 100, to=(400, 120))
    assert names(reduce_actions(e.events)) == [
        ("click", {"start_box": (10, 20)}),
        ("left_double", {"start_box": (300, 300)}),
        ("right_single", {"start_box": (50, 60)}),
        ("drag", {"start_box": (100, 100), "end_box": (400, 120)}),
    ]


def test_double_click_thresholds():
    th = Thresholds(double_click_s=0.3, double_click_px=4)
    slow = Ev().click(300, 300).at(0.5).click(300, 300)
    far = Ev().click(300, 300).at(0.05).click(310, 300)
    triple = Ev().click(5, 5).at(0.05).click(5, 5).at(0.05).click(5, 5)
    assert [a.name for a in reduce_actions(slow.events, th)] == ["click", "click"]
    assert [a.name for a in reduce_actions(far.events, th)] == ["click", "click"]
    assert [a.name for a in reduce_actions(triple.events, th)] == ["left_double", "click"]


def test_small_movement_is_a_click_not_a_drag():
    e = Ev().click(100, 100, to=(103, 104))
    assert names(reduce_actions(e.events)) == [("click", {"start_box": (100, 100)})]
    assert reduce_actions(e.events, Thresholds(drag_min_px=2))[0].name == "drag"


def test_typing_with_backspaces_and_enter():
    e = Ev().type("helxp").key("backspace").key("backspace").type("lo").key("shift").key("enter").type("next")
    acts = reduce_actions(e.events)
    assert names(acts) == [("type", {"content": "hello\n"}), ("type", {"content": "next"})]
    assert acts[0].t_start < acts[0].t_end < acts[1].t_start


def test_shifted_characters_type_and_typing_gap_splits():
    e = Ev()
    e.add("key_down", key="shift").add("key_down", key="H").add("key_up", key="shift").add("key_up", key="h")
    e.type("i").at(5).type("there")
    assert names(reduce_actions(e.events)) == [("type", {"content": "Hi"}), ("type", {"content": "there"})]
    assert names(reduce_actions(e.events, Thresholds(type_gap_s=10))) == [("type", {"content": "Hithere"})]


def test_backspace_outside_a_run_and_erased_run():
    e = Ev().key("backspace").at(1).click(5, 5).type("ab").key("backspace").key("backspace")
    assert names(reduce_actions(e.events)) == [("hotkey", {"key": "backspace"}), ("click", {"start_box": (5, 5)})]


def test_hotkeys_and_named_keys():
    e = Ev().type("ab").chord("ctrl_l", "c").chord("ctrl", "shift", "T").key("tab").chord("shift", "tab")
    e.key("page_down").chord("alt", "f4").chord("ctrl", "\x16").key("esc").key("media_volume_up")
    acts = reduce_actions(e.events)
    assert names(acts) == [
        ("type", {"content": "ab"}),
        ("hotkey", {"key": "ctrl c"}),
        ("hotkey", {"key": "ctrl shift t"}),
        ("hotkey", {"key": "tab"}),
        ("hotkey", {"key": "shift tab"}),
        ("hotkey", {"key": "pagedown"}),
        ("hotkey", {"key": "alt f4"}),
        ("hotkey", {"key": "ctrl v"}),
        ("hotkey", {"key": "esc"}),
    ]
    from agent.schema import Action

    assert all(validate(Action(a.name, a.args), normalized=False) is None for a in acts)


def test_xdotool_release_order_and_lone_modifiers():
    # xdotool releases the modifier before the key; a lone shift/ctrl is nothing, a lone super is 'win'
    e = Ev().add("key_down", key="ctrl").add("key_down", key="c").add("key_up", key="ctrl").add("key_up", key="c")
    e.key("shift").key("ctrl_r").key("cmd")
    assert names(reduce_actions(e.events)) == [("hotkey", {"key": "ctrl c"}), ("hotkey", {"key": "win"})]


def test_scroll_runs_merge_by_direction_time_and_place():
    e = Ev().scroll(500, 500, dy=-1).scroll(501, 500, dy=-1).scroll(502, 501, dy=-1)
    e.scroll(502, 501, dy=1).at(2).scroll(502, 501, dy=1).scroll(900, 100, dy=1).scroll(900, 100, dx=-1)
    acts = reduce_actions(e.events)
    assert names(acts) == [
        ("scroll", {"start_box": (500, 500), "direction": "down"}),
        ("scroll", {"start_box": (502, 501), "direction": "up"}),
        ("scroll", {"start_box": (502, 501), "direction": "up"}),
        ("scroll", {"start_box": (900, 100), "direction": "up"}),
        ("scroll", {"start_box": (900, 100), "direction": "left"}),
    ]
    assert acts[0].info["clicks"] == 3


def test_secret_keys_collapse_to_a_placeholder():
    e = Ev().type("user")
    for _ in "hunter2":
        e.key(MASK_CHAR, secret=True)
    e.key("enter")
    acts = reduce_actions(e.events)
    assert names(acts) == [("type", {"content": f"user{SECRET_PLACEHOLDER}\n"})]
    assert acts[0].info == {"secret": True}


def test_pause_breaks_runs_and_unmatched_release_is_ignored():
    e = Ev().type("ab").add("pause").add("resume").type("cd").add("mouse_up", x=1, y=1, button="left")
    assert names(reduce_actions(e.events)) == [("type", {"content": "ab"}), ("type", {"content": "cd"})]


def frame(t, blob, w=200, h=100, why="pre"):
    return {"t": t, "kind": "frame", "t_end": t + 0.002, "blob": blob, "width": w, "height": h, "why": why}


def test_build_steps_frames_waits_notes_and_words():
    geo = ScreenGeometry.simple(200, 100)
    e = Ev(t=10.0)
    e.events += [frame(9.0, "a" * 64), frame(10.0, "b" * 64)]  # 10.0 ends at 10.002: after the click began
    e.click(50, 25)  # t 10.0 .. 10.06
    e.events += [frame(10.5, "c" * 64), frame(12.0, "c" * 64), frame(14.0, "d" * 64)]
    e.at(10).type("ok")  # t ~20.07: a 10 s gap in which the screen changed -> wait
    e.events += [frame(25.0, "e" * 64, why="stop")]
    e.events.append({"t": 9.5, "kind": "note", "text": "open the thing"})
    e.events.append({"t": 30.0, "kind": "note", "text": "done"})
    words = [{"text": "clicking", "t0": 9.8, "t1": 9.9}, {"text": "loading", "t0": 12.0, "t1": 12.2},
             {"text": "typing", "t0": 19.0, "t1": 19.2}]
    steps = build_steps(e.events, geo, words=words)
    assert [s.action.name for s in steps] == ["click", "wait", "type"]
    click, wait, typ = steps
    assert click.observation.screenshot == "a" * 64 and click.info["frame_age_s"] == pytest.approx(1.0, abs=0.01)
    assert click.observation.post_screenshot == "c" * 64  # the last frame before the next action
    assert click.action.args["start_box"] == pytest.approx((50.5 / 200, 25.5 / 100))
    assert click.info["screen_points"] == [[50, 25]]
    assert click.thought == "open the thing clicking"
    assert wait.observation.screenshot == "b" * 64 and wait.observation.post_screenshot == "d" * 64
    assert typ.observation.screenshot == "d" * 64 and typ.observation.post_screenshot == "e" * 64
    assert typ.thought == "done typing" and wait.thought == "loading"
    assert [s.index for s in steps] == [0, 1, 2]


def test_no_wait_when_the_screen_did_not_change():
    e = Ev(t=10.0)
    e.events += [frame(9.0, "a" * 64)]
    e.click(50, 25).at(10)
    e.events += [frame(15.0, "a" * 64)]
    e.click(60, 25)
    steps = build_steps(e.events, ScreenGeometry.simple(200, 100))
    assert [s.action.name for s in steps] == ["click", "click"]


def test_attach_texts_windows():
    assert attach_texts([(1, 2), (5, 6)], [(0.5, "a"), (2, "b"), (3, "c"), (9, "d")]) == [["a", "b"], ["c", "d"]]
    assert attach_texts([], [(1, "x")]) == []


def test_thresholds_round_trip_and_bad_names():
    th = Thresholds(type_gap_s=1.5)
    assert Thresholds.from_dict(th.to_dict()) == th
    with pytest.raises(ValueError, match="typo"):
        Thresholds.from_dict({"typo": 1})
    assert isinstance(REDUCER_VERSION, int)
