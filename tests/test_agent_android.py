"""The Android executor against a fake phone that speaks uiautomator2's JSON-RPC over HTTP."""
from __future__ import annotations

import pytest

from agent.executors.android import AndroidExecutor, focused_password
from agent.executors.base import ExecutionError
from agent.schema import Action
from tests.fake_android import HEIGHT, WIDGETS, WIDTH, FakePhoneServer, connect_fake


def centre(name):
    (l, t, r, b), _, _ = WIDGETS[name]
    return ((l + r) / 2 / WIDTH, (t + b) / 2 / HEIGHT)


@pytest.fixture
def phone():
    with FakePhoneServer() as server:
        ex = AndroidExecutor(connect_fake(server), settle=0, wait_seconds=0.01)
        yield ex, server.phone
        ex.close()


def test_observe_gives_screenshot_geometry_and_hierarchy(phone):
    ex, ph = phone
    frame, info = ex.reset()
    assert frame.size == (WIDTH, HEIGHT) and frame.geometry.logical_width == WIDTH and frame.geometry.scale_factor == 1
    assert 'resource-id="fake:id/button"' in frame.extra["hierarchy"] and frame.extra["password_focused"] is False
    assert [c[0] for c in ph.calls[:2]] == ["takeScreenshot", "dumpWindowHierarchy"]


def test_click_type_and_submit(phone):
    ex, ph = phone
    ex.reset()
    _, _, term, _, info = ex.step(Action("click", {"start_box": centre("field")}))
    assert ph.focused == "field" and not term
    assert info["screen_point"] == [270, 240]
    ex.step(Action("type", {"content": "héllo 世界\n"}))
    assert ph.text["field"] == "héllo 世界" and ph.keys[-1] == "enter"
    ex.step(Action("click", {"start_box": centre("button")}))
    assert ph.button_presses == 1


def test_password_focus_is_reported(phone):
    ex, ph = phone
    ex.reset()
    frame, *_ = ex.step(Action("click", {"start_box": centre("password")}))
    assert frame.extra["password_focused"] is True
    assert focused_password(frame.extra["hierarchy"])


def test_long_press_swipe_scroll_keys_and_apps(phone):
    ex, ph = phone
    ex.reset()
    ex.step(Action("long_press", {"start_box": (0.5, 0.5)}))
    assert ph.long_presses == [(270, 600)]
    ex.step(Action("drag", {"start_box": (0.5, 0.8), "end_box": (0.5, 0.2)}))
    assert ph.swipes[-1] == (270, 960, 270, 240)
    ex.step(Action("scroll", {"start_box": (0.5, 0.5), "direction": "down"}))
    fx, fy, tx, ty = ph.swipes[-1]
    assert (fx, fy) == (270, 600) and ty < fy  # the finger moves up to show what is below
    ex.step(Action("open_app", {"app_name": "Settings"}))
    assert ph.app == "com.android.settings"
    ex.step(Action("press_back", {}))
    ex.step(Action("press_home", {}))
    assert ph.keys[-2:] == ["back", "home"] and ph.app == "com.android.launcher"
    ex.step(Action("open_app", {"app_name": "org.example.notes"}))
    assert ph.app == "org.example.notes"


def test_errors_name_the_problem(phone):
    ex, ph = phone
    ex.reset()
    with pytest.raises(ExecutionError, match="unknown app 'Frobnicator'"):
        ex.step(Action("open_app", {"app_name": "Frobnicator"}))
    with pytest.raises(ExecutionError, match="hotkey"):
        ex.step(Action("hotkey", {"key": "ctrl c"}))


def test_finished_terminates_without_input(phone):
    ex, ph = phone
    ex.reset()
    n = len(ph.calls)
    _, _, terminated, truncated, _ = ex.step(Action("finished", {"content": "done"}))
    assert terminated and not truncated
    assert {c[0] for c in ph.calls[n:]} <= {"takeScreenshot", "dumpWindowHierarchy"}
