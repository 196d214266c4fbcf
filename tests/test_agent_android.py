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


def test_frames_carry_the_screens_element_list(phone):
    """The hierarchy's nodes as elements in screenshot pixels: widgets by their class, a settings
    row named by the texts inside it, states from the attributes, no password value, nothing the
    user cannot see; the list follows what the executor did."""
    ex, ph = phone
    frame, _ = ex.reset()
    assert frame.elements_source == "uiautomator2"
    got = [(e.role, e.name, e.box, e.states, e.value) for e in frame.elements]
    assert got == [
        ("text_field", "field", WIDGETS["field"][0], (), None),
        ("text_field", "password", WIDGETS["password"][0], ("password",), None),
        ("button", "OK", WIDGETS["button"][0], (), None),
        ("checkbox", "Wi-Fi", WIDGETS["wifi"][0], (), None),
        ("list_item", "Display \u00b7 Brightness, dark theme", (0, 740, 540, 860), (), None),
        ("list_item", "Sound", (0, 860, 540, 980), (), None),
        ("checkbox", "Airplane mode", (40, 1020, 500, 1080), ("disabled",), None),
    ]
    ex.step(Action("click", {"start_box": centre("field")}))
    ex.step(Action("type", {"content": "hello"}))
    ex.step(Action("click", {"start_box": centre("password")}))
    frame, *_ = ex.step(Action("type", {"content": "hunter2"}))
    assert ph.text["password"] == "hunter2"  # the fake's hierarchy even carries it as text
    field, pw = frame.elements[0], frame.elements[1]
    assert (field.value, field.states) == ("hello", ())
    assert (pw.value, pw.states) == (None, ("focused", "password"))
    # a click at the check box's centre (as the pointer writes it) toggles it
    wifi = next(e for e in frame.elements if e.name == "Wi-Fi")
    frame, *_ = ex.step(Action("click", {"start_box": (wifi.center[0] / WIDTH, wifi.center[1] / HEIGHT)}))
    assert ph.checked["wifi"] and "checked" in next(e for e in frame.elements if e.name == "Wi-Fi").states


def test_hierarchy_elements_scale_clip_and_refuse_bad_xml():
    from agent.executors.android import hierarchy_elements
    from tests.fake_android import PhoneState

    xml = PhoneState().hierarchy()
    half = hierarchy_elements(xml, WIDTH // 2, HEIGHT // 2, scale=0.5)  # a screenshot at half the device's size
    assert half[2].name == "OK" and half[2].box == (85, 250, 185, 300)
    cut = hierarchy_elements(xml, 300, 630)  # a screenshot smaller than the screen: boxes cut, outside ones gone
    assert [e.name for e in cut] == ["field", "password", "OK"] and cut[0].box == (40, 200, 300, 280)
    with pytest.raises(ValueError, match="the UI hierarchy is not XML"):
        hierarchy_elements("<hierarchy><node", 10, 10)


def test_an_android_run_stores_each_steps_list(phone, store):
    from agent.policies import ReplayPolicy
    from agent.run.loop import AgentLoop

    ex, ph = phone
    x, y = centre("wifi")
    sw, sh = 532, 1204  # smart_resize of 540x1200, the model's space
    policy = ReplayPolicy([f"Action: click(start_box='<|box_start|>({round(x * sw)},{round(y * sh)})<|box_end|>')",
                           "Action: finished(content='done')"], platform="android")
    res = AgentLoop(policy, ex, store=store).run("Turn Wi-Fi on")
    ep = store.load_episode(res.episode.id)
    first, second = (s.observation for s in ep.steps)
    assert first.elements_source == second.elements_source == "uiautomator2"
    wifi = [[e for e in o.elements if e.name == "Wi-Fi"][0] for o in (first, second)]
    assert "checked" not in wifi[0].states and "checked" in wifi[1].states  # each step's list is from before it
